//! A run's set-up, before its warm-up: what it is asked ([`RunOptions`]), the
//! run directory, `/metrics` and the other processes ([`Opened`]), the policy
//! and its tasks ([`Policy`]), and the roles' settings, with the actors that
//! play them ([`Roles`]).
use super::driver::Driver;
use super::error::{io, RunError};
use super::init::{build_task_tokenizer, create_tiny_model, InitError};
use super::journal::write_status;
use super::progress::Progress;
use super::recipe::{EstimatorKind, Recipe};
use super::run_dir::{claim_run_dir, RunDirLock};
use super::status::{RunStatus, SlurmJob};
use super::topology::Role;
use super::supervisor::{RolloutSlots, RolloutSupervisor, SupervisorArgs};
use super::warm_start;
use crate::learner::actor::{LearnerActor, LearnerArgs, LearnerMsg};
use crate::learner::{SftSequence, AdamWConfig, ClipParams, GaeConfig, KlCoef, KlConfig, KlEstimator, KlPlacement, LearnerConfig, LrSchedule, ValueConfig};
use crate::metrics::{serve, Metrics, MetricsServer};
use crate::node::fleet::{Fleet, FleetSpec, Hosted, RoleSetup};
use crate::node::link::{LearnerLoss, Say};
use crate::node::wire::RolloutSetup;
use crate::reward::{RewardActor, RewardSpec};
use crate::rollout::actor::RolloutArgs;
use crate::rollout::RolloutConfig;
use crate::weight_sync::WeightSync;
use ractor::{Actor, ActorRef};
use crate::rollout::tools::open_tools;
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_core::Task;
use rlmesh_model::{SamplingParams, Tokenizer};
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// A run that has its directory, `/metrics` and its other processes: what
/// [`Opened::open`] creates once every check has passed. Dropped on an error,
/// it stops the other processes and releases the directory.
pub(super) struct Opened {
    pub(super) metrics: Arc<Metrics>,
    pub(super) metrics_addr: String,
    /// The processes other than this one.
    pub(super) fleet: Option<Fleet>,
    /// `status.json`'s content.
    pub(super) status: RunStatus,
    server: MetricsServer,
    /// The run directory is ours while this lives.
    _lock: RunDirLock,
}

