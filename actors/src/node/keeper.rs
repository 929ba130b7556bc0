//! Keeping a distributed run's processes up: the controller's supervisor for
//! the processes it started, as [`crate::controller::supervisor`] is for the
//! actors in its own process.
//!
//! A process is **lost** when it exits (its handle is polled), when it falls
//! silent past the control plane's heartbeat deadline, or when a message to it
//! cannot be sent. Then, at once:
//!
//! - every call waiting on it fails, so the run driver re-dispatches its
//!   in-flight groups (the ledger records each re-dispatch);
//! - a rollout process leaves the driver's choice (its slot empties), and the
//!   weight-sync group is formed again without it at the next version;
//! - what is left of the process is stopped.
//!
//! A rollout or reward process is then **started again** on its host, with
//! the same command and environment, after an exponential back-off, until its
//! restart budget is spent. It says Hello, is given the same setup, and a
//! rollout process gets a new proxy, is marked as having missed the current
//! version (the driver loads it, digest-checked, before its first request),
//! and joins the next epoch of the weight-sync group. A learner rank is not
//! restarted here: the learner's calls fail and the run stops with the reason,
//! leaving its last checkpoint for `--resume`. Restarts are counted in
//! `rlmesh_actor_restarts_total{actor=PROCESS}` and
//! `rlmesh_restart_budget_left{actor=PROCESS}`, and shown by `launcher status`.
use super::link::{ready, Core, Reply, Say, HELLO_ID, SETUP_ID};
use super::proxies::proxy;
use super::publisher::Publisher;
use super::wire::ControlMsg;
use crate::controller::topology::Role;
use crate::metrics::Metrics;
use rlmesh_mesh::launch::{Exit, Launcher, Process};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// How often the started processes' handles are polled for an exit.
const POLL: Duration = Duration::from_millis(250);
/// How long a lost process's remains have to stop before it starts again.
const STOP_WAIT: Duration = Duration::from_secs(20);

/// Runs blocking `f` (ssh or srun to a host that may be gone) on a thread of
/// its own, not the runtime's blocking pool, so the run's exit never waits for
/// it; `None` if it has not returned within `limit`.
async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static, limit: Duration) -> Option<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("keeper-io".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    tokio::time::timeout(limit, rx).await.ok()?.ok()
}

/// Restart budget and back-off of the processes.
#[derive(Clone, Debug)]
pub struct KeepPolicy {
    /// Restarts allowed per process.
    pub budget: u32,
    /// First back-off (doubles per restart of the same process).
    pub backoff: Duration,
    /// How long a restarted process has to join.
    pub join_timeout: Duration,
}

impl KeepPolicy {
    /// The defaults: 3 restarts per process, 1 s back-off doubling.
    pub fn new(join_timeout: Duration) -> KeepPolicy {
        KeepPolicy { budget: 3, backoff: Duration::from_secs(1), join_timeout }
    }
}

/// The keeper: one task, plus one task per restart in progress.
pub(super) struct Keeper {
    core: Arc<Core>,
    /// The weight-sync group's sender (formed again when a rollout process is lost).
    publisher: Option<Publisher>,
    /// How each started process is started (none: started externally, never restarted here).
    launchers: HashMap<String, Launcher>,
    policy: KeepPolicy,
    metrics: Arc<Metrics>,
    say: Say,
}

impl Keeper {
    pub(super) fn new(core: Arc<Core>, publisher: Option<Publisher>, launchers: HashMap<String, Launcher>, policy: KeepPolicy, metrics: Arc<Metrics>, say: Say) -> Arc<Keeper> {
        for name in launchers.keys() {
            metrics.restart_budget_left.with_label_values(&[name]).set(f64::from(policy.budget));
        }
        Arc::new(Keeper { core, publisher, launchers, policy, metrics, say })
    }

