//! The controller's handle on its actors: picking a live rollout actor (and
//! bringing it to the latest version), scoring, publishing a version to every
//! rollout actor, and evaluating on held-out tasks.
use super::error::{actor_err, RunError};
use super::supervisor::RolloutSlots;
use crate::learner::actor::LearnerMsg;
use crate::metrics::Metrics;
use crate::node::publisher::Publisher;
use crate::reward::{RewardMsg, ScoredGroup};
use crate::rollout::actor::{Purpose, RolloutMsg, RolloutRequest, RolloutResult};
use crate::weight_sync::image::WeightUpdate;
use crate::weight_sync::WeightSyncMsg;
use ractor::ActorRef;
use rlmesh_core::Task;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// A version on its way to the rollout actors: the seconds its send took, or none when a
/// group broadcast failed (each process that missed it is given it before its next request).
type Publication = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<f64>, String>> + Send>>;

/// The actors a run drives.
pub(super) struct Driver {
    pub(super) learner: ActorRef<LearnerMsg>,
    pub(super) reward: ActorRef<RewardMsg>,
    pub(super) weight_sync: ActorRef<WeightSyncMsg>,
    /// Supervises the rollout actors in this process.
    pub(super) supervisor: ractor::ActorCell,
    pub(super) slots: RolloutSlots,
    /// Proxies of the rollout actors in other processes (a slot is empty while its process is down).
    pub(super) remote: RolloutSlots,
    /// Their weight-sync group, when there is one.
    pub(super) publisher: Option<Publisher>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) latest: Option<WeightUpdate>,
    /// The version published last: every actor is brought to it before its next request.
    pub(super) current: Option<u64>,
    /// Version each rollout actor (by id) has been sent.
    pub(super) versions: HashMap<ractor::ActorId, u64>,
    pub(super) next_actor: usize,
    /// Requests out at each rollout actor (by id), counted by the [`Busy`] guards [`Driver::pick`] hands out.
    pub(super) busy: BusyCounts,
}

/// Requests out per rollout actor.
pub(super) type BusyCounts = Arc<std::sync::Mutex<HashMap<ractor::ActorId, usize>>>;

/// One request out at a rollout actor: counted while this lives.
pub(super) struct Busy {
    counts: BusyCounts,
    id: ractor::ActorId,
}

impl Busy {
    fn new(counts: &BusyCounts, id: ractor::ActorId) -> Self {
        *counts.lock().expect("busy lock").entry(id).or_default() += 1;
        Busy { counts: counts.clone(), id }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().expect("busy lock");
        if let Some(n) = counts.get_mut(&self.id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.id);
            }
        }
    }
}

/// The index (into `busy`, one count per live actor in a fixed order) of the
/// actor with the fewest requests out; ties go to the first at or after
/// `next` (round-robin among equals). `None` when there is no actor.
///
/// Round-robin alone sends a request to an actor still working through a long
/// one while another sits idle, whenever requests finish out of order.
pub fn least_busy(busy: &[usize], next: usize) -> Option<usize> {
    let n = busy.len();
    (0..n).map(|k| (next + k) % n).min_by_key(|&i| busy[i])
}

impl Driver {
    /// Stops the actors in this process (those of other processes leave with their process).
    pub(super) fn stop(&self) {
        self.learner.stop(None);
        self.reward.stop(None);
        self.weight_sync.stop(None);
        self.supervisor.stop(None);
    }

    /// How many rollout actors are live now, here and in other processes.
    pub(super) fn rollout_actors(&self) -> usize {
        self.live().len()
    }

    /// How many rollout actors the run has (live or restarting, here and in
    /// other processes): what the dispatch is cut for, whatever is up right now.
    pub(super) fn rollout_slots(&self) -> usize {
        self.slots.lock().expect("slots lock").len() + self.remote.lock().expect("slots lock").len()
    }

    pub(super) fn live(&self) -> Vec<ActorRef<RolloutMsg>> {
        let local: Vec<ActorRef<RolloutMsg>> = self.slots.lock().expect("slots lock").iter().flatten().cloned().collect();
        local.into_iter().chain(self.remote_live()).filter(|r| r.get_status() == ractor::ActorStatus::Running).collect()
    }

    fn remote_live(&self) -> Vec<ActorRef<RolloutMsg>> {
        self.remote.lock().expect("slots lock").iter().flatten().cloned().collect()
    }

    pub(super) async fn snapshot(&mut self, version: u64) -> Result<(), RunError> {
        let update = ractor::call!(self.learner, LearnerMsg::Snapshot, version, false).map_err(actor_err("learner"))?;
        self.latest = Some(update);
        Ok(())
    }

