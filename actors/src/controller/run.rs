//! The run driver: set-up, warm-up, RL and the final evaluation of one run.
//!
//! It creates (or loads) the policy, warms it up with SFT on noisy expert
//! trajectories, spawns the actors (rollout under a supervisor, reward,
//! learner, weight-sync) or hosts them in the fleet's processes, evaluates the
//! warmed-up policy, runs the RL phase ([`super::rl_loop`]), and at the end
//! evaluates the policy greedily on held-out tasks and writes `summary.json`.
use super::init::{build_task_tokenizer, create_tiny_model, InitError};
use super::ledger::{Event, Ledger, LedgerError, LEDGER_FILE};
use super::recipe::Recipe;
use super::run_dir::{LockError, RunDirLock};
use super::status::RunStatus;
use super::supervisor::{RolloutSlots, RolloutSupervisor, SupervisorArgs};
use crate::learner::actor::{LearnerActor, LearnerArgs, LearnerMsg};
use super::driver::Driver;
use super::rl_loop::{RlContext, RlLoop};
use super::progress::{eta, stop_on_sigterm, Progress};
use super::record::figures;
use super::warm_start;
use super::recipe::{EstimatorKind, JudgeName};
use crate::learner::{
    AdamWConfig, CheckpointMeta, ClipParams, GaeConfig, KlCoef, KlConfig, KlEstimator, KlPlacement, LearnerConfig, LrSchedule, SftBatch, SftSequence, StepStats, ValueConfig,
};
use crate::metrics::{serve, Metrics};
use crate::node::fleet::{Fleet, FleetSpec, RoleSetup};
use crate::node::wire::RolloutSetup;
use crate::reward::{JudgeSpec, RewardActor, RewardSpec};
use crate::rollout::actor::RolloutArgs;
use crate::rollout::RolloutConfig;
use crate::warmup::{expert_example, pick_strategy};
use crate::weight_sync::WeightSync;
use ractor::{Actor, ActorRef};
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_core::Task;
use rlmesh_model::{SamplingParams, Tokenizer};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to run.
pub struct RunOptions {
    /// The run directory (created).
    pub run_dir: PathBuf,
    /// The recipe.
    pub recipe: Recipe,
    /// Rollout actors to start (from the topology's plan).
    pub rollout_actors: usize,
    /// Tokenizer files for a created tiny model (SmolLM2's).
    pub tokenizer_dir: PathBuf,
    /// Override of the recipe's RL steps.
    pub max_steps: Option<u64>,
    /// Override of the recipe's SFT steps.
    pub sft_steps: Option<u64>,
    /// Address of the `/metrics` endpoint (`127.0.0.1:0` for an ephemeral port).
    pub metrics_addr: String,
    /// Fault injection: rollout actor 0 panics on this request.
    pub panic_rollout_on_request: Option<u64>,
    /// Print progress to stderr.
    pub progress: bool,
    /// Evaluate on at most this many held-out tasks (tests; default: all).
    pub eval_limit: Option<usize>,
    /// Continue the run in `run_dir` from its newest checkpoint instead of starting
    /// afresh: groups trained after that checkpoint are rolled back in the ledger and
    /// sent out again with the groups that were in flight, so none is trained twice.
    pub resume: bool,
    /// The processes other than this one (`None`: every actor runs in this process).
    pub fleet: Option<FleetSpec>,
    /// Write each RL step's per-token advantages to `RUN_DIR/batches.jsonl` (large: for inspection and tests).
    pub record_batches: bool,
}

/// Write `status.json` (read by `launcher status` / `launcher down`) at `phase`, `step`, `version`.
pub(super) fn write_status(status: &mut RunStatus, dir: &Path, phase: &str, step: u64, version: u64, fleet: Option<&Fleet>) {
    if let Some(f) = fleet {
        status.processes.truncate(1);
        status.processes.extend(f.entries(version));
    }
    status.phase = phase.to_string();
    status.step = step;
    status.version = version;
    let _ = status.write(dir);
}

/// Prometheus discovery files for every process of the run (`RUN_DIR/prometheus/`).
fn write_discovery(dir: &Path, plan: Option<&crate::controller::plan::Plan>, metrics_addr: &str, progress: &Progress) {
    let run = dir.file_name().map_or_else(|| "run".to_string(), |n| n.to_string_lossy().into_owned());
    // A wildcard bind (0.0.0.0:P) is scraped at the controller's host.
    let target = match (metrics_addr.parse::<std::net::SocketAddr>(), plan) {
        (Ok(a), Some(p)) if a.ip().is_unspecified() => p.controller.rsplit_once(':').map_or_else(|| metrics_addr.to_string(), |(h, _)| format!("{h}:{}", a.port())),
        _ => metrics_addr.to_string(),
    };
    let rules = Path::new("deploy/prometheus/rules.yml");
    match crate::controller::discovery::write(dir, &run, plan, &target, rules.is_file().then_some(rules)) {
        Ok(config) => progress.line(format!("Prometheus targets in {} (`launcher monitor {}` scrapes them)", config.display(), dir.display())),
        Err(e) => progress.line(format!("Prometheus discovery files not written: {e}")),
    }
}

