//! `launcher up … --chaos ROLE:COUNT[:EVERY_S]`: kill a process of a role with
//! SIGKILL at random times of the RL phase, `COUNT` times in all, so a user or
//! CI can check that a recipe survives its faults. The first kill comes one gap
//! after RL starts; the gaps between kills are drawn from
//! `EVERY_S / 2 ..= 3 · EVERY_S / 2` seconds (default 20 s) by a generator
//! seeded from the run's seed, and each kill is logged with the process, its
//! pid and the time. The keeper then does what it does for any lost process.
use super::link::{Core, Say};
use crate::controller::topology::Role;
use rlmesh_mesh::launch::Signal;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to kill, how often.
#[derive(Clone, Debug, PartialEq)]
pub struct Chaos {
    /// The role whose processes are killed (`rollout`, `reward` or `learner`).
    pub role: Role,
    /// Kills in all.
    pub count: u32,
    /// Mean seconds between kills.
    pub every: Duration,
    /// Seeds the times and the choice of process.
    pub seed: u64,
}

impl Chaos {
    /// Parses `ROLE:COUNT[:EVERY_S]`.
    pub fn parse(spec: &str, seed: u64) -> Result<Chaos, String> {
        let parts: Vec<&str> = spec.split(':').collect();
        let bad = |why: &str| format!("--chaos {spec:?}: {why} (expected ROLE:COUNT[:EVERY_S], e.g. rollout:2:30)");
        if !(2..=3).contains(&parts.len()) {
            return Err(bad("two or three fields"));
        }
        let role = match parts[0] {
            "rollout" => Role::Rollout,
            "reward" => Role::Reward,
            "learner" => Role::Learner,
            _ => return Err(bad("ROLE is rollout, reward or learner")),
        };
        let count: u32 = parts[1].parse().ok().filter(|n| (1..=100).contains(n)).ok_or_else(|| bad("COUNT is 1..=100"))?;
        let every = match parts.get(2) {
            None => 20.0,
            Some(s) => s.parse::<f64>().ok().filter(|s| (0.1..=86_400.0).contains(s)).ok_or_else(|| bad("EVERY_S is 0.1..=86400 seconds"))?,
        };
        Ok(Chaos { role, count, every: Duration::from_secs_f64(every), seed })
    }

    /// Kills as asked; ends after the last kill (aborted with the fleet).
    pub(super) async fn run(self, core: Arc<Core>, say: Say, mut rl: tokio::sync::watch::Receiver<bool>) {
        if rl.wait_for(|started| *started).await.is_err() {
            return;
        }
        let mut state = self.seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        let t0 = Instant::now();
        let mut done = 0;
        while done < self.count {
            let frac = (next() >> 11) as f64 / (1u64 << 53) as f64;
            tokio::time::sleep(self.every.mul_f64(0.5 + frac)).await;
            // A live process of the role, not one lost and not back yet.
            let down = core.down.lock().expect("down lock").clone();
            let pick = {
                let mut members = core.members.lock().expect("members lock");
                let live: Vec<usize> = (0..members.len())
                    .filter(|&i| members[i].planned.actors.iter().any(|a| a.role == self.role) && !down.contains(&members[i].planned.name) && members[i].process.is_some())
                    .collect();
                if live.is_empty() {
                    None
                } else {
                    let i = live[(next() % live.len() as u64) as usize];
                    let m = &mut members[i];
                    let pid = m.process.as_ref().map_or(0, |p| p.pid());
                    let killed = m.process.as_mut().map(|p| p.signal(Signal::Kill));
                    Some((m.planned.name.clone(), pid, killed))
                }
            };
            match pick {
                None => say(format!("chaos: no live {} process to kill now; trying again later", self.role)),
                Some((name, pid, Some(Ok(())))) => {
                    done += 1;
                    say(format!("chaos: killed {name} (pid {pid}) with SIGKILL at {:.1} s ({done} of {})", t0.elapsed().as_secs_f64(), self.count));
                }
                Some((name, pid, other)) => say(format!("chaos: could not kill {name} (pid {pid}): {other:?}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        assert_eq!(Chaos::parse("rollout:2", 7).unwrap(), Chaos { role: Role::Rollout, count: 2, every: Duration::from_secs(20), seed: 7 });
        assert_eq!(Chaos::parse("learner:1:0.5", 7).unwrap().every, Duration::from_millis(500));
        for (spec, why) in [("rollout", "two or three"), ("controller:1", "ROLE"), ("rollout:0", "COUNT"), ("rollout:x", "COUNT"), ("reward:1:0", "EVERY_S"), ("reward:1:2:3", "two or three")] {
            let e = Chaos::parse(spec, 0).unwrap_err();
            assert!(e.contains(why), "{spec}: {e}");
        }
    }
}