impl Opened {
    /// Serves `/metrics`, claims the run directory, starts the other processes
    /// (they start while this one makes the model), writes `config.json` and
    /// Prometheus' discovery files.
    pub(super) async fn open(opts: &RunOptions, learner_loss: LearnerLoss, progress: &Progress) -> Result<Opened, RunError> {
        let (dir, recipe) = (&opts.run_dir, &opts.recipe);
        let metrics = Arc::new(Metrics::new());
        let server = serve(&metrics, opts.metrics_addr.as_str())
            .map_err(|e| RunError::Refused(format!("/metrics on {} (--metrics-addr, or the topology's ports.metrics): {e}", opts.metrics_addr)))?;
        let metrics_addr = server.local_addr().to_string();
        let (lock, previous) = claim_run_dir(dir, opts.resume)?;
        progress.attach_log(dir);
        progress.line(format!("run {} → {} (metrics at http://{metrics_addr}/metrics)", recipe.name, dir.display()));
        if let Ok(why) = std::env::var(rlmesh_mesh::load::PASSIVE_WHY_ENV) {
            progress.line(format!("OpenMP threads wait passively (OMP_WAIT_POLICY=PASSIVE): {why}"));
        }
        let fleet = match &opts.fleet {
            Some(spec) => Some(Fleet::launch(spec, dir, metrics.clone(), learner_loss, &|l| progress.line(l)).await.map_err(RunError::Setup)?),
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
        status.slurm = opts.fleet.as_ref().and_then(|f| f.slurm.as_ref()).map(|s| SlurmJob { job_id: s.job_id.clone(), submitted: s.submitted, step_name: s.step_name.clone() });
        let cfg_path = dir.join("config.json");
        std::fs::write(&cfg_path, serde_json::to_string_pretty(&json!({"recipe": recipe, "rollout_actors": opts.rollout_actors})).expect("json"))
            .map_err(io(&cfg_path))?;
        if let Some(p) = previous {
            progress.line(format!("the run that was in {} is kept in {}", dir.display(), p.display()));
        }
        write_discovery(dir, fleet.as_ref().map(Fleet::plan), &metrics_addr, progress);
        Ok(Opened { metrics, metrics_addr, fleet, status, server, _lock: lock })
    }

    /// Writes `status.json` at `phase`, `step`, `version`.
    pub(super) fn status_at(&mut self, dir: &Path, phase: &str, step: u64, version: u64) {
        write_status(&mut self.status, dir, phase, step, version, self.fleet.as_ref());
    }

    /// Stops the other processes (each given 10 s to leave) and `/metrics`; the directory is released last.
    pub(super) async fn close(self) {
        if let Some(f) = self.fleet {
            f.shutdown(Duration::from_secs(10)).await;
        }
        drop(self.server);
    }
}

/// What the user brings, loaded and started before anything is created: a
/// bad file or a tool server that does not start is refused (exit 2) with
/// no run directory written.
pub(super) struct UserWork {
    limits: ExecLimits,
    train: Vec<Task>,
    held_out: Vec<Task>,
    tools: crate::rollout::tools::Tools,
    sft_conversations: Vec<rlmesh_core::dataset::Conversation>,
}

impl UserWork {
    /// Loads the tasks and the warm-up's file, starts the tool servers and checks every task against the tools.
    pub(super) fn load(recipe: &Recipe, progress: &Progress) -> Result<UserWork, RunError> {
        let refused = |e: String| RunError::Refused(e);
        let limits = recipe.tool_limits.exec();
        let (train, held_out) = recipe.tasks().map_err(|e| refused(e.to_string()))?;
        let sft_conversations = match (&recipe.sft.file, recipe.sft.steps) {
            (Some(f), 1..) => rlmesh_core::dataset::load_sft_file(Path::new(f)).map_err(|e| refused(e.to_string()))?,
            _ => vec![],
        };
        if !recipe.tool_servers.is_empty() {
            progress.line(format!("tools: starting {} tool server(s)", recipe.tool_servers.len()));
        }
        let tools = open_tools(&recipe.tools, &recipe.tool_servers, limits, recipe.model.tool_format).map_err(refused)?;
        for t in train.iter().chain(&held_out) {
            tools.registry.check_task(t).map_err(|e| refused(e.to_string()))?;
        }
        Ok(UserWork { limits, train, held_out, tools, sft_conversations })
    }
}

/// The policy's starting point and the tasks it meets.
pub(super) struct Policy {
    pub(super) registry: ToolRegistry,
    /// The controller's own tool servers (for the warm-up and prompts), alive with it.
    pub(super) _servers: Vec<std::sync::Arc<rlmesh_mcp::McpServer>>,
    pub(super) limits: ExecLimits,
    pub(super) train: Vec<Task>,
    pub(super) held_out: Vec<Task>,
    /// The warm-up's own task pool (empty without a warm-up).
    pub(super) sft_tasks: Vec<Task>,
    /// `[sft] file`'s conversations, laid out for training (assistant tokens only).
    pub(super) sft_file: Vec<SftSequence>,
    /// The initial weights, config and tokenizer (after a shared warm-up, its result).
    pub(super) model_dir: PathBuf,
    pub(super) tokenizer: Tokenizer,
    /// Cores this process may use.
    pub(super) cores: i32,
    /// The shared warm-up's directory, when the recipe shares it.
    pub(super) shared: Option<PathBuf>,
    /// The shared warm-up was stored already and has been restored: no warm-up to run.
    pub(super) reused: bool,
}

impl Policy {
    /// The tools, the task sets and the initial model (created, restored from a shared warm-up, or the recipe's).
    pub(super) fn load(opts: &RunOptions, work: UserWork, progress: &Progress) -> Result<Policy, RunError> {
        let (dir, recipe) = (&opts.run_dir, &opts.recipe);
        let setup = |e: String| RunError::Setup(e);
        let UserWork { limits, train, mut held_out, tools, sft_conversations } = work;
        let registry = tools.registry;
        let sft_tasks = if recipe.sft.steps > 0 && recipe.sft.file.is_none() { recipe.sft_tasks(&held_out).map_err(|e| setup(e.to_string()))? } else { vec![] };
        let model_dir = policy_dir(recipe, dir, opts.resume, &opts.tokenizer_dir, &train, &sft_tasks, &registry)?;
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2) as i32;
        // A warm-up shared with the runs next to this one: restored when stored, else stored after it.
        let shared = (recipe.sft.share && !opts.resume && opts.sft_steps.is_none() && recipe.tiny_model() && recipe.sft.steps > 0)
            .then(|| warm_start::shared_dir(recipe, dir, cores, learner_ranks(opts)));
        let reused = shared.as_ref().is_some_and(|s| warm_start::is_stored(s));
        if let (Some(s), true) = (&shared, reused) {
            warm_start::restore(s, &model_dir).map_err(|e| setup(format!("restoring the shared warm-up {}: {e}", s.display())))?;
            progress.line(format!("warm-up: starting from the shared warm-up in {}", s.display()));
        }
        let tokenizer = Tokenizer::load(&model_dir).map_err(|e| setup(e.to_string()))?;
        if !recipe.tools.is_empty() || !recipe.tool_servers.is_empty() {
            super::init::check_tool_template(&tokenizer, recipe.model.tool_format).map_err(|e| RunError::Refused(format!("{}: {e}", model_dir.display())))?;
        }
        if let Some(n) = opts.eval_limit {
            held_out.truncate(n);
        }
        let sft_file = sft_sequences(&sft_conversations, &tokenizer, &registry, recipe.sft.file.as_deref().unwrap_or_default())?;
        Ok(Policy { registry, _servers: tools.servers, limits, train, held_out, sft_tasks, sft_file, model_dir, tokenizer, cores, shared, reused })
    }
}