/// `summary.json`: the held-out figures of a finished run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Recipe name.
    pub recipe: String,
    /// Held-out tasks evaluated.
    pub eval_tasks: usize,
    /// Share with the right tool, arguments, execution and answer and no unnecessary or repeated call.
    pub trajectory_success: f64,
    /// Share with the right final answer.
    pub final_answer_accuracy: f64,
    /// Share of no-tool tasks where a tool was called.
    pub unnecessary_tool_rate: f64,
    /// Share of rollouts repeating a call.
    pub repeated_call_rate: f64,
    /// Share of tool tasks where a tool was called.
    pub tool_call_rate: f64,
    /// On tool tasks: the share of gold steps made right, in place.
    #[serde(default)]
    pub step_call_accuracy: f64,
    /// On tool tasks: the judged summary score `q` (0..=1).
    #[serde(default)]
    pub summary_score: f64,
    /// The same figures before RL (after the SFT warm-up).
    pub after_warmup: Option<Value>,
    /// The figures above come from greedy decoding; these from one rollout per
    /// held-out task sampled at the RL temperature (the policy's own
    /// distribution, as the seed measures it): `{"temperature", "final", "after_warmup"}`.
    #[serde(default)]
    pub sampled: Value,
    /// RL steps trained.
    pub steps: u64,
    /// Groups trained / dropped as stale / re-dispatched after a failure.
    pub groups: Value,
    /// Rollout actor restarts (the first actor in this process).
    pub actor_restarts: u64,
    /// Restarts of each process of a distributed run that was started again.
    #[serde(default)]
    pub process_restarts: std::collections::BTreeMap<String, u32>,
    /// The run's counters at the end, over every process of it (a resumed run's included).
    #[serde(default)]
    pub counters: crate::metrics::Carried,
    /// Wall seconds of the whole run.
    pub wall_seconds: f64,
    /// Where `/metrics` was served.
    pub metrics_addr: String,
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Set-up failed (model, tokenizer, tools, tasks).
    #[error("set-up: {0}")]
    Setup(String),
    /// The request is refused before anything was changed (a live run owns the
    /// directory, nothing to resume, another recipe, a port in use): the user's to fix.
    #[error("{0}")]
    Refused(String),
    /// Stopped on request (SIGTERM, e.g. from `launcher down`), after a checkpoint where one can be taken.
    #[error("{0}")]
    Stopped(String),
    /// An actor failed beyond recovery.
    #[error("{actor}: {message}")]
    Actor {
        /// Which actor.
        actor: &'static str,
        /// What happened.
        message: String,
    },
    /// A learner rank's process was lost: the run cannot go on, and is to be
    /// started again from its newest checkpoint (`launcher up` does so by
    /// itself, within its restart budget).
    #[error("a learner rank is lost ({why}): {cause}")]
    LearnerLost {
        /// Which process, and how it was lost.
        why: String,
        /// The error the run stopped on.
        cause: String,
        /// The process exited (a crash), so the run can start again at once;
        /// otherwise it fell silent (its host unreachable?), and a start would wait for it.
        exited: bool,
    },
    /// The ledger refused a transition.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// Writing the run directory failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io { path: path.to_path_buf(), source }
}

pub(super) fn actor_err(actor: &'static str) -> impl Fn(String) -> RunError {
    move |message| RunError::Actor { actor, message }
}

/// splitmix64 step.
fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E3779B97F4A7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

pub(super) struct Jsonl(std::fs::File, PathBuf, usize);

impl Jsonl {
    /// Opens `path` keeping only its first `rows` lines (what a checkpoint had seen).
    pub(super) fn resume(path: PathBuf, rows: usize) -> Result<Jsonl, RunError> {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let keep: usize = text.split_inclusive('\n').take(rows).map(str::len).sum();
        let f = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io(&path))?;
        f.set_len(keep as u64).map_err(io(&path))?;
        let kept = text[..keep].lines().count();
        Ok(Jsonl(f, path, kept))
    }
    pub(super) fn write(&mut self, v: &impl Serialize) -> Result<(), RunError> {
        let line = serde_json::to_string(v).expect("rows serialise");
        self.2 += 1;
        writeln!(self.0, "{line}").map_err(io(&self.1))
    }
    fn rows(&self) -> usize {
        self.2
    }
}

/// Where a resumed run picks up: the pipeline's record in a checkpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Cursor {
    /// RL steps trained.
    pub(super) step: u64,
    /// Next training task (equal to the next group id).
    train_cursor: usize,
    /// Rows in `metrics.jsonl` and `rollouts.jsonl` at the checkpoint.
    pub(super) metrics_rows: usize,
    pub(super) rollouts_rows: usize,
    /// The held-out figures measured after the warm-up (greedy, sampled).
    after_warmup: Value,
    after_warmup_sampled: Value,
    /// Groups the ledger recorded as trained at the checkpoint (absent in older checkpoints).
    #[serde(default)]
    groups_trained: Option<usize>,
    /// Wall seconds of the run up to the checkpoint, over all its processes.
    #[serde(default)]
    pub(super) wall_seconds: f64,
    /// The counters carried over a resume (absent in older checkpoints).
    #[serde(default)]
    pub(super) counters: crate::metrics::Carried,
}

impl Cursor {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn at(step: u64, train_cursor: usize, metrics: &Jsonl, rollouts: &Jsonl, after_warmup: &Value, after_warmup_sampled: &Value, ledger: &Ledger, wall_seconds: f64, counters: crate::metrics::Carried) -> Cursor {
        Cursor {
            step,
            train_cursor,
            metrics_rows: metrics.rows(),
            rollouts_rows: rollouts.rows(),
            after_warmup: after_warmup.clone(),
            after_warmup_sampled: after_warmup_sampled.clone(),
            groups_trained: Some(ledger.counts().trained),
            wall_seconds,
            counters,
        }
    }
}

