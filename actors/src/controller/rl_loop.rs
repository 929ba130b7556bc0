//! The RL phase of a run as its own state: rollout requests go out ahead of
//! the learner by the mode's bound (`sync` 0, `one_step_off` 1, `async` k),
//! scored groups pass the staleness gate, the learner steps, and each new
//! version is published to the rollout actors. Every group's life is in the
//! ledger; every step leaves a `metrics.jsonl` row and its rollouts' rows.
use super::batch::{informative, train_batch, Advantages};
use super::dispatch::Dispatch;
use super::driver::Driver;
use super::ledger::Ledger;
use super::progress::{eta, Progress};
use super::recipe::Recipe;
use super::record::{batch_record, scored_records, step_record, StepFacts, StepPhases};
use super::error::{actor_err, answered, RunError};
use super::journal::{checkpoint, write_status, Cursor, Jsonl};
use super::staleness::{Admission, Gate, Mode};
use super::status::RunStatus;
use crate::learner::actor::LearnerMsg;
use crate::learner::StepStats;
use crate::metrics::Metrics;
use crate::node::fleet::Fleet;
use crate::reward::ScoredGroup;
use crate::rollout::actor::{Purpose, RolloutMsg, RolloutRequest, RolloutResult, TOOLS_GIVEN_UP};
use rlmesh_core::Task;
use serde_json::Value;
use std::collections::{BTreeSet, VecDeque};
use std::path::Path;
use std::time::Instant;
use tokio::task::JoinSet;

/// Steps' worth of unscorable groups in a row after which the run stops at a
/// checkpoint: a verifier or tool server that never scores would otherwise
/// drop and replace groups for ever.
pub const UNSCORABLE_STEPS: usize = 3;

/// Failed rollout requests a group may be in before it is dropped as
/// unscorable (e.g. its task's `env_state` makes the reset tool fail): a
/// request lost to a dead rollout process is retried, a group that can never
/// be rolled out is not retried for ever.
pub const GROUP_REQUEST_FAILURES: usize = 3;

/// The wait before re-dispatching after the `n`-th failed request in a row:
/// 0.25 s, doubling, at most 8 s.
fn lost_back_off(n: u32) -> std::time::Duration {
    std::time::Duration::from_millis(250u64 << n.saturating_sub(1).min(5))
}

/// What the RL phase reads from the run around it.
pub(super) struct RlContext<'a> {
    pub(super) recipe: &'a Recipe,
    pub(super) train: &'a [Task],
    pub(super) dir: &'a Path,
    pub(super) metrics: &'a Metrics,
    pub(super) progress: &'a Progress,
    pub(super) fleet: Option<&'a Fleet>,
    pub(super) stopping: &'a (dyn Fn() -> bool + Sync),
    /// RL steps to reach (the recipe's, or `--max-steps`).
    pub(super) steps: u64,
    /// The held-out figures after the warm-up (kept in every checkpoint's cursor).
    pub(super) after_warmup: &'a Value,
    pub(super) after_warmup_sampled: &'a Value,
    /// Wall seconds of the processes before this one (a resumed run), and this one's start.
    pub(super) earlier_seconds: f64,
    pub(super) t0: Instant,
    /// The tools the training tasks allow (the `tool` label's values; any other call is `other`).
    pub(super) tools: Vec<String>,
}

/// A rollout request out, with the groups it carries.
type Request = (Vec<(u64, Task)>, Result<RolloutResult, String>);

/// The RL phase's state between steps.
pub(super) struct RlLoop<'a> {
    cx: RlContext<'a>,
    pub(super) ledger: Ledger,
    pub(super) gate: Gate,
    /// Groups whose work was lost, to send out first.
    retry: VecDeque<(u64, Task)>,
    inflight: JoinSet<Request>,
    /// The groups in the requests out, by id.
    inflight_ids: BTreeSet<u64>,
    /// Scored groups waiting for the learner, each with the time it was
    /// scored, in group-id (dispatch) order.
    ready: VecDeque<(Instant, ScoredGroup)>,
    /// The next new group's training task (group id g is training task g).
    pub(super) cursor: usize,
    pub(super) step: u64,
    pub(super) version: u64,
    estimator: Advantages,
    metrics_log: Jsonl,
    rollouts_log: Jsonl,
    batches_log: Option<Jsonl>,
    scored_log: Option<Jsonl>,
    dispatched_requests: u64,
    gen_tokens: usize,
    gen_seconds: f64,
    publishes: JoinSet<Result<Option<f64>, String>>,
    phases: StepPhases,
    last_record: Instant,
    rl_start: Instant,
    rl_first: u64,
    /// Uniform groups dropped since the last step (dynamic sampling), against its budget.
    uniform_dropped: usize,
    /// Unscorable groups in a row, and the last one's reason: past
    /// [`UNSCORABLE_STEPS`] steps' worth, scoring is broken and the run stops.
    unscorable_run: (usize, String),
    /// Failed requests per group still to train, with the last error.
    failures: std::collections::BTreeMap<u64, (usize, String)>,
    /// Failed requests since the last answered one (for the back-off).
    lost_in_a_row: u32,
    /// The rollout actors whose answers came in since the last step's record.
    answered_by: BTreeSet<String>,
}