/// A warm-up file's conversations as training sequences: each rendered with
/// its own `tools`, or the run's; an error names the file and the conversation.
fn sft_sequences(convs: &[rlmesh_core::dataset::Conversation], tokenizer: &Tokenizer, registry: &ToolRegistry, file: &str) -> Result<Vec<SftSequence>, RunError> {
    let run_tools: Vec<serde_json::Value> = registry.session(&Task::default()).map(|s| s.schemas()).unwrap_or_default();
    convs
        .iter()
        .map(|c| {
            let tools = if c.tools.is_empty() { &run_tools } else { &c.tools };
            let tools = (!tools.is_empty()).then_some(tools.as_slice());
            let (token_ids, loss_mask) = crate::warmup::training_tokens(tokenizer, &c.messages, tools)
                .map_err(|e| RunError::Refused(format!("{file}: conversation {}: {e}", c.id)))?;
            if !loss_mask.contains(&1) {
                return Err(RunError::Refused(format!("{file}: conversation {}: no assistant message to train on", c.id)));
            }
            Ok(SftSequence { token_ids, loss_mask })
        })
        .collect()
}

/// The settings of the roles: the learner (for the warm-up; the RL phase's
/// come from [`rl_learner_config`]), the rollouts and the reward.
pub(super) struct Roles {
    pub(super) sft: LearnerConfig,
    pub(super) rollout: RolloutConfig,
    pub(super) reward: RewardSpec,
}