pub(super) async fn checkpoint(learner: &ActorRef<LearnerMsg>, dir: &Path, version: u64, cursor: &Cursor) -> Result<PathBuf, RunError> {
    let meta = CheckpointMeta { policy_version: version, data_cursor: serde_json::to_value(cursor).expect("json") };
    ractor::call!(learner, LearnerMsg::Checkpoint, dir.join("checkpoints"), meta)
        .map_err(|e| RunError::Actor { actor: "learner", message: e.to_string() })?
        .map_err(actor_err("learner"))
}

fn rl_learner_config(recipe: &Recipe) -> LearnerConfig {
    let e = &recipe.estimator;
    let steptool = e.name == EstimatorKind::Steptool;
    let kl = (e.kl_coef > 0.0).then(|| match steptool {
        // StepTool (TRL's PPO): k1 in each token's reward, β adapted toward a target KL.
        true => KlConfig {
            estimator: KlEstimator::K1,
            coef: KlCoef::Adaptive { init: e.kl_coef, target: e.kl_target.unwrap_or(6.0), horizon: 10_000.0 },
            placement: KlPlacement::Reward,
        },
        false => KlConfig { estimator: KlEstimator::K3, coef: KlCoef::Fixed { beta: e.kl_coef }, placement: KlPlacement::Loss },
    });
    LearnerConfig {
        optim: AdamWConfig { lr: recipe.rl.lr, ..Default::default() },
        clip: ClipParams { eps_low: e.clip_eps, eps_high: e.clip_eps, ..Default::default() },
        micro_batch_size: 16,
        max_grad_norm: Some(1.0),
        seed: recipe.seed,
        kl,
        value: value_head(recipe),
        gae: steptool.then(|| GaeConfig { gamma: e.gamma.unwrap_or(0.99), lam: e.lam.unwrap_or(0.95) }),
        ..Default::default()
    }
}

/// The value head StepTool trains (clip 0.2, coefficient 0.1); present from the
/// learner's start, since a learner cannot grow one later.
fn value_head(recipe: &Recipe) -> Option<ValueConfig> {
    (recipe.estimator.name == EstimatorKind::Steptool).then(ValueConfig::default)
}


/// A fresh run never appends to an earlier run's ledger and logs: a `dir` holding
/// anything but its lock file and its Slurm submission (`slurm/`) is renamed to `<dir>.prev-<unix seconds>` (returned)
/// before the run starts. Call it holding `dir`'s lock ([`claim_run_dir`] does).
pub fn set_aside_previous_run(dir: &Path) -> Result<Option<PathBuf>, RunError> {
    // `slurm/` holds the submission of the job running this (its script and Slurm's output file).
    let occupied = std::fs::read_dir(dir).map(|d| d.flatten().any(|e| e.file_name() != super::run_dir::LOCK_FILE && e.file_name() != "slurm")).unwrap_or(false);
    if !occupied {
        return Ok(None);
    }
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut name = dir.as_os_str().to_owned();
    name.push(format!(".prev-{secs}"));
    let mut target = PathBuf::from(name);
    let mut n = 1;
    while target.exists() {
        let mut alt = target.as_os_str().to_owned();
        alt.push(format!("-{n}"));
        target = PathBuf::from(alt);
        n += 1;
    }
    std::fs::rename(dir, &target).map_err(io(dir))?;
    Ok(Some(target))
}

/// Takes `dir` for a new job: refused when a live run holds its lock; otherwise,
/// for a fresh run, an earlier run in it is set aside (see [`set_aside_previous_run`])
/// while we hold its lock, and `dir` is created anew. The lock is the job's for its life.
pub fn claim_run_dir(dir: &Path, resume: bool) -> Result<(RunDirLock, Option<PathBuf>), RunError> {
    let lock = |d: &Path| {
        RunDirLock::acquire(d).map_err(|e| match e {
            LockError::Held { .. } => RunError::Refused(e.to_string()),
            LockError::Io { path, source } => RunError::Io { path, source },
        })
    };
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        return Ok((lock(dir)?, None));
    }
    let old = lock(dir)?;
    if resume {
        return Ok((old, None));
    }
    let Some(previous) = set_aside_previous_run(dir)? else { return Ok((old, None)) };
    drop(old);
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    Ok((lock(dir)?, Some(previous)))
}

/// The newest checkpoint's pipeline record (`state.json`'s data cursor), read without changing anything.
fn newest_cursor(dir: &Path) -> Option<Cursor> {
    let (_, newest) = crate::learner::list_checkpoints(&dir.join("checkpoints")).into_iter().next()?;
    let state: Value = serde_json::from_str(&std::fs::read_to_string(newest.join("state.json")).ok()?).ok()?;
    serde_json::from_value(state.get("meta")?.get("data_cursor")?.clone()).ok()
}

/// Replays `ledger.jsonl` without changing it: (next group id, groups trained at steps ≤ `step`).
/// A torn last line is skipped, as [`Ledger::open`] would cut it off.
fn ledger_at(dir: &Path, step: u64) -> (u64, usize) {
    let text = std::fs::read_to_string(dir.join(LEDGER_FILE)).unwrap_or_default();
    let mut next = 0;
    let mut trained: HashMap<u64, u64> = HashMap::new();
    for e in text.lines().filter_map(|l| serde_json::from_str::<Event>(l).ok()) {
        if let Some(g) = e.group() {
            next = next.max(g + 1);
        }
        match e {
            Event::Trained { group, step } => {
                trained.insert(group, step);
            }
            Event::Rollback { step } => trained.retain(|_, s| *s <= step),
            _ => {}
        }
    }
    (next, trained.values().filter(|s| **s <= step).count())
}

