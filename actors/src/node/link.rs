//! What the controller's side of a distributed run shares between its parts:
//! the `Core` that the router, the proxies, the keeper and the publisher
//! hold (calls waiting for their replies, the started processes, how each
//! rollout process is reached, which are lost), and the record of a lost
//! learner rank.
use super::wire::*;
use super::Outboxes;
use crate::controller::plan::Process as Planned;
use crate::controller::supervisor::RolloutSlots;
use crate::controller::topology::Role;
use crate::rollout::actor::RolloutMsg;
use crate::weight_sync::image::WeightUpdate;
use ractor::ActorRef;
use rlmesh_mesh::control::ControlSender;
use rlmesh_mesh::launch::{Process, ProcessSpec};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Key of a call waiting for its reply: (call id, learner rank or 0).
pub(super) type Key = (u64, u32);
pub(super) const SETUP_ID: u64 = u64::MAX;
/// A restarted process's [`Hello`] (keyed by its member index).
pub(super) const HELLO_ID: u64 = u64::MAX - 1;

/// A call waiting for its reply: the processes whose loss fails it, and where the reply goes.
pub(super) type Waiting = (Vec<String>, oneshot::Sender<Reply>);

#[derive(Debug)]
pub(super) enum Reply {
    Control(ControlMsg),
    Data(DataMsg),
    /// A version whose [`DataMsg::Snapshot`] parts have all arrived.
    Weights(WeightUpdate),
    Lost(String),
}

/// What the router, the proxies, the keeper and the publisher share.
pub(super) struct Core {
    pub(super) tx: ControlSender<ControlMsg>,
    pub(super) out: Outboxes,
    pub(super) my_data: String,
    pub(super) next: AtomicU64,
    pub(super) names: Vec<String>,
    /// The run's cookie (hex), for the weight-sync group.
    pub(super) cookie: String,
    /// The address the controller's listeners bind (`None`: every interface).
    pub(super) listen: Option<std::net::IpAddr>,
    /// The longest wait for a call's answer before its process counts as stalled.
    pub(super) call_timeout: Duration,
    /// Every started process, in plan order (the keeper starts one again in place).
    pub(super) members: Mutex<Vec<Member>>,
    /// The policy version each rollout process holds (checked by its digest).
    pub(super) versions: Mutex<HashMap<String, u64>>,
    /// Per rollout process, whether its newest group publication has settled
    /// (loaded, refused or lost): a request waits for it before it goes out,
    /// so it is generated with the version published before it was dispatched.
    pub(super) settling: Mutex<HashMap<String, tokio::sync::watch::Receiver<bool>>>,
    /// Calls waiting for their replies, with the processes whose loss fails them.
    pub(super) pending: Mutex<HashMap<Key, Waiting>>,
    /// The rollout proxies, one slot per rollout process (`None` while it is down).
    pub(super) rollouts: RolloutSlots,
    /// How each rollout process is reached, by slot (set once hosted).
    pub(super) routes: std::sync::OnceLock<Vec<Route>>,
    /// Processes lost and not (yet) back (the keeper's record of the restarts it owes).
    pub(super) down: Mutex<HashSet<String>>,
    /// Processes lost and not set up again: a call on one fails at once.
    pub(super) gone: Mutex<HashSet<String>>,
    /// Rollout processes that missed a version of the group (restarted, or a
    /// broadcast failed): the driver loads the current one into each before its next request.
    pub(super) missed: Mutex<HashSet<String>>,
    /// Losses for the keeper: (process, why).
    pub(super) lost: mpsc::UnboundedSender<(String, String)>,
    /// Set when a learner rank's process is lost.
    pub(super) learner_loss: LearnerLoss,
}

/// How the controller reaches one rollout process.
#[derive(Clone, Debug)]
pub(super) struct Route {
    pub(super) process: String,
    /// Its data endpoint.
    pub(super) data: String,
    /// Where its groups go to be scored: a reward process (by name and endpoint), or none (the controller).
    pub(super) reward: Option<(String, String)>,
    /// Its key for weight acknowledgements (member index + 1).
    pub(super) key: u32,
}

impl Core {
    pub(super) fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The reply to call `key`, failed if any of `processes` is lost before
    /// it comes (at once if one is lost already).
    pub(super) fn expect(&self, processes: &[&str], key: Key) -> oneshot::Receiver<Reply> {
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(key, (processes.iter().map(|p| p.to_string()).collect(), tx));
        // After the insert: a loss noted since is seen here, one noted later fails the call itself.
        let gone = self.gone.lock().expect("gone lock").iter().find(|g| processes.contains(&g.as_str())).cloned();
        if let Some(p) = gone {
            if let Some((_, tx)) = self.pending.lock().expect("pending lock").remove(&key) {
                let _ = tx.send(Reply::Lost(p));
            }
        }
        rx
    }

    /// Waits for a call's answer from `process`. Past the call timeout the
    /// process counts as stalled (its heartbeats may still arrive): the call
    /// fails and the keeper takes the process down like a silent one.
    pub(super) async fn answer(&self, rx: oneshot::Receiver<Reply>, process: &str) -> Result<Reply, oneshot::error::RecvError> {
        match tokio::time::timeout(self.call_timeout, rx).await {
            Ok(r) => r,
            Err(_) => {
                let why = format!("stalled: it answered no call within {:?} (`[faults] call_timeout_s`), though it may still send heartbeats", self.call_timeout);
                eprintln!("[fleet] {process} {why}");
                let _ = self.lost.send((process.to_string(), why));
                Ok(Reply::Lost(process.to_string()))
            }
        }
    }