    /// Watches until aborted (the fleet's shutdown aborts it, and the restarts
    /// in progress and the chaos with it).
    pub(super) async fn run(self: Arc<Keeper>, mut losses: mpsc::UnboundedReceiver<(String, String)>, chaos: Option<super::chaos::Chaos>, rl: tokio::sync::watch::Receiver<bool>) {
        let mut restarts: JoinSet<()> = JoinSet::new();
        if let Some(c) = chaos {
            restarts.spawn(c.run(self.core.clone(), self.say.clone(), rl));
        }
        let mut poll = tokio::time::interval(POLL);
        loop {
            let lost = tokio::select! {
                l = losses.recv() => match l {
                    Some((name, why)) => vec![(name, why, false, true)],
                    None => return,
                },
                _ = poll.tick() => self.exited(),
            };
            for (name, why, exited, restart) in lost {
                if let Some(i) = self.take_down(&name, &why, exited, restart) {
                    restarts.spawn(self.clone().restart(i, name));
                }
            }
            while restarts.try_join_next().is_some() {}
        }
    }

    /// Started processes that have exited and are not known to be down, and
    /// whether to start each again: not one that left as asked (exit 0: a node
    /// leaves so on SIGTERM), nor one ended by SIGTERM or SIGINT.
    fn exited(&self) -> Vec<(String, String, bool, bool)> {
        let down = self.core.down.lock().expect("down lock").clone();
        let mut members = self.core.members.lock().expect("members lock");
        let mut out = vec![];
        for m in members.iter_mut().filter(|m| !down.contains(&m.planned.name)) {
            if let Some(Ok(Some(exit))) = m.process.as_mut().map(Process::try_wait) {
                let asked = matches!(exit, Exit::Code(0) | Exit::Signal(libc::SIGTERM | libc::SIGINT));
                out.push((m.planned.name.clone(), format!("exited: {exit:?}"), true, !asked));
            }
        }
        out
    }

    /// Marks `name` down and fails what waits on it; the member's index when it is to be started again.
    fn take_down(&self, name: &str, why: &str, exited: bool, restart: bool) -> Option<usize> {
        let core = &self.core;
        if !core.down.lock().expect("down lock").insert(name.to_string()) {
            return None;
        }
        let i = core.index(name)?;
        (self.say)(format!("{name} is lost ({why}); its calls fail and its groups are sent out again"));
        self.metrics.peers_lost_total.with_label_values(&[name]).inc();
        core.lose(name, why, exited);
        // A process started again under this name joins as new.
        core.tx.forget(name);
        if let Some(slot) = core.routes.get().and_then(|r| r.iter().position(|r| r.process == name)) {
            if let Some(p) = core.rollouts.lock().expect("slots lock")[slot].take() {
                p.stop(Some("its process is lost".into()));
            }
            // The weight-sync group without it, now: a broadcast blocked on it
            // (a lost host keeps its sockets open) is aborted on every member.
            if let Some(p) = self.publisher.clone() {
                tokio::spawn(async move {
                    if let Err(e) = p.members().await {
                        eprintln!("[keeper] forming the weight-sync group again: {e}");
                    }
                });
            }
        }
        let roles: Vec<Role> = core.members.lock().expect("members lock")[i].planned.actors.iter().map(|a| a.role).collect();
        if roles.contains(&Role::Learner) {
            let next = if exited { "starts again from its newest checkpoint" } else { "can be resumed from its newest checkpoint once the host answers" };
            (self.say)(format!("{name} holds a learner rank: learner ranks are not restarted one by one, so the run stops and {next}"));
            return None;
        }
        if !restart {
            (self.say)(format!("{name} left as asked (SIGTERM or SIGINT): it is not started again"));
            return None;
        }
        if !self.launchers.contains_key(name) {
            (self.say)(format!("{name} was started externally: its starter restarts it (it joins again by itself)"));
            return None;
        }
        Some(i)
    }