impl Roles {
    /// The roles' settings for `recipe`, with a warm-up of `sft_steps`.
    pub(super) fn of(recipe: &Recipe, tokenizer_dir: &Path, sft_steps: u64) -> Roles {
        let sft = LearnerConfig {
            optim: AdamWConfig { lr: recipe.sft.lr, weight_decay: recipe.sft.weight_decay, beta2: recipe.sft.beta2, ..Default::default() },
            warmup_steps: recipe.sft.lr_warmup,
            schedule: LrSchedule::Cosine { total_steps: sft_steps.max(1) },
            micro_batch_size: recipe.sft.micro_batch_size.min(recipe.sft.batch_size),
            seed: recipe.seed,
            value: value_head(recipe),
            shard: recipe.learner.shard,
            dtype: recipe.learner.dtype,
            checkpoint_activations: recipe.learner.checkpoint_activations,
            ..Default::default()
        };
        let rollout = RolloutConfig {
            group_size: recipe.rl.group_size,
            max_turns: recipe.rl.max_turns,
            max_tokens: recipe.rl.max_new_tokens * recipe.rl.max_turns + 256,
            sampling: SamplingParams { max_new_tokens: recipe.rl.max_new_tokens, temperature: recipe.rl.temperature, ..Default::default() },
            system_prompt: None,
            tool_format: recipe.model.tool_format,
            keep_kv: true,
            agent: recipe.agent.clone(),
        };
        let reward = RewardSpec::of(recipe, tokenizer_dir);
        Roles { sft, rollout, reward }
    }