/// A resumed run that already finished: its `summary.json`, when it trained `steps` steps.
/// Resuming it does nothing and changes no file.
pub fn finished_run(dir: &Path, steps: u64) -> Option<Summary> {
    let summary: Summary = serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).ok()?).ok()?;
    (summary.steps >= steps && newest_cursor(dir).is_some_and(|c| c.step >= steps)).then_some(summary)
}

/// A run can resume when its directory holds a checkpoint, was started with the
/// same recipe (`config.json`) and its ledger holds every group the checkpoint
/// counted; anything else is refused before anything is changed.
pub fn check_resumable(dir: &Path, recipe: &Recipe) -> Result<(), RunError> {
    let refuse = |why: String| Err(RunError::Refused(format!("--resume: {}: {why}", dir.display())));
    if crate::learner::list_checkpoints(&dir.join("checkpoints")).is_empty() {
        return refuse("no checkpoint to resume from (start the run without --resume)".into());
    }
    let cfg_path = dir.join("config.json");
    let stored: Value = match std::fs::read_to_string(&cfg_path).ok().and_then(|t| serde_json::from_str(&t).ok()) {
        Some(v) => v,
        None => return refuse("config.json is missing or unreadable".into()),
    };
    let ours = serde_json::to_value(recipe).expect("recipes serialise");
    // Read back through the recipe type, so a field added since the run began
    // compares as its default: a run of an earlier build resumes when nothing it set changed.
    let stored = stored.get("recipe").cloned().unwrap_or(Value::Null);
    let stored = serde_json::from_value::<Recipe>(stored.clone()).ok().and_then(|r| serde_json::to_value(r).ok()).unwrap_or(stored);
    if let Some((field, was, now)) = first_difference("", &stored, &ours) {
        return refuse(format!("the run was started with another recipe: `{field}` was {was} in its config.json, is {now} now"));
    }
    // The ledger is written before the checkpoint that counts it: one that has
    // seen fewer groups than the checkpoint lost records, and resuming from it
    // could train a group twice or leave one untrained.
    let Some(c) = newest_cursor(dir) else { return Ok(()) };
    let (next, trained) = ledger_at(dir, c.step);
    if (next as usize) < c.train_cursor || c.groups_trained.is_some_and(|n| trained < n) {
        return refuse(format!(
            "{} records {next} groups ({trained} trained by step {}) but the checkpoint saw {}{}: the ledger lost records, refusing to resume",
            dir.join(LEDGER_FILE).display(),
            c.step,
            c.train_cursor,
            c.groups_trained.map_or_else(String::new, |n| format!(" ({n} trained)"))
        ));
    }
    Ok(())
}

/// The first field where two JSON values differ: (dotted path, a's value, b's value).
fn first_difference(path: &str, a: &Value, b: &Value) -> Option<(String, Value, Value)> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                first_difference(&p, x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null))
            })
        }
        _ if a == b => None,
        _ => Some((if path.is_empty() { "recipe".into() } else { path.to_string() }, a.clone(), b.clone())),
    }
}

/// The policy's initial model directory: a created tiny model (with its task
/// tokenizer, learned here) in `RUN_DIR/initial-model`, the one a resumed run
/// created, or the recipe's transformers directory.
fn policy_dir(recipe: &Recipe, dir: &Path, resume: bool, tokenizer_dir: &Path, train: &[Task], sft_tasks: &[Task], registry: &ToolRegistry) -> Result<PathBuf, RunError> {
    if !recipe.tiny_model() {
        return Ok(PathBuf::from(&recipe.model.path));
    }
    let d = dir.join("initial-model");
    if resume {
        return Ok(d);
    }
    let setup = |e: InitError| RunError::Setup(e.to_string());
    let tokenizer_dir = if recipe.model.tokenizer == "task" {
        let corpus: Vec<Task> = train.iter().chain(sft_tasks.iter().take(1024)).cloned().collect();
        build_task_tokenizer(&d, &corpus, registry, recipe.model.vocab_size, recipe.model.number_chunk).map_err(setup)?;
        d.clone()
    } else {
        tokenizer_dir.to_path_buf()
    };
    create_tiny_model(&d, &tokenizer_dir, recipe.tiny_spec(), recipe.seed).map_err(setup)
}

/// The SFT warm-up: `steps` batches of expert conversations (noisy strategies
/// drawn with the recipe's mix), one learner step each.
struct WarmUp<'a> {
    learner: &'a ActorRef<LearnerMsg>,
    tokenizer: &'a Tokenizer,
    registry: &'a ToolRegistry,
    recipe: &'a Recipe,
    tasks: &'a [Task],
    steps: u64,
}