    /// Starts member `i` again, with back-off, until it is back or its budget is spent.
    async fn restart(self: Arc<Keeper>, i: usize, name: String) {
        loop {
            let (n, old) = {
                let mut members = self.core.members.lock().expect("members lock");
                let m = &mut members[i];
                (m.restarts, m.process.take())
            };
            if let Some(mut p) = old {
                // Its ports must be free before it starts again; a host that is
                // gone cannot answer, so the wait is bounded.
                if off_runtime(move || p.stop(Duration::from_secs(3)), STOP_WAIT).await.is_none() {
                    (self.say)(format!("{name}: its remains did not stop within {STOP_WAIT:?} (host unreachable?)"));
                }
            }
            if n >= self.policy.budget {
                (self.say)(format!("{name}: restart budget ({}) spent; it stays down and the run goes on without it", self.policy.budget));
                return;
            }
            let backoff = self.policy.backoff * 2u32.saturating_pow(n);
            (self.say)(format!("restarting {name} (restart {} of {}) after {backoff:?}", n + 1, self.policy.budget));
            tokio::time::sleep(backoff).await;
            self.core.members.lock().expect("members lock")[i].restarts = n + 1;
            self.metrics.actor_restarts_total.with_label_values(&[&name]).inc();
            self.metrics.restart_budget_left.with_label_values(&[&name]).set(f64::from(self.policy.budget - (n + 1)));
            let t0 = Instant::now();
            match self.start_again(i, &name).await {
                Ok(pid) => {
                    self.core.down.lock().expect("down lock").remove(&name);
                    (self.say)(format!("{name} is back (pid {pid}, {:.1} s after its restart began)", t0.elapsed().as_secs_f64()));
                    return;
                }
                Err(e) => (self.say)(format!("{name}: restart {} failed: {e}", n + 1)),
            }
        }
    }

    /// Starts the process, waits for its Hello and its setup; returns its pid.
    async fn start_again(&self, i: usize, name: &str) -> Result<u32, String> {
        let core = &self.core;
        let (spec, mut setup, log) = {
            let members = core.members.lock().expect("members lock");
            let m = &members[i];
            (m.spec.clone().ok_or("no start command")?, m.setup.clone().ok_or("never set up")?, m.log.clone())
        };
        // It joins the weight-sync group at the next epoch, not at the first.
        setup.weights = None;
        let hello = core.expect(&[], (HELLO_ID, i as u32));
        let launcher = self.launchers.get(name).ok_or("no launcher")?.clone();
        let process = off_runtime(move || launcher.spawn(&spec), self.policy.join_timeout).await.ok_or("its start did not return (host unreachable?)")?.map_err(|e| e.to_string())?;
        let pid = process.pid();
        core.members.lock().expect("members lock")[i].process = Some(process);
        // Its Hello, unless it exits first or is silent past the join timeout.
        let t0 = Instant::now();
        let mut hello = std::pin::pin!(hello);
        let said = loop {
            tokio::select! {
                r = &mut hello => break r.map_err(|_| "the router stopped".to_string())?,
                _ = tokio::time::sleep(POLL) => {
                    let exited = core.members.lock().expect("members lock")[i].process.as_mut().and_then(|p| p.try_wait().ok().flatten());
                    if let Some(exit) = exited {
                        return Err(format!("it exited before joining ({exit:?}); see {}", log.display()));
                    }
                    if t0.elapsed() > self.policy.join_timeout {
                        return Err(format!("it did not join within {:?}; see {}", self.policy.join_timeout, log.display()));
                    }
                }
            }
        };
        match said {
            Reply::Control(ControlMsg::Hello(h)) => core.members.lock().expect("members lock")[i].hello = h,
            other => return Err(format!("expected its Hello, got {other:?}")),
        }
        // Whatever was counted for its earlier life (a send to its dead session) starts again here.
        core.tx.reset(name);
        core.revive(name);
        let rx = core.expect(&[name], (SETUP_ID, i as u32));
        core.tx.send(name, &ControlMsg::Setup(super::wire::Json::of(&setup))).map_err(|e| e.to_string())?;
        ready(rx, name, &log).await?;
        if let Some(slot) = core.routes.get().and_then(|r| r.iter().position(|r| r.process == name)) {
            let route = core.routes.get().expect("routes")[slot].clone();
            core.mark_missed(name);
            let p = proxy(core, route).await?;
            core.rollouts.lock().expect("slots lock")[slot] = Some(p);
        }
        Ok(pid)
    }
}