    /// The learner: the fleet's ranks when they run elsewhere (the fleet then
    /// hosts its rollout processes too), else an actor in this process.
    pub(super) async fn start_learner(&self, fleet: Option<&Fleet>, policy: &Policy, recipe: &Recipe, metrics: &Arc<Metrics>, progress: &Arc<Progress>) -> Result<(Option<Hosted>, ActorRef<LearnerMsg>), RunError> {
        let hosted = match fleet {
            Some(f) => {
                let roles = RoleSetup {
                    model_dir: policy.model_dir.clone(),
                    rollout: RolloutSetup { tools: recipe.tools.clone(), servers: recipe.tool_servers.clone(), limits: policy.limits, config: self.rollout.clone(), cuda: None },
                    reward: self.reward.clone(),
                    learner: self.sft.clone(),
                };
                let say: Say = {
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
                let args = LearnerArgs { model_dir: policy.model_dir.clone(), config: self.sft.clone(), threads: policy.cores, ring: None, device: tch::Device::Cpu, abort_ring_before_step: None };
                Actor::spawn(None, LearnerActor, args).await.map_err(|e| RunError::Setup(format!("learner: {e}")))?.0
            }
        };
        Ok((hosted, learner))
    }

    /// The other actors, and the driver over them all: rollout actors in this
    /// process (`opts.rollout_actors`, or one when no other process has any)
    /// under a supervisor, the reward and the weight-sync actor.
    pub(super) async fn spawn_actors(&self, learner: ActorRef<LearnerMsg>, hosted: Option<&mut Hosted>, policy: &Policy, opts: &RunOptions, metrics: &Arc<Metrics>) -> Result<Driver, RunError> {
        let remote: RolloutSlots = hosted.as_ref().map(|h| h.rollouts.clone()).unwrap_or_default();
        let local_rollouts = if remote.lock().expect("slots lock").is_empty() { opts.rollout_actors.max(1) } else { opts.rollout_actors };
        let slots: RolloutSlots = Arc::new(Mutex::new(vec![]));
        let actors: Vec<RolloutArgs> = (0..local_rollouts)
            .map(|i| RolloutArgs {
                model_dir: policy.model_dir.clone(),
                tools: opts.recipe.tools.clone(),
                servers: opts.recipe.tool_servers.clone(),
                limits: policy.limits,
                config: self.rollout.clone(),
                // The cores split evenly, as between rollout processes on one host: a
                // rollout's float results depend on its thread count, so the same
                // split gives the same rollouts in one process or several.
                threads: (policy.cores / local_rollouts.max(1) as i32).max(1),
                device: tch::Device::Cpu,
                panic_on_request: if i == 0 { opts.panic_rollout_on_request } else { None },
                requests: Arc::new(AtomicU64::new(0)),
                metrics: Some((**metrics).clone()),
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
        let (reward, _) = Actor::spawn(None, RewardActor, self.reward.clone()).await.map_err(|e| RunError::Setup(format!("reward actor: {e}")))?;
        let (weight_sync, _) = Actor::spawn(None, WeightSync, ()).await.map_err(|e| RunError::Setup(format!("weight-sync actor: {e}")))?;
        Ok(Driver {
            learner,
            reward,
            weight_sync,
            supervisor: supervisor.get_cell(),
            slots,
            remote,
            publisher: hosted.and_then(|h| h.publisher.take()),
            metrics: metrics.clone(),
            latest: None,
            current: None,
            versions: HashMap::new(),
            next_actor: 0,
            busy: Default::default(),
        })
    }
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

/// The learner's settings for the RL phase.
pub(super) fn rl_learner_config(recipe: &Recipe) -> LearnerConfig {
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
        pack: recipe.learner.pack,
        shared_prefix: recipe.learner.shared_prefix,
        micro_batch_tokens: recipe.learner.micro_batch_tokens,
        shard: recipe.learner.shard,
        dtype: recipe.learner.dtype,
        checkpoint_activations: recipe.learner.checkpoint_activations,
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


/// Data-parallel learner ranks of the run: one in a single process.
fn learner_ranks(opts: &RunOptions) -> usize {
    opts.fleet.as_ref().map_or(1, |f| f.plan.processes_with(Role::Learner).count().max(1))
}

/// Train tasks whose renderings teach the tiny model's tokenizer when every
/// tool session starts a server process.
const TOKENIZER_TASKS_WITH_SERVER_PROCESSES: usize = 24;

/// The policy's initial model directory: a created tiny model (with its task
/// tokenizer, learned here) in `RUN_DIR/initial-model`, the one a resumed run
/// created, or the recipe's transformers directory.
fn policy_dir(recipe: &Recipe, dir: &Path, resume: bool, tokenizer_dir: &Path, train: &[Task], sft_tasks: &[Task], registry: &ToolRegistry) -> Result<PathBuf, RunError> {
    let d = dir.join("initial-model");
    if !recipe.tiny_model() {
        return match &recipe.model.chat_template {
            Some(t) => super::init::with_chat_template(Path::new(&recipe.model.path), Path::new(t), &d)
                .map_err(|e| RunError::Refused(format!("model.chat_template: {e}"))),
            None => Ok(PathBuf::from(&recipe.model.path)),
        };
    }
    if resume {
        return Ok(d);
    }
    let setup = |e: InitError| RunError::Setup(e.to_string());
    let tokenizer_dir = if recipe.model.tokenizer == "task" {
        // Each task's expert renderings open its tool sessions; with a tool
        // server per session that is a process start per rendering (about 400
        // for 200 tasks: 10 minutes on 2 cores), so such runs learn the
        // tokenizer from a sample of the tasks.
        let mut corpus: Vec<Task> = train.iter().chain(sft_tasks.iter().take(1024)).cloned().collect();
        if registry.sessions_start_processes() {
            corpus.truncate(TOKENIZER_TASKS_WITH_SERVER_PROCESSES);
        }
        build_task_tokenizer(&d, &corpus, registry, recipe.model.vocab_size, recipe.model.number_chunk).map_err(setup)?;
        d.clone()
    } else {
        tokenizer_dir.to_path_buf()
    };
    create_tiny_model(&d, &tokenizer_dir, recipe.tiny_spec(), recipe.seed).map_err(setup)
}