    /// Publish `version` to every live rollout actor; with `wait`, until their
    /// digest-checked acks, otherwise only until the update is queued ahead of any later request.
    ///
    /// Rollout processes get it through their weight-sync group (from learner
    /// rank 0, or from here when the learner is in this process); actors in
    /// this process, or in processes without a group, through the weight-sync
    /// actor. The controller fetches the image only when it sends it itself.
    ///
    /// A failed broadcast to the rollout processes does not fail the run: the
    /// processes that missed the version are marked, [`Driver::pick`] loads the
    /// current version into each before its next request, and the group is
    /// formed again for the next version. The seconds are `None` then.
    pub(super) async fn publish(&mut self, version: u64, wait: bool) -> Result<Option<tokio::task::JoinHandle<Result<Option<f64>, String>>>, RunError> {
        let started = std::time::Instant::now();
        self.current = Some(version);
        let targets = self.live();
        let remote_ids: std::collections::HashSet<ractor::ActorId> = self.remote_live().iter().map(|r| r.get_id()).collect();
        let (remote, local): (Vec<_>, Vec<_>) = targets.into_iter().partition(|t| remote_ids.contains(&t.get_id()));
        let grouped = self.publisher.is_some() && !remote.is_empty();
        let via_actor: Vec<ActorRef<RolloutMsg>> = if grouped { local } else { local.into_iter().chain(remote.iter().cloned()).collect() };
        // Without a group the image is always taken: `pick` loads it into any actor that missed a
        // publication (one not live yet, or restarted), which a resumed run's first version needs.
        let need_image = !grouped || !via_actor.is_empty() || self.publisher.as_ref().is_some_and(Publisher::needs_image);
        if need_image && self.latest.as_ref().is_none_or(|u| u.version != version) {
            self.snapshot(version).await?;
        }
        let mut waits: Vec<Publication> = vec![];
        if grouped {
            let p = self.publisher.as_ref().expect("grouped");
            let image = if p.needs_image() { self.latest.clone() } else { None };
            let recovered = move |e: String| eprintln!("[driver] weight sync v{version} to the rollout processes failed ({e}); each that missed it gets it before its next request");
            let metrics = self.metrics.clone();
            match p.publish(version, image).await {
                Ok(acks) => waits.push(Box::pin(async move {
                    match acks.await {
                        Ok(sent) => {
                            // Rank 0's broadcast: the send phase, on the controller's metrics.
                            metrics.weight_sync_phase_seconds.with_label_values(&["send"]).observe(sent);
                            Ok(Some(sent))
                        }
                        Err(e) => {
                            recovered(e);
                            Ok(None)
                        }
                    }
                })),
                Err(e) => recovered(e),
            }
            for t in &remote {
                self.versions.insert(t.get_id(), version);
            }
        }
        if !via_actor.is_empty() {
            let update = self.latest.clone().expect("snapshot taken");
            let (done_tx, done_rx) = ractor::concurrency::oneshot();
            ractor::call!(self.weight_sync, |queued| WeightSyncMsg::Publish(update, via_actor.clone(), queued, done_tx.into()))
                .map_err(actor_err("weight_sync"))?;
            for t in &via_actor {
                self.versions.insert(t.get_id(), version);
            }
            waits.push(Box::pin(async move { done_rx.await.map_err(|_| "weight-sync actor stopped".to_string())?.map(Some) }));
        }
        // Done when every receiver has acknowledged: the whole publication's seconds (None: it failed).
        let acks = async move {
            let mut done = true;
            for w in waits {
                done &= w.await?.is_some();
            }
            Ok(done.then(|| started.elapsed().as_secs_f64()))
        };
        if wait {
            if let Some(secs) = acks.await.map_err(actor_err("weight_sync"))? {
                self.metrics.weight_sync_seconds.observe(secs);
            }
            Ok(None)
        } else {
            Ok(Some(tokio::spawn(acks)))
        }
    }