impl<'a> RlLoop<'a> {
    /// The loop at `start` (a resumed run's cursor, or the start of RL), with
    /// the ledger's lost groups to send out again first.
    pub(super) fn open(cx: RlContext<'a>, ledger: Ledger, retry: VecDeque<(u64, Task)>, start: &Cursor, version: u64, record_batches: bool) -> Result<Self, RunError> {
        let dir = cx.dir;
        let (batches_log, scored_log) = match record_batches {
            true => (Some(Jsonl::resume(dir.join("batches.jsonl"), usize::MAX)?), Some(Jsonl::resume(dir.join("scored.jsonl"), usize::MAX)?)),
            false => (None, None),
        };
        let now = Instant::now();
        cx.metrics.staleness_bound.set(cx.recipe.mode().max_staleness() as f64);
        Ok(RlLoop {
            gate: Gate::new(cx.recipe.mode()),
            estimator: Advantages::of(cx.recipe),
            metrics_log: Jsonl::resume(dir.join("metrics.jsonl"), start.metrics_rows)?,
            rollouts_log: Jsonl::resume(dir.join("rollouts.jsonl"), start.rollouts_rows)?,
            batches_log,
            scored_log,
            cursor: ledger.next_group_id() as usize,
            ledger,
            retry,
            inflight: JoinSet::new(),
            inflight_ids: BTreeSet::new(),
            ready: VecDeque::new(),
            step: start.step,
            version,
            dispatched_requests: 0,
            gen_tokens: 0,
            gen_seconds: 0.0,
            publishes: JoinSet::new(),
            phases: StepPhases::default(),
            last_record: now,
            rl_start: now,
            rl_first: start.step,
            uniform_dropped: 0,
            unscorable_run: (0, String::new()),
            failures: Default::default(),
            lost_in_a_row: 0,
            answered_by: BTreeSet::new(),
            cx,
        })
    }

