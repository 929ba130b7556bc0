//! How rollout work is cut into requests and how much of it is out: plain
//! arithmetic on the recipe and the number of rollout actors.
//!
//! - A request carries at most an actor's capacity ([`ACTOR_ROWS`] rows, so
//!   `ACTOR_ROWS / G` groups), and a step's groups are cut into as many
//!   requests as there are actors (a group is the unit: `groups_per_step <
//!   actors` leaves `actors − groups_per_step` of them without that step's work).
//! - The groups out or scored and waiting stay within the staleness window,
//!   `(1 + max_staleness) × groups_per_step` (a group dispatched at version v
//!   must be trained by v + k), and within what the actors can hold at once:
//!   every actor one request at its capacity, but never less than one step.
//!
//! Until the RL loop dispatched this way, a request carried a whole step's
//! groups and `1 + max_staleness` requests were out: on `deploy/h100x32.toml`
//! (16 rollout actors) 13 to 15 actors sat idle in every mode.
//!
//! The cut depends only on the recipe and the *configured* number of actors,
//! never on which actor is free, so a seeded run sends out the same requests
//! with the same seeds on any placement.
use serde::Serialize;

/// Rows (trajectories) one rollout actor generates in one request at most.
///
/// On CPU, generation throughput stops growing past batch 32–64 (README,
/// "Benchmarks"); a GPU actor holds more, but a request this size already
/// keeps its decode steps matrix-bound for a 135M–1B model.
pub const ACTOR_ROWS: usize = 64;

/// How the RL loop sends groups out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Dispatch {
    /// Rollout actors the work is spread over.
    pub actors: usize,
    /// Groups of one request at most.
    pub chunk: usize,
    /// Groups out or scored and waiting at most (with room for at least one step).
    pub window: usize,
}

impl Dispatch {
    /// The dispatch of `groups_per_step` groups of `group_size` rollouts over
    /// `actors` actors, `max_staleness` versions ahead of the learner.
    pub fn new(groups_per_step: usize, group_size: usize, max_staleness: u64, actors: usize) -> Dispatch {
        let (gps, actors) = (groups_per_step.max(1), actors.max(1));
        let capacity = (ACTOR_ROWS / group_size.max(1)).max(1);
        let requests = actors.min(gps).max(gps.div_ceil(capacity));
        let chunk = gps.div_ceil(requests);
        let staleness = (1 + max_staleness as usize).saturating_mul(gps);
        let window = staleness.min(actors.saturating_mul(capacity)).max(gps);
        Dispatch { actors, chunk, window }
    }

    /// Groups to keep out or waiting with `steps_left` steps still to train.
    pub fn wanted(&self, groups_per_step: usize, steps_left: u64) -> usize {
        self.window.min(usize::try_from(steps_left).unwrap_or(usize::MAX).saturating_mul(groups_per_step.max(1)))
    }

    /// The groups each actor is sent when the loop fills the window at the
    /// start of a run, least-busy first as the driver picks (ties in turn).
    pub fn first_fill(&self, groups_per_step: usize, steps_left: u64) -> Vec<usize> {
        let mut groups = vec![0; self.actors];
        let mut requests = vec![0usize; self.actors];
        let (mut out, mut next) = (0, 0);
        let wanted = self.wanted(groups_per_step, steps_left);
        while out < wanted {
            let n = (wanted - out).min(self.chunk);
            let i = super::driver::least_busy(&requests, next).expect("at least one actor");
            requests[i] += 1;
            groups[i] += n;
            next = i + 1;
            out += n;
        }
        groups
    }
}

/// Tasks of one evaluation request: the held-out tasks spread over every
/// actor, at most 32 per request (the batch the evaluation always used).
pub fn eval_chunk(tasks: usize, actors: usize) -> usize {
    tasks.div_ceil(actors.max(1)).clamp(1, 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h100x32_keeps_all_sixteen_rollout_actors_busy_in_the_default_mode() {
        // The recipe defaults: 8 groups of 8 per step, one_step_off.
        let d = Dispatch::new(8, 8, 1, 16);
        assert_eq!(d.chunk, 1, "a step's 8 groups go to 8 actors");
        assert_eq!(d.window, 16);
        assert!(d.first_fill(8, 40).iter().all(|&g| g == 1), "{:?}", d.first_fill(8, 40));
        // async k = 2: three steps' groups out, every actor busy, none over 2 requests.
        let a = Dispatch::new(8, 8, 2, 16);
        assert_eq!(a.window, 24, "{a:?}");
        let fill = a.first_fill(8, 40);
        assert!(fill.iter().all(|&g| (1..=2).contains(&g)), "{fill:?}");
        let wide = Dispatch::new(32, 8, 2, 16);
        assert!(wide.first_fill(32, 40).iter().all(|&g| g >= 2));
    }

    #[test]
    fn the_old_dispatch_left_all_but_one_plus_k_actors_idle() {
        // One request per step of all its groups (chunk = groups_per_step) is what the loop did.
        let old = Dispatch { actors: 16, chunk: 8, window: 16 };
        assert_eq!(old.first_fill(8, 40).iter().filter(|&&g| g > 0).count(), 2);
    }

    #[test]
    fn sync_splits_a_step_across_all_actors() {
        let d = Dispatch::new(12, 4, 0, 4);
        assert_eq!((d.chunk, d.window), (3, 12));
        assert_eq!(d.first_fill(12, 3), [3, 3, 3, 3]);
        // Fewer groups than actors: one group each, the rest idle (a group is the unit).
        assert_eq!(Dispatch::new(3, 4, 0, 4).first_fill(3, 3), [1, 1, 1, 0]);
        // One actor: one request per step, as before.
        assert_eq!(Dispatch::new(3, 4, 0, 1).chunk, 3);
    }

    #[test]
    fn a_request_never_exceeds_an_actors_capacity() {
        for (gps, g, k, actors) in [(64, 8, 1, 1), (200, 16, 0, 3), (5, 64, 2, 2), (7, 128, 1, 1), (100, 2, 4, 7)] {
            let d = Dispatch::new(gps, g, k, actors);
            assert!(d.chunk * g <= ACTOR_ROWS.max(g), "{gps} {g} {k} {actors}: {d:?}");
            assert!(d.window >= gps, "room for a whole step: {d:?}");
            assert!(d.window <= (1 + k as usize) * gps, "within the staleness window: {d:?}");
            let sent: usize = d.first_fill(gps, 10).iter().sum();
            assert_eq!(sent, d.window);
        }
    }

    #[test]
    fn the_last_steps_send_only_what_they_train() {
        let d = Dispatch::new(4, 2, 2, 8);
        assert_eq!(d.wanted(4, 1), 4);
        assert_eq!(d.wanted(4, 0), 0);
        assert_eq!(d.wanted(4, 100), 12);
    }

    #[test]
    fn evaluation_is_spread_over_every_actor() {
        assert_eq!(eval_chunk(100, 1), 32);
        assert_eq!(eval_chunk(100, 16), 7);
        assert_eq!(eval_chunk(4, 4), 1);
        assert_eq!(eval_chunk(0, 4), 1);
    }
}