impl WarmUp<'_> {
    /// Runs it, reporting progress; a SIGTERM (`stopping`) ends it with [`RunError::Stopped`].
    async fn run(&self, progress: &Progress, metrics: &Metrics, stopping: &dyn Fn() -> bool) -> Result<(), RunError> {
        let (recipe, sft_steps) = (self.recipe, self.steps);
        let mut rng = recipe.seed ^ 0x5f7;
        let mut sft_cursor = 0usize;
        // Expert conversations are rendered once per (task, strategy) and reused.
        let mut experts: HashMap<(usize, crate::warmup::Strategy), SftSequence> = HashMap::new();
        // Batches are drawn in task order with a random strategy each (no length
        // bucketing: batches of one length are of one task kind, and the warm-up
        // then swings between calling and not calling — measured: 49.5% held-out
        // success after 3,000 bucketed steps vs 76.5% after 1,500 unbucketed ones).
        let warmup_start = Instant::now();
        progress.bar("sft", sft_steps, 0);
        for step in 0..sft_steps {
            if stopping() {
                progress.finish_bar();
                let why = format!("SIGTERM during the warm-up (step {step}/{sft_steps}): stopped; a run has no checkpoint before its warm-up ends, so start it again");
                progress.line(why.clone());
                return Err(RunError::Stopped(why));
            }
            let mut seqs = Vec::with_capacity(recipe.sft.batch_size);
            for _ in 0..recipe.sft.batch_size {
                let index = sft_cursor % self.tasks.len();
                sft_cursor += 1;
                let task = &self.tasks[index];
                let u = (mix(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
                let strategy = pick_strategy(&recipe.sft.mix, task, u);
                if !experts.contains_key(&(index, strategy)) {
                    let ex = expert_example(self.tokenizer, self.registry, task, strategy, None).map_err(|e| RunError::Setup(e.to_string()))?;
                    experts.insert((index, strategy), SftSequence { token_ids: ex.token_ids, loss_mask: ex.loss_mask });
                }
                seqs.push(experts[&(index, strategy)].clone());
            }
            let stats: StepStats = ractor::call!(self.learner, LearnerMsg::Sft, SftBatch { sequences: seqs })
                .map_err(|e| RunError::Actor { actor: "learner", message: e.to_string() })?
                .map_err(actor_err("learner"))?;
            metrics.warmup_step.set((step + 1) as f64);
            metrics.warmup_loss.set(stats.loss);
            let eta = eta(warmup_start.elapsed(), step + 1, sft_steps);
            progress.tick(step + 1, format!("loss {:.3}", stats.loss));
            if step % (sft_steps / 20).max(25) == 0 || step + 1 == sft_steps || progress.due() {
                progress.line(format!("sft {}/{sft_steps} loss {:.3} ({:.0} tok/s) ETA {eta}", step + 1, stats.loss, stats.tokens_per_s));
            }
        }
        progress.finish_bar();
        Ok(())
    }
}

/// The run's ledger, and on a resume the groups to send out again: training
/// after the checkpoint `start` is lost with the process, so those groups and
/// the ones that were out go out again (group id g is training task g).
fn open_ledger(dir: &Path, start: Option<&Cursor>, train: &[Task], progress: &Progress) -> Result<(Ledger, VecDeque<(u64, Task)>), RunError> {
    let mut ledger = Ledger::open(dir)?;
    let mut retry = VecDeque::new();
    let Some(start) = start else { return Ok((ledger, retry)) };
    // The ledger is written before the checkpoint that counts it: one that has
    // seen fewer groups than the checkpoint lost records, and resuming from it
    // could train a group twice.
    if (ledger.next_group_id() as usize) < start.train_cursor {
        return Err(RunError::Refused(format!(
            "--resume: {} records {} groups but the checkpoint saw {}: the ledger lost records, refusing to resume",
            ledger.path().display(),
            ledger.next_group_id(),
            start.train_cursor
        )));
    }
    ledger.rollback(start.step)?;
    for g in ledger.in_flight() {
        retry.push_back((g, train[g as usize % train.len()].clone()));
    }
    progress.line(format!("ledger: {} groups to send out again", retry.len()));
    Ok((ledger, retry))
}

/// Every tool some training task allows, sorted.
fn allowed_tools(train: &[Task]) -> Vec<String> {
    let set: std::collections::BTreeSet<&String> = train.iter().flat_map(|t| &t.allowed_tools).collect();
    set.into_iter().cloned().collect()
}

/// Run a recipe to the end; returns the summary (also written to `summary.json`).
///
/// When a learner rank's process is lost, the run fails with
/// [`RunError::LearnerLost`], after every process of the run has been stopped.
pub async fn run(opts: RunOptions) -> Result<Summary, RunError> {
    let lost: LearnerLoss = Arc::default();
    match run_processes(opts, lost.clone()).await {
        Err(e @ (RunError::Refused(_) | RunError::Stopped(_))) => Err(e),
        Err(e) => match lost.lock().expect("loss lock").clone() {
            Some(LostRank { why, exited }) => Err(RunError::LearnerLost { why, cause: e.to_string(), exited }),
            None => Err(e),
        },
        ok => ok,
    }
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

async fn run_processes(opts: RunOptions, learner_loss: LearnerLoss) -> Result<Summary, RunError> {
    let t0 = Instant::now();
    // The controller's own tensor work (creating the tiny model) is light: on one
    // thread it leaves no idle OpenMP team behind. libgomp counts every team's
    // threads, and with more of them than cores it stops spin-waiting between
    // parallel regions, which made each warm-up step much slower (measured).
    tch::set_num_threads(1);
    let progress = Arc::new(Progress::new(opts.progress, t0));
    let stop = stop_on_sigterm();
    let stopping = || stop.load(std::sync::atomic::Ordering::SeqCst);
    let dir = opts.run_dir.clone();
    let recipe = opts.recipe.clone();
    let cfg_path = dir.join("config.json");
    let steps = opts.max_steps.unwrap_or(recipe.rl.steps);
    // Every check comes before anything is created: a refused run changes no file.
    if opts.resume {
        check_resumable(&dir, &recipe)?;
        if let Some(summary) = finished_run(&dir, steps) {
            progress.line(format!("{} finished at step {}; nothing to resume", dir.display(), summary.steps));
            return Ok(summary);
        }
    }
    let metrics = Arc::new(Metrics::new());
    let server = serve(&metrics, opts.metrics_addr.as_str())
        .map_err(|e| RunError::Refused(format!("/metrics on {} (--metrics-addr, or the topology's ports.metrics): {e}", opts.metrics_addr)))?;
    let metrics_addr = server.local_addr().to_string();
    let (_lock, previous) = claim_run_dir(&dir, opts.resume)?;
    progress.attach_log(&dir);
    progress.line(format!("run {} → {} (metrics at http://{metrics_addr}/metrics)", recipe.name, dir.display()));
    if let Ok(why) = std::env::var(rlmesh_mesh::load::PASSIVE_WHY_ENV) {
        progress.line(format!("OpenMP threads wait passively (OMP_WAIT_POLICY=PASSIVE): {why}"));
    }
    // The other processes start now, while this one makes the model.
    let fleet = match &opts.fleet {
        Some(spec) => Some(Fleet::launch(spec, &dir, metrics.clone(), learner_loss, &|l| progress.line(l)).await.map_err(RunError::Setup)?),
        None => None,
    };
    let my_roles: Vec<String> = match &fleet {
        Some(f) => f.controller().actors.iter().map(|a| a.role.to_string()).collect(),
        None => ["controller", "rollout", "reward", "learner", "weight_sync"].map(String::from).to_vec(),
    };
    let mut status = RunStatus::of_this_process(&my_roles.iter().map(String::as_str).collect::<Vec<_>>());
    if let Some(f) = &fleet {
        if let Some(main) = status.processes.first_mut() {
            (main.name, main.host) = (f.controller().name.clone(), f.controller().host.clone());
        }
        status.processes.extend(f.entries(0));
    }
    status.metrics_addr = Some(metrics_addr.clone());
    status.slurm = opts.fleet.as_ref().and_then(|f| f.slurm.as_ref()).map(|s| crate::controller::status::SlurmJob {
        job_id: s.job_id.clone(),
        submitted: s.submitted,
        step_name: s.step_name.clone(),
    });
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&json!({"recipe": recipe, "rollout_actors": opts.rollout_actors})).expect("json"))
        .map_err(io(&cfg_path))?;

    if let Some(p) = previous {
        progress.line(format!("the run that was in {} is kept in {}", dir.display(), p.display()));
    }
    write_discovery(&dir, fleet.as_ref().map(Fleet::plan), &metrics_addr, &progress);

    // The policy.
    let limits = ExecLimits { timeout_ms: 2000, max_output_bytes: 2048, max_calls_per_turn: 4 };
    let registry = ToolRegistry::from_names(&recipe.tools, limits).map_err(|e| RunError::Setup(e.to_string()))?;
    let (train, mut held_out) = recipe.tasks().map_err(|e| RunError::Setup(e.to_string()))?;
    let sft_tasks = if recipe.sft.steps > 0 { recipe.sft_tasks(&held_out).map_err(|e| RunError::Setup(e.to_string()))? } else { vec![] };
    let model_dir = policy_dir(&recipe, &dir, opts.resume, &opts.tokenizer_dir, &train, &sft_tasks, &registry)?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2) as i32;
    // A warm-up shared with the runs next to this one: restored when stored, else stored after it.
    let shared = (recipe.sft.share && !opts.resume && opts.sft_steps.is_none() && recipe.tiny_model() && recipe.sft.steps > 0)
        .then(|| warm_start::shared_dir(&recipe, &dir, cores));
    let reused = shared.as_ref().is_some_and(|s| warm_start::is_stored(s));
    if let (Some(s), true) = (&shared, reused) {
        warm_start::restore(s, &model_dir).map_err(|e| RunError::Setup(format!("restoring the shared warm-up {}: {e}", s.display())))?;
        progress.line(format!("warm-up: starting from the shared warm-up in {}", s.display()));
    }
    let tokenizer = Tokenizer::load(&model_dir).map_err(|e| RunError::Setup(e.to_string()))?;
    if let Some(n) = opts.eval_limit {
        held_out.truncate(n);
    }
    write_status(&mut status, &dir, "warmup", 0, 0, fleet.as_ref());

    // The learner, warmed up with SFT.
    let sft_steps = if opts.resume || reused { 0 } else { opts.sft_steps.unwrap_or(recipe.sft.steps) };
    let sft_cfg = LearnerConfig {
        optim: AdamWConfig { lr: recipe.sft.lr, weight_decay: recipe.sft.weight_decay, beta2: recipe.sft.beta2, ..Default::default() },
        warmup_steps: recipe.sft.lr_warmup,
        schedule: LrSchedule::Cosine { total_steps: sft_steps.max(1) },
        micro_batch_size: recipe.sft.micro_batch_size.min(recipe.sft.batch_size),
        seed: recipe.seed,
        value: value_head(&recipe),
        ..Default::default()
    };
    let rollout_cfg = RolloutConfig {
        group_size: recipe.rl.group_size,
        max_turns: recipe.rl.max_turns,
        max_tokens: recipe.rl.max_new_tokens * recipe.rl.max_turns + 256,
        sampling: SamplingParams { max_new_tokens: recipe.rl.max_new_tokens, temperature: recipe.rl.temperature, ..Default::default() },
        system_prompt: None,
    };
    let reward_spec = RewardSpec {
        kind: recipe.reward,
        judge: match recipe.judge {
            JudgeName::Rule => JudgeSpec::Rule,
            JudgeName::Model => JudgeSpec::Model { dir: recipe.judge_model.as_ref().map_or_else(|| opts.tokenizer_dir.clone(), PathBuf::from) },
        },
    };
    let mut hosted = match &fleet {
        Some(f) => {
            let roles = RoleSetup {
                model_dir: model_dir.clone(),
                rollout: RolloutSetup { tools: recipe.tools.clone(), limits, config: rollout_cfg.clone() },
                reward: reward_spec.clone(),
                learner: sft_cfg.clone(),
            };
            let say: crate::node::fleet::Say = {
                let p = progress.clone();
                Arc::new(move |l| p.line(l))
            };
            let h = f.host(&roles, say, metrics.clone()).await.map_err(RunError::Setup)?;
            progress.line(format!("hosted: {} rollout process(es), {} learner rank(s) elsewhere", h.rollouts.lock().expect("slots lock").len(), h.learner_ranks));
            Some(h)
        }
        None => None,
    };
    let learner = match hosted.as_ref().and_then(|h| h.learner.clone()) {
        Some(remote) => remote,
        None => {
            Actor::spawn(None, LearnerActor, LearnerArgs { model_dir: model_dir.clone(), config: sft_cfg, threads: cores, ring: None })
                .await
                .map_err(|e| RunError::Setup(format!("learner: {e}")))?
                .0
        }
    };
    let warm = WarmUp { learner: &learner, tokenizer: &tokenizer, registry: &registry, recipe: &recipe, tasks: &sft_tasks, steps: sft_steps };
    if let Err(e) = warm.run(&progress, &metrics, &stopping).await {
        if matches!(e, RunError::Stopped(_)) {
            write_status(&mut status, &dir, "stopped", 0, 0, fleet.as_ref());
        }
        return Err(e);
    }
    let resumed: Option<(u64, Cursor)> = if opts.resume {
        let meta = ractor::call!(learner, LearnerMsg::Resume, dir.join("checkpoints"), rl_learner_config(&recipe))
            .map_err(|e| RunError::Actor { actor: "learner", message: e.to_string() })?
            .map_err(actor_err("learner"))?;
        let cursor: Cursor = serde_json::from_value(meta.data_cursor)
            .map_err(|e| RunError::Setup(format!("--resume: the checkpoint's data cursor is not this pipeline's ({e})")))?;
        progress.line(format!("resuming at RL step {} (policy v{})", cursor.step, meta.policy_version));
        // The counters go on from the checkpoint's, not from zero.
        metrics.carry_over(&cursor.counters);
        Some((meta.policy_version, cursor))
    } else {
        ractor::call!(learner, LearnerMsg::Configure, rl_learner_config(&recipe))
            .map_err(|e| RunError::Actor { actor: "learner", message: e.to_string() })?
            .map_err(actor_err("learner"))?;
        None
    };

    // The other actors (rollout actors in this process: the plan's, or one when there is no other).
    let remote: RolloutSlots = hosted.as_ref().map(|h| h.rollouts.clone()).unwrap_or_default();
    let local_rollouts = if remote.lock().expect("slots lock").is_empty() { opts.rollout_actors.max(1) } else { opts.rollout_actors };
    let slots: RolloutSlots = Arc::new(Mutex::new(vec![]));
    let actors: Vec<RolloutArgs> = (0..local_rollouts)
        .map(|i| RolloutArgs {
            model_dir: model_dir.clone(),
            tools: recipe.tools.clone(),
            limits,
            config: rollout_cfg.clone(),
            // The cores split evenly, as between rollout processes on one host: a
            // rollout's float results depend on its thread count, so the same
            // split gives the same rollouts in one process or several.
            threads: (cores / local_rollouts.max(1) as i32).max(1),
            panic_on_request: if i == 0 { opts.panic_rollout_on_request } else { None },
            requests: Arc::new(AtomicU64::new(0)),
            metrics: Some((*metrics).clone()),
            label: format!("rollout-{i}"),
        })
        .collect();
    let (supervisor, _) = Actor::spawn(
        None,
        RolloutSupervisor,
        SupervisorArgs { actors, restart_budget: 3, backoff: Duration::from_millis(200), slots: slots.clone(), metrics: metrics.clone() },
    )
    .await
    .map_err(|e| RunError::Setup(format!("rollout actors: {e}")))?;
    let (reward, _) = Actor::spawn(None, RewardActor, reward_spec.clone()).await.map_err(|e| RunError::Setup(format!("reward actor: {e}")))?;
    let (weight_sync, _) = Actor::spawn(None, WeightSync, ()).await.map_err(|e| RunError::Setup(format!("weight-sync actor: {e}")))?;

    let mut driver = Driver {
        learner,
        reward,
        weight_sync,
        slots,
        remote,
        publisher: hosted.as_mut().and_then(|h| h.publisher.take()),
        metrics: metrics.clone(),
        latest: None,
        current: None,
        versions: HashMap::new(),
        next_actor: 0,
        busy: Default::default(),
    };
    let version = resumed.as_ref().map_or(0, |r| r.0);
    driver.publish(version, true).await?;
    let (after_warmup, after_warmup_sampled) = if let Some((_, c)) = &resumed {
        (c.after_warmup.clone(), c.after_warmup_sampled.clone())
    } else {
        let f = figures(&driver.evaluate(&held_out, recipe.seed, true).await?);
        let fs = figures(&driver.evaluate(&held_out, recipe.seed, false).await?);
        progress.line(format!(
            "after warm-up: held-out success {:.3} (sampled {:.3}) final {:.3} unnecessary-tool {:.3} (sampled {:.3})",
            f["trajectory_success"], fs["trajectory_success"], f["final_answer_accuracy"], f["unnecessary_tool_rate"], fs["unnecessary_tool_rate"]
        ));
        (f, fs)
    };

    // RL.
    let start = resumed.as_ref().map(|r| r.1.clone()).unwrap_or_default();
    let (ledger, retry) = open_ledger(&dir, resumed.is_some().then_some(&start), &train, &progress)?;
    if resumed.is_none() {
        let c = Cursor {
            after_warmup: after_warmup.clone(),
            after_warmup_sampled: after_warmup_sampled.clone(),
            groups_trained: Some(0),
            wall_seconds: t0.elapsed().as_secs_f64(),
            counters: metrics.carried(),
            ..Default::default()
        };
        let after = checkpoint(&driver.learner, &dir, version, &c).await?;
        if let (Some(s), false) = (&shared, reused) {
            match warm_start::store(s, &model_dir, &after) {
                Ok(()) => progress.line(format!("warm-up: stored for the runs next to this one in {}", s.display())),
                Err(e) => progress.line(format!("warm-up: could not store it in {} ({e}); later runs warm up again", s.display())),
            }
        }
    }
    let cx = RlContext {
        recipe: &recipe,
        train: &train,
        dir: &dir,
        metrics: &metrics,
        progress: &progress,
        fleet: fleet.as_ref(),
        stopping: &stopping,
        steps,
        after_warmup: &after_warmup,
        after_warmup_sampled: &after_warmup_sampled,
        earlier_seconds: start.wall_seconds,
        t0,
        tools: allowed_tools(&train),
    };
    metrics.zero_tool_series(&cx.tools);
    let mut rl = RlLoop::open(cx, ledger, retry, &start, version, opts.record_batches)?;
    if let Some(f) = &fleet {
        f.rl_started();
    }
    rl.run(&mut driver, &mut status).await?;
    let (step, version) = (rl.step, rl.version);

    // Held-out evaluation with the final policy.
    write_status(&mut status, &dir, "eval", step, version, fleet.as_ref());
    driver.publish(version, true).await?;
    let eval = driver.evaluate(&held_out, recipe.seed + 1, true).await?;
    let f = figures(&eval);
    let f_sampled = figures(&driver.evaluate(&held_out, recipe.seed + 1, false).await?);
    // The final policy's table, written anew (a resumed run does not append a second one).
    let mut eval_log = Jsonl::resume(dir.join("eval_rollouts.jsonl"), 0)?;
    for s in eval.iter().flat_map(|g| &g.scores) {
        eval_log.write(&s.row)?;
    }
    for (k, gauge) in [
        ("trajectory_success", &metrics.trajectory_success),
        ("final_answer_accuracy", &metrics.final_answer_accuracy),
        ("tool_call_rate", &metrics.tool_call_rate),
        ("unnecessary_tool_rate", &metrics.unnecessary_tool_rate),
        ("repeated_call_rate", &metrics.repeated_call_rate),
    ] {
        gauge.with_label_values(&["eval"]).set(f[k].as_f64().unwrap_or(0.0));
    }
    let ckpt = checkpoint(&driver.learner, &dir, version, &rl.cursor_now()).await?;
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"] {
        let src = model_dir.join(f);
        if src.exists() {
            let _ = std::fs::copy(&src, ckpt.join(f));
        }
    }
    let counts = rl.ledger.counts();
    let summary = Summary {
        recipe: recipe.name.clone(),
        eval_tasks: held_out.len(),
        trajectory_success: f["trajectory_success"].as_f64().unwrap_or(0.0),
        final_answer_accuracy: f["final_answer_accuracy"].as_f64().unwrap_or(0.0),
        unnecessary_tool_rate: f["unnecessary_tool_rate"].as_f64().unwrap_or(0.0),
        repeated_call_rate: f["repeated_call_rate"].as_f64().unwrap_or(0.0),
        step_call_accuracy: f["step_call_accuracy"].as_f64().unwrap_or(0.0),
        summary_score: f["summary_score"].as_f64().unwrap_or(0.0),
        tool_call_rate: f["tool_call_rate"].as_f64().unwrap_or(0.0),
        after_warmup: Some(after_warmup.clone()),
        sampled: json!({"temperature": recipe.rl.temperature, "final": f_sampled, "after_warmup": after_warmup_sampled}),
        steps: step,
        groups: json!({"trained": counts.trained, "dropped": counts.dropped, "in_flight": counts.dispatched + counts.scored,
                        "stale": rl.gate.stale, "redispatched": metrics.groups_redispatched_total.get()}),
        actor_restarts: metrics.actor_restarts_total.with_label_values(&["rollout-0"]).get(),
        process_restarts: fleet.as_ref().map(Fleet::restarts).unwrap_or_default(),
        counters: metrics.carried(),
        wall_seconds: rl.wall(),
        metrics_addr: metrics_addr.clone(),
    };
    write_status(&mut status, &dir, "done", step, version, fleet.as_ref());
    let path = dir.join("summary.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary).expect("json")).map_err(io(&path))?;
    progress.line(format!(
        "done: held-out success {:.3} (sampled {:.3}), final answer {:.3}, unnecessary tool {:.3}, repeated {:.3} on {} tasks",
        summary.trajectory_success, f_sampled["trajectory_success"], summary.final_answer_accuracy, summary.unnecessary_tool_rate, summary.repeated_call_rate, summary.eval_tasks
    ));
    driver.learner.stop(None);
    driver.reward.stop(None);
    driver.weight_sync.stop(None);
    supervisor.stop(None);
    if let Some(f) = fleet {
        f.shutdown(Duration::from_secs(10)).await;
    }
    drop(server);
    Ok(summary)
}