    /// What the loop runs in.
    pub(super) fn context(&self) -> &RlContext<'a> {
        &self.cx
    }

    /// Wall seconds of the whole run so far.
    pub(super) fn wall(&self) -> f64 {
        self.cx.earlier_seconds + self.cx.t0.elapsed().as_secs_f64()
    }

    /// The data cursor a checkpoint taken now records.
    pub(super) fn cursor_now(&self) -> Cursor {
        Cursor::at(self.step, self.cursor, &self.metrics_log, &self.rollouts_log, self.cx.after_warmup, self.cx.after_warmup_sampled, &self.ledger, self.wall(), self.cx.metrics.carried())
    }

    /// Trains to the last step. A SIGTERM is looked at after every answer from
    /// a rollout actor, not only after a trained step (a loop whose groups all
    /// go stale still stops): the loop then checkpoints and ends with
    /// [`RunError::Stopped`]. At the end, groups still out are dropped in the ledger.
    ///
    /// Steps train groups in dispatch order, whatever order the answers come
    /// in, and requests go out at the same points between steps (one step,
    /// then the requests it makes room for): which rollout process answers
    /// first changes nothing, so a seeded run gives the same figures on any
    /// placement of its rollout actors.
    pub(super) async fn run(&mut self, driver: &mut Driver, status: &mut RunStatus) -> Result<(), RunError> {
        let steps = self.cx.steps;
        self.cx.progress.bar("rl", steps, self.step);
        while self.step < steps {
            if (self.cx.stopping)() {
                return self.stop(driver, status).await;
            }
            self.fill(driver).await?;
            if let Some(waited) = self.next_batch() {
                let gps = waited.len();
                self.phases.queue_wait += waited.iter().map(|(scored, _)| scored.elapsed().as_secs_f64()).sum::<f64>() / gps as f64;
                let batch: Vec<ScoredGroup> = waited.into_iter().map(|(_, g)| g).collect();
                self.train_step(driver, status, batch).await?;
                continue;
            }
            let Some(joined) = self.inflight.join_next().await else { break };
            let (groups, result) = joined.map_err(actor_err("controller"))?;
            for (id, _) in &groups {
                self.inflight_ids.remove(id);
            }
            match result {
                Ok(res) => {
                    self.lost_in_a_row = 0;
                    for (id, _) in &groups {
                        self.failures.remove(id);
                    }
                    self.receive(driver, res).await?;
                }
                Err(e) if e.contains(TOOLS_GIVEN_UP) => {
                    // The servers' failures are counted; past the budget the run stops where it can resume.
                    self.retry.extend(groups);
                    return self.stop_because(driver, status, &e).await;
                }
                Err(e) => self.lost(groups, e).await?,
            }
            if self.unscorable_run.0 >= UNSCORABLE_STEPS * self.cx.recipe.rl.groups_per_step.max(1) {
                let why = format!("{} groups in a row were unscorable or their agent programs failed (the last: {})", self.unscorable_run.0, self.unscorable_run.1);
                return self.stop_because(driver, status, &why).await;
            }
        }
        self.cx.progress.finish_bar();
        self.drain().await
    }

    /// The next step's groups: the `groups_per_step` oldest ready ones, once
    /// no older group is still out.
    fn next_batch(&mut self) -> Option<Vec<(Instant, ScoredGroup)>> {
        let gps = self.cx.recipe.rl.groups_per_step;
        let newest = self.ready.get(gps.checked_sub(1)?)?.1.group.group_id;
        if self.inflight_ids.first().is_some_and(|&oldest_out| oldest_out < newest) {
            return None;
        }
        Some(self.ready.drain(..gps).collect())
    }

    /// Keeps every rollout actor busy within the staleness bound: groups out
    /// or waiting up to the [`Dispatch`] window (at most `1 + ahead` steps,
    /// never more than the steps still to train; a stale or lost group is
    /// replaced), in requests of at most [`Dispatch::chunk`] groups, each to
    /// the least busy actor. A step's groups so go to as many actors as it has
    /// groups, up to all of them; after dynamic sampling dropped some, only
    /// those missing go out.
    async fn fill(&mut self, driver: &mut Driver) -> Result<(), RunError> {
        let (recipe, metrics) = (self.cx.recipe, self.cx.metrics);
        let gps = recipe.rl.groups_per_step.max(1);
        let dispatch = Dispatch::new(gps, recipe.rl.group_size, recipe.mode().max_staleness(), driver.rollout_slots());
        let wanted = dispatch.wanted(gps, self.cx.steps - self.step);
        while self.inflight_ids.len() + self.ready.len() < wanted {
            let retried = self.retry.front().is_some_and(|(id, _)| self.failures.contains_key(id));
            let n = if retried { 1 } else { (wanted - self.inflight_ids.len() - self.ready.len()).min(dispatch.chunk) };
            let groups = next_groups(n, &mut self.retry, &mut self.ledger, self.cx.train, &mut self.cursor, self.version, metrics)?;
            self.dispatched_requests += 1;
            self.inflight_ids.extend(groups.iter().map(|(id, _)| *id));
            let (target, busy) = driver.pick().await?;
            let seed = recipe.seed.wrapping_mul(1_000_003).wrapping_add(self.dispatched_requests);
            let req = RolloutRequest { groups: groups.clone(), purpose: Purpose::Train, seed };
            self.inflight.spawn(async move {
                let out = match ractor::call!(target, RolloutMsg::Generate, req) {
                    Ok(r) => r,
                    Err(e) => Err(format!("rollout actor failed: {e}")),
                };
                drop(busy);
                (groups, out)
            });
        }
        Ok(())
    }

    /// A failed request's groups: after a back-off, each goes out again on
    /// its own (so one bad group does not fail the others again), until it
    /// has failed [`GROUP_REQUEST_FAILURES`] times: then it is dropped as
    /// unscorable and replaced, as a group a verifier could not score is.
    async fn lost(&mut self, groups: Vec<(u64, Task)>, e: String) -> Result<(), RunError> {
        self.lost_in_a_row += 1;
        let wait = lost_back_off(self.lost_in_a_row);
        self.cx.progress.line(format!("rollout request lost ({e}); re-dispatching {} group(s) in {:.2} s", groups.len(), wait.as_secs_f64()));
        tokio::time::sleep(wait).await;
        for (id, task) in groups {
            let failed = self.failures.entry(id).or_insert((0, String::new()));
            *failed = (failed.0 + 1, e.clone());
            if failed.0 < GROUP_REQUEST_FAILURES {
                self.retry.push_back((id, task));
                continue;
            }
            let why = format!("its rollouts failed in {GROUP_REQUEST_FAILURES} requests (the last: {e})");
            self.failures.remove(&id);
            self.cx.progress.line(format!("group {id} (task {}) dropped as unscorable: {why}", task.id));
            self.ledger.dropped(id, "unscorable")?;
            self.cx.metrics.groups_dropped_total.with_label_values(&["unscorable"]).inc();
            self.unscorable_run = (self.unscorable_run.0 + 1, why);
        }
        Ok(())
    }

    /// A rollout answer: counted, scored, and its groups ready for the learner.
    async fn receive(&mut self, driver: &mut Driver, res: RolloutResult) -> Result<(), RunError> {
        self.gen_tokens += res.generated_tokens;
        self.gen_seconds += res.seconds;
        self.phases.generated_tokens += res.generated_tokens;
        self.phases.generate += res.seconds - res.tool_seconds;
        self.phases.tools += res.tool_seconds;
        let actor = if res.actor.is_empty() { "rollout" } else { res.actor.as_str() };
        self.answered_by.insert(actor.to_string());
        self.cx.metrics.generated_tokens_total.with_label_values(&[actor]).inc_by(res.generated_tokens as u64);
        let scoring = Instant::now();
        let scored = driver.score(res).await?;
        self.phases.reward += scoring.elapsed().as_secs_f64();
        let now = Instant::now();
        for g in scored {
            self.ledger.scored(g.group.group_id)?;
            let segments_untrainable = !g.group.earlier_segments.is_empty() && !self.estimator.takes_segments();
            let failed = g.group.failed.clone().or_else(|| {
                segments_untrainable.then(|| "its program rewrote its history (segments), which only grpo, dr_grpo and rloo train".to_string())
            });
            if let Some(why) = failed {
                // A failed agent program is never scored 0: dropped, counted, replaced.
                self.cx.progress.line(format!("group {} (task {}) dropped as failed_agent: {why}", g.group.group_id, g.group.task.id));
                self.ledger.dropped(g.group.group_id, "failed_agent")?;
                self.cx.metrics.groups_dropped_total.with_label_values(&["failed_agent"]).inc();
                self.unscorable_run = (self.unscorable_run.0 + 1, why);
                continue;
            }
            if let Some(why) = &g.unscorable {
                // Infrastructure failures never enter group statistics: dropped, counted, replaced.
                self.cx.progress.line(format!("group {} dropped as unscorable: {why}", g.group.group_id));
                self.ledger.dropped(g.group.group_id, "unscorable")?;
                self.cx.metrics.groups_dropped_total.with_label_values(&["unscorable"]).inc();
                self.unscorable_run = (self.unscorable_run.0 + 1, why.clone());
                continue;
            }
            self.unscorable_run.0 = 0;
            if self.drops_uniform(&g)? {
                self.ledger.dropped(g.group.group_id, "uniform")?;
                self.cx.metrics.groups_dropped_total.with_label_values(&["uniform"]).inc();
                self.uniform_dropped += 1;
            } else {
                let at = self.ready.partition_point(|(_, r)| r.group.group_id < g.group.group_id);
                self.ready.insert(at, (now, g));
            }
        }
        Ok(())
    }

    /// Dynamic sampling: whether `g` is dropped for teaching nothing. Within a
    /// step's budget of `(max_draws − 1) × groups_per_step` drops only; past
    /// it, uniform groups are trained as they come.
    fn drops_uniform(&self, g: &ScoredGroup) -> Result<bool, RunError> {
        let rl = &self.cx.recipe.rl;
        if !rl.dynamic_sampling || self.uniform_dropped >= (rl.max_draws() - 1) * rl.groups_per_step {
            return Ok(false);
        }
        let useful = informative(g, &self.estimator).map_err(|e| RunError::Actor { actor: "controller", message: format!("advantages: {e}") })?;
        Ok(!useful)
    }

    /// One step's batch: the gate admits what is fresh enough, the learner
    /// trains on it, the new version goes out, and the step is recorded.
    async fn train_step(&mut self, driver: &mut Driver, status: &mut RunStatus, batch: Vec<ScoredGroup>) -> Result<(), RunError> {
        let (recipe, metrics, progress) = (self.cx.recipe, self.cx.metrics, self.cx.progress);
        let (admitted, max_stale) = admit(batch, &mut self.gate, &mut self.ledger, self.version, metrics)?;
        if admitted.is_empty() {
            return Ok(());
        }
        let training = Instant::now();
        let tb = train_batch(&admitted, &self.estimator).map_err(|e| RunError::Actor { actor: "controller", message: format!("advantages: {e}") })?;
        if let Some(log) = self.batches_log.as_mut() {
            log.write(&batch_record(self.step + 1, &admitted, &tb))?;
        }
        if let Some(log) = self.scored_log.as_mut() {
            for row in scored_records(self.step + 1, &admitted) {
                log.write(&row)?;
            }
        }
        let stats: StepStats = answered("learner", ractor::call!(driver.learner, LearnerMsg::Train, tb))?;
        self.phases.train += training.elapsed().as_secs_f64();
        self.phases.all_reduce += stats.allreduce_seconds;
        self.step += 1;
        self.uniform_dropped = 0;
        let step = self.step;
        metrics.observe_rollouts(admitted.iter().flat_map(|g| &g.group.trajectories), &self.cx.tools);
        for g in &admitted {
            self.ledger.trained(g.group.group_id, step)?;
            metrics.groups_trained_total.inc();
            for s in &g.scores {
                self.rollouts_log.write(&s.row)?;
            }
        }
        self.version += 1;
        let version = self.version;
        let syncing = Instant::now();
        if let Some(acks) = driver.publish(version, recipe.mode() == Mode::Sync).await? {
            self.publishes.spawn(async move { acks.await.map_err(|e| e.to_string())? });
        }
        self.phases.sync += syncing.elapsed().as_secs_f64();
        while let Some(done) = self.publishes.try_join_next() {
            match done {
                Ok(Ok(Some(secs))) => metrics.weight_sync_seconds.observe(secs),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => progress.line(format!("weight sync failed: {e}")),
                Err(e) => progress.line(format!("weight sync failed: {e}")),
            }
        }
        // This step's: the answers received since the last record.
        let gen_tok_s = if self.gen_seconds > 0.0 { self.gen_tokens as f64 / self.gen_seconds } else { 0.0 };
        (self.gen_tokens, self.gen_seconds) = (0, 0.0);
        self.phases.step_seconds = self.last_record.elapsed().as_secs_f64();
        self.last_record = Instant::now();
        let facts = StepFacts { step, version, stats: &stats, admitted: &admitted, gen_tok_s, max_stale, seconds: self.cx.t0.elapsed().as_secs_f64(), phases: &self.phases };
        let mut row = step_record(metrics, recipe, &facts);
        row["rollout_actors_answering"] = serde_json::json!(std::mem::take(&mut self.answered_by).len());
        self.phases.observe(metrics, driver.rollout_actors());
        self.phases = StepPhases::default();
        self.metrics_log.write(&row)?;
        let steps = self.cx.steps;
        if step.is_multiple_of(recipe.rl.checkpoint_every) && step < steps {
            checkpoint(&driver.learner, self.cx.dir, version, &self.cursor_now()).await?;
        }
        status.tokens_per_s = row["tokens_per_s"].as_f64();
        status.staleness_max = Some(max_stale);
        write_status(status, self.cx.dir, "rl", step, version, self.cx.fleet);
        let rate = |k: &str| row[k].as_f64().unwrap_or(0.0);
        let (reward_mean, success) = (rate("reward_mean"), rate("trajectory_success"));
        progress.tick(step, format!("reward {reward_mean:.3} success {success:.2}"));
        progress.line(format!(
            "rl {step}/{steps} v{version} reward {reward_mean:.3} success {success:.2} tool {:.2} unnecessary {:.2} repeated {:.2} | {:.0} gen tok/s | stale ≤{max_stale} | ETA {}",
            rate("tool_call_rate"),
            rate("unnecessary_tool_rate"),
            rate("repeated_call_rate"),
            rate("tokens_per_s"),
            eta(self.rl_start.elapsed(), step - self.rl_first, steps - self.rl_first)
        ));
        Ok(())
    }

    /// SIGTERM: a checkpoint at this step boundary (unless one was just taken), then [`RunError::Stopped`].
    async fn stop(&mut self, driver: &Driver, status: &mut RunStatus) -> Result<(), RunError> {
        self.stop_because(driver, status, "SIGTERM").await
    }

    /// Stops at this step boundary with a checkpoint, saying `cause` (SIGTERM, a given-up tool server).
    async fn stop_because(&mut self, driver: &Driver, status: &mut RunStatus, cause: &str) -> Result<(), RunError> {
        let (dir, progress) = (self.cx.dir, self.cx.progress);
        let (step, steps) = (self.step, self.cx.steps);
        progress.finish_bar();
        if step % self.cx.recipe.rl.checkpoint_every != 0 {
            checkpoint(&driver.learner, dir, self.version, &self.cursor_now()).await?;
        }
        write_status(status, dir, "stopped", step, self.version, self.cx.fleet);
        let has_checkpoint = !crate::learner::list_checkpoints(&dir.join("checkpoints")).is_empty();
        let why = if has_checkpoint {
            format!("{cause}: stopped at RL step {step}/{steps} after a checkpoint; `launcher up … --resume --run-dir {}` continues it", dir.display())
        } else {
            format!("{cause}: stopped at RL step {step}/{steps}, before any checkpoint: start the run again")
        };
        progress.line(why.clone());
        Err(RunError::Stopped(why))
    }

    /// After the last step: groups still out, waiting or to send out again are
    /// not trained in this run (dropped in the ledger); background syncs are awaited.
    async fn drain(&mut self) -> Result<(), RunError> {
        let metrics = self.cx.metrics;
        while let Some(joined) = self.inflight.join_next().await {
            if let Ok((groups, _)) = joined {
                for (id, _) in groups {
                    self.ledger.dropped(id, "run ended")?;
                    metrics.groups_dropped_total.with_label_values(&["run_ended"]).inc();
                }
            }
        }
        for (_, g) in self.ready.drain(..) {
            self.ledger.dropped(g.group.group_id, "run ended")?;
        }
        // A resumed run at its last step has groups to send out again and no step left to train them.
        for (id, _) in self.retry.drain(..) {
            self.ledger.dropped(id, "run ended")?;
        }
        while let Some(done) = self.publishes.join_next().await {
            if let Ok(Ok(Some(secs))) = done {
                metrics.weight_sync_seconds.observe(secs);
            }
        }
        Ok(())
    }
}