    /// The live rollout actor with the fewest requests out ([`least_busy`]),
    /// brought to the current version first if it missed it ((re)started
    /// since, or a broadcast to it failed), with the guard that counts the
    /// request as out until it is dropped. Waits up to
    /// [`Driver::NO_ACTOR_WAIT`] for one (a restart in progress).
    pub(super) async fn pick(&mut self) -> Result<(ActorRef<RolloutMsg>, Busy), RunError> {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Self::NO_ACTOR_WAIT {
            let live = self.live();
            if live.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let counts: Vec<usize> = {
                let busy = self.busy.lock().expect("busy lock");
                live.iter().map(|a| busy.get(&a.get_id()).copied().unwrap_or(0)).collect()
            };
            let i = least_busy(&counts, self.next_actor % live.len()).expect("live is not empty");
            let target = live[i].clone();
            self.next_actor = i + 1;
            if let Some(current) = self.current {
                let missed = self.publisher.as_ref().is_some_and(|p| p.missed(&target));
                if missed || self.versions.get(&target.get_id()) != Some(&current) {
                    if self.latest.as_ref().is_none_or(|u| u.version != current) {
                        self.snapshot(current).await?;
                    }
                    let update = self.latest.clone().expect("snapshot taken");
                    match ractor::call!(target, RolloutMsg::LoadWeights, update) {
                        Ok(Ok(_)) => {
                            self.versions.insert(target.get_id(), current);
                        }
                        _ => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                }
            }
            let busy = Busy::new(&self.busy, target.get_id());
            return Ok((target, busy));
        }
        Err(RunError::Actor { actor: "rollout", message: format!("no live rollout actor for {:?} (restart budgets spent?)", Self::NO_ACTOR_WAIT) })
    }

    /// How long [`Driver::pick`] waits for a live rollout actor.
    const NO_ACTOR_WAIT: Duration = Duration::from_secs(120);

    /// The result's groups, scored: by a reward process on their way here, or by this process's reward actor.
    pub(super) async fn score(&self, res: RolloutResult) -> Result<Vec<ScoredGroup>, RunError> {
        if let Some(scored) = res.scored {
            return Ok(scored);
        }
        ractor::call!(self.reward, RewardMsg::Score, res.groups).map_err(actor_err("reward"))
    }

    /// One rollout per task (greedy, or sampled as in training), spread over
    /// every rollout actor ([`eval_chunk`](super::dispatch::eval_chunk) tasks a request), scored. A chunk whose actor fails (its process lost)
    /// goes to another, up to [`Driver::EVAL_TRIES`] times: its seed comes from
    /// the request, so the retry gives the same rollouts.
    pub(super) async fn evaluate(&mut self, tasks: &[Task], seed: u64, greedy: bool) -> Result<Vec<ScoredGroup>, RunError> {
        let mut out = vec![];
        let chunk = super::dispatch::eval_chunk(tasks.len(), self.rollout_slots());
        let purpose = if greedy { Purpose::EvalGreedy } else { Purpose::EvalSampled };
        let mut pending: JoinSet<(RolloutRequest, u32, Result<RolloutResult, String>)> = JoinSet::new();
        let mut todo: Vec<(RolloutRequest, u32)> = tasks
            .chunks(chunk)
            .enumerate()
            .map(|(i, c)| (RolloutRequest { groups: c.iter().enumerate().map(|(j, t)| ((i * chunk + j) as u64, t.clone())).collect(), purpose, seed }, 0))
            .collect();
        todo.reverse();
        loop {
            while let Some((req, tries)) = todo.pop() {
                let (target, busy) = self.pick().await?;
                pending.spawn(async move {
                    let r = ractor::call!(target, RolloutMsg::Generate, req.clone()).map_err(|e| e.to_string()).and_then(|r| r);
                    drop(busy);
                    (req, tries + 1, r)
                });
            }
            let Some(done) = pending.join_next().await else { break };
            let (req, tries, r) = done.map_err(actor_err("rollout"))?;
            match r {
                Ok(r) => out.extend(self.score(r).await?),
                Err(e) if tries < Self::EVAL_TRIES => {
                    eprintln!("[driver] an evaluation request failed ({e}); sending it to another rollout actor");
                    todo.push((req, tries));
                }
                Err(e) => return Err(RunError::Actor { actor: "rollout", message: format!("evaluation failed {tries} times: {e}") }),
            }
        }
        out.sort_by_key(|g| g.group.group_id);
        Ok(out)
    }

    /// How many times an evaluation request is tried.
    const EVAL_TRIES: u32 = 3;
}

#[cfg(test)]
mod tests {
    use super::least_busy;

    #[test]
    fn the_idle_actor_is_picked_over_a_busy_one_whatever_the_turn() {
        // Actor 0 is still working on a long request; round-robin's turn is 0.
        assert_eq!(least_busy(&[1, 0], 0), Some(1));
        assert_eq!(least_busy(&[0, 2, 1], 1), Some(0));
        assert_eq!(least_busy(&[3, 1, 2, 1], 0), Some(1));
    }

    #[test]
    fn equals_take_turns() {
        let mut next = 0;
        let mut order = vec![];
        for _ in 0..6 {
            let i = least_busy(&[0, 0, 0], next).unwrap();
            order.push(i);
            next = i + 1;
        }
        assert_eq!(order, [0, 1, 2, 0, 1, 2]);
        assert_eq!(least_busy(&[1, 2, 1], 1), Some(2), "ties go to the first at or after the turn");
    }

    #[test]
    fn no_actor_no_pick() {
        assert_eq!(least_busy(&[], 3), None);
    }

    #[test]
    fn a_busy_guard_counts_until_dropped() {
        let counts = super::BusyCounts::default();
        let id = ractor::ActorId::Local(7);
        let a = super::Busy::new(&counts, id);
        let b = super::Busy::new(&counts, id);
        assert_eq!(counts.lock().unwrap().get(&id), Some(&2));
        drop(a);
        assert_eq!(counts.lock().unwrap().get(&id), Some(&1));
        drop(b);
        assert!(counts.lock().unwrap().is_empty());
    }
}