    /// `process` was started again and says Hello: calls on it wait for their answers again.
    pub(super) fn revive(&self, process: &str) {
        self.gone.lock().expect("gone lock").remove(process);
    }

    pub(super) fn resolve(&self, key: Key, reply: Reply) {
        match self.pending.lock().expect("pending lock").remove(&key) {
            Some((_, tx)) => {
                let _ = tx.send(reply);
            }
            None => eprintln!("[fleet] a reply to call {key:?} that nothing waits for (late, after a loss?)"),
        }
    }

    /// `process` is lost (`why`): a learner rank's loss is noted for the run
    /// first, then every call waiting on it fails.
    pub(super) fn lose(&self, process: &str, why: &str, exited: bool) {
        let learner = self.members.lock().expect("members lock").iter().any(|m| m.planned.name == process && has(&m.planned, Role::Learner));
        if learner {
            self.learner_loss.lock().expect("loss lock").get_or_insert_with(|| LostRank { why: format!("{process} {why}"), exited });
        }
        self.gone.lock().expect("gone lock").insert(process.to_string());
        self.fail_process(process);
    }

    /// Fails every call waiting on `process`.
    pub(super) fn fail_process(&self, process: &str) {
        let mut pending = self.pending.lock().expect("pending lock");
        let keys: Vec<Key> = pending.iter().filter(|(_, (p, _))| p.iter().any(|p| p == process)).map(|(k, _)| *k).collect();
        for k in keys {
            if let Some((_, tx)) = pending.remove(&k) {
                let _ = tx.send(Reply::Lost(process.to_string()));
            }
        }
    }

    pub(super) fn index(&self, process: &str) -> Option<usize> {
        self.names.iter().position(|n| n == process)
    }

    pub(super) fn is_down(&self, process: &str) -> bool {
        self.down.lock().expect("down lock").contains(process)
    }

    /// The rollout process behind proxy `actor`, if it is one of ours.
    pub(super) fn process_of(&self, actor: &ActorRef<RolloutMsg>) -> Option<String> {
        let slots = self.rollouts.lock().expect("slots lock");
        let i = slots.iter().position(|s| s.as_ref().is_some_and(|r| r.get_id() == actor.get_id()))?;
        self.routes.get().map(|r| r[i].process.clone())
    }

    pub(super) fn mark_missed(&self, process: &str) {
        self.missed.lock().expect("missed lock").insert(process.to_string());
    }

    /// `process` checked and loaded `version`.
    pub(super) fn loaded(&self, process: &str, version: u64) {
        self.versions.lock().expect("versions lock").insert(process.to_string(), version);
        self.missed.lock().expect("missed lock").remove(process);
    }

    /// Waits until the newest group publication to `process` has settled
    /// (bounded by the call timeout). Without it a request could overtake the
    /// version published just before it and be generated with the one before:
    /// in `one_step_off` with two rollout processes that made 96 of 256 groups
    /// stale. A publication whose future was dropped counts as settled.
    pub(super) async fn settled(&self, process: &str) {
        let settling = self.settling.lock().expect("settling lock").get(process).cloned();
        if let Some(mut rx) = settling {
            let _ = tokio::time::timeout(self.call_timeout, rx.wait_for(|done| *done)).await;
        }
    }
}

/// One started process.
pub(super) struct Member {
    pub(super) planned: Planned,
    pub(super) hello: Hello,
    /// The handle of a process this run started (none when started externally).
    pub(super) process: Option<Process>,
    pub(super) log: PathBuf,
    /// How it was started (none when started externally), to start it again.
    pub(super) spec: Option<ProcessSpec>,
    /// What it was told to host, to host it again after a restart.
    pub(super) setup: Option<NodeSetup>,
    /// Times it was started again.
    pub(super) restarts: u32,
}

/// Lines for the run's progress log.
pub type Say = Arc<dyn Fn(String) + Send + Sync>;

/// Waits for a process's answer to its [`NodeSetup`].
pub(super) async fn ready(rx: oneshot::Receiver<Reply>, name: &str, log: &Path) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(300), rx).await {
        Ok(Ok(Reply::Control(ControlMsg::Ready(Ok(()))))) => Ok(()),
        Ok(Ok(Reply::Control(ControlMsg::Ready(Err(e))))) => Err(format!("{name}: setup failed: {e}")),
        Ok(Ok(Reply::Lost(_))) => Err(format!("{name}: lost during setup; the end of its log ({}):\n{}", log.display(), tail(log, 20))),
        Ok(Ok(other)) => Err(format!("{name}: setup: unexpected answer {other:?}; its log: {}", log.display())),
        Ok(Err(_)) => Err(format!("{name}: setup: the router stopped")),
        Err(_) => Err(format!("{name}: not ready within 300 s; the end of its log ({}):\n{}", log.display(), tail(log, 20))),
    }
}

pub(super) fn has(p: &Planned, role: Role) -> bool {
    p.actors.iter().any(|a| a.role == role)
}

/// The last `n` lines of a log file, for an error message.
pub(super) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Set by the fleet when a learner rank's process is lost.
pub type LearnerLoss = Arc<Mutex<Option<LostRank>>>;

/// How a learner rank's process was lost.
#[derive(Clone, Debug)]
pub struct LostRank {
    /// Which process, and how.
    pub why: String,
    /// It exited (rather than fell silent).
    pub exited: bool,
}