/// The next request's `n` groups: those to send out again first (their work
/// was lost), then new ones in task order; each is recorded in the ledger.
fn next_groups(n: usize, retry: &mut VecDeque<(u64, Task)>, ledger: &mut Ledger, train: &[Task], cursor: &mut usize, version: u64, metrics: &Metrics) -> Result<Vec<(u64, Task)>, RunError> {
    let mut groups = Vec::with_capacity(n);
    while groups.len() < n {
        if let Some(g) = retry.pop_front() {
            ledger.redispatch(g.0, version)?;
            metrics.groups_redispatched_total.inc();
            groups.push(g);
        } else {
            let id = ledger.next_group_id();
            ledger.dispatch(id, version)?;
            metrics.groups_dispatched_total.inc();
            groups.push((id, train[*cursor % train.len()].clone()));
            *cursor += 1;
        }
    }
    Ok(groups)
}

/// The groups of a batch the staleness gate lets the learner train on at
/// `version`, and their largest staleness; the others are dropped in the ledger.
fn admit(batch: Vec<ScoredGroup>, gate: &mut Gate, ledger: &mut Ledger, version: u64, metrics: &Metrics) -> Result<(Vec<ScoredGroup>, u64), RunError> {
    let mut admitted = vec![];
    let mut max_stale = 0u64;
    for g in batch {
        let v = g.group.trajectories.iter().filter_map(|t| t.min_version()).min().unwrap_or(version);
        match gate.admit(v, version).map_err(actor_err("controller"))? {
            Admission::Train { staleness } => {
                max_stale = max_stale.max(staleness);
                metrics.staleness.observe(staleness as f64);
                admitted.push(g);
            }
            Admission::Stale { .. } => {
                ledger.dropped(g.group.group_id, "stale")?;
                metrics.groups_dropped_total.with_label_values(&["stale"]).inc();
            }
        }
    }
    Ok((admitted, max_stale))
}
