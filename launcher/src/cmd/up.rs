//! `launcher up`: start a run on a topology.
//!
//! Every check runs before anything is created, and `--dry-run` runs the same
//! checks: the topology is one this build can start, the recipe's model exists,
//! no live run owns the run directory, a resume has something to resume, and the
//! metrics address is free. A refusal exits 2 and leaves every file as it was.
use crate::repo::models_dir;
use crate::cmd::slurm;
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_actors::controller::memory::{Assumptions, MemoryPlan, ModelShape};
use rlmesh_actors::controller::plan::{plan, Plan};
use rlmesh_actors::controller::recipe::Recipe;
use rlmesh_actors::controller::run::{check_resumable, run, RunError, RunOptions};
use rlmesh_actors::controller::run_dir::RunDirLock;
use rlmesh_actors::controller::topology::{Device, Role, Topology};
use rlmesh_actors::node::chaos::Chaos;
use rlmesh_actors::node::fleet::FleetSpec;
use std::path::{Path, PathBuf};

/// Arguments of `launcher up`.
// The field comments are clap's `--help` text, printed as written: `<recipe>`
// and `[:EVERY_S]` are usage notation there, not HTML or links.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
#[derive(Args)]
pub struct UpArgs {
    /// Topology file (deploy/*.toml).
    pub(crate) deploy: PathBuf,
    /// Recipe file (configs/*.toml).
    #[arg(long, default_value = "configs/calculator-process.toml")]
    pub(crate) recipe: PathBuf,
    /// Run directory (default: runs/<recipe>).
    #[arg(long)]
    pub(crate) run_dir: Option<PathBuf>,
    /// Override the recipe's RL steps.
    #[arg(long)]
    max_steps: Option<u64>,
    /// Override the recipe's seed (model creation, warm-up data, sampling; the task mix keeps its own).
    #[arg(long)]
    seed: Option<u64>,
    /// Override the recipe's SFT warm-up steps.
    #[arg(long)]
    sft_steps: Option<u64>,
    /// Evaluate on at most this many held-out tasks.
    #[arg(long)]
    eval_limit: Option<usize>,
    /// Continue a run from its latest checkpoint.
    #[arg(long)]
    pub(crate) resume: bool,
    /// Print the plan (every process's command and environment) and the resolved recipe; start nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Run every GPU actor of the topology on the CPU instead (`cpu`; e.g. deploy/dev-2gpu.toml on a machine without GPUs).
    #[arg(long, value_parser = ["cpu"])]
    pub(crate) device: Option<String>,
    /// The other processes are started by something else (Kubernetes: `launcher k8s`): wait for them to join, with the cookie from RLMESH_COOKIE(_FILE).
    #[arg(long)]
    pub(crate) external: bool,
    /// Run inside the Slurm allocation this runs in: every other process is a
    /// job step (the default whenever SLURM_JOB_ID is set).
    #[arg(long)]
    pub(crate) slurm: bool,
    /// Serve /metrics here (default: the topology's metrics port on 127.0.0.1).
    #[arg(long)]
    metrics_addr: Option<String>,
    /// Write each RL step's per-token advantages (or StepTool's per-token rewards) to RUN_DIR/batches.jsonl.
    #[arg(long)]
    record_batches: bool,
    /// Fault injection (tests): rollout actor 0 panics on this request number.
    #[arg(long, hide = true)]
    panic_rollout_on_request: Option<u64>,
    /// Kill a ROLE process (rollout, reward or learner) with SIGKILL COUNT
    /// times, at random times about EVERY_S seconds apart (default 20), to
    /// check that a run survives its faults: ROLE:COUNT[:EVERY_S].
    #[arg(long, value_name = "ROLE:COUNT[:EVERY_S]")]
    chaos: Option<String>,
}

impl UpArgs {
    /// The options a submitted job passes on to its `up`, with the paths given.
    pub(crate) fn forwarded(&self, recipe: &Path, run_dir: &Path) -> Vec<String> {
        let mut v = vec!["--recipe".to_string(), recipe.display().to_string(), "--run-dir".into(), run_dir.display().to_string()];
        for (flag, value) in [("--max-steps", self.max_steps.map(|x| x.to_string())), ("--seed", self.seed.map(|x| x.to_string())), ("--sft-steps", self.sft_steps.map(|x| x.to_string())), ("--eval-limit", self.eval_limit.map(|x| x.to_string())), ("--metrics-addr", self.metrics_addr.clone())] {
            if let Some(x) = value {
                v.extend([flag.to_string(), x]);
            }
        }
        if self.resume {
            v.push("--resume".into());
        }
        if self.record_batches {
            v.push("--record-batches".into());
        }
        if let Some(d) = &self.device {
            v.extend(["--device".to_string(), d.clone()]);
        }
        if let Some(c) = &self.chaos {
            v.extend(["--chaos".to_string(), c.clone()]);
        }
        v
    }
}

/// `launcher up`.
pub fn up(a: UpArgs) -> CliResult {
    let topology = Topology::load(&a.deploy).map_err(CliError::usage)?;
    let mut recipe = Recipe::load(&a.recipe).map_err(CliError::usage)?;
    if let Some(seed) = a.seed {
        recipe.seed = seed;
    }
    let topology = if a.device.is_some() { topology.on_cpu() } else { topology };
    let alloc = slurm::allocation(a.slurm, &topology)?;
    if let Some(al) = &alloc {
        slurm::check_on_a_node(al)?;
    }
    let (topology, slurm_nodes) = match &alloc {
        Some(al) => slurm::map_topology(&a.deploy, &topology, al)?,
        None => (topology, Default::default()),
    };
    let mut placement = plan(&topology);
    // The model directory and its config.json first: the memory plan reads it
    // (a plan needs no weights or tokenizer, so those are checked after it).
    check_model_config(&a.recipe, &recipe)?;
    check_memory(&a.deploy, &a.recipe, &recipe, &placement, &topology)?;
    let chaos = a.chaos.as_deref().map(|s| Chaos::parse(s, recipe.seed)).transpose().map_err(|e| CliError::usage(anyhow::anyhow!(e)))?;
    if let Some(c) = &chaos {
        if placement.processes.len() < 2 || !placement.processes.iter().any(|p| p.actors.iter().all(|x| x.role != Role::Controller) && p.actors.iter().any(|x| x.role == c.role)) {
            return Err(CliError::usage(anyhow::anyhow!("--chaos {}: {} places no {} actor in a process of its own (chaos kills processes other than the controller's)", a.chaos.as_deref().unwrap_or(""), a.deploy.display(), c.role)));
        }
    }
    let run_dir = a.run_dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(&recipe.name));
    // The controller's /metrics: on its host's address like every other listener of the run (every interface with `[network] listen_all`).
    let metrics_addr = match &a.metrics_addr {
        Some(m) => m.clone(),
        None => {
            let me = placement.processes.iter().find(|p| p.actors.iter().any(|x| x.role == Role::Controller)).expect("a plan has a controller");
            let ip = rlmesh_actors::node::serve::listen_address(&me.host, placement.listen_all).map_err(|e| CliError::usage(anyhow::anyhow!("{}: {e}", a.deploy.display())))?;
            std::net::SocketAddr::new(ip.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()), me.ports.metrics).to_string()
        }
    };
    if !a.dry_run {
        check_startable(&a.deploy, &topology, &placement)?;
    }
    check_model(&a.recipe, &recipe)?;
    check_run_dir(&run_dir, &recipe, a.resume)?;
    std::net::TcpListener::bind(&metrics_addr).usage(format!("/metrics on {metrics_addr} (--metrics-addr, or {}: ports.metrics)", a.deploy.display()))?;
    let program = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("launcher"));
    let steps = alloc.as_ref().map(|al| slurm::steps(al, &run_dir, slurm_nodes));
    if a.dry_run {
        let argv: Vec<String> = std::env::args().skip(1).filter(|w| w != "--dry-run").collect();
        match &steps {
            Some(s) => slurm::fill_commands(&mut placement, s, &program, &argv),
            None => fill_commands(&mut placement, &topology, &program, &argv),
        }
        println!("{}", placement.table());
        for p in &placement.processes {
            println!("{}  {}", p.name, rlmesh_mesh::launch::sh_join(&p.command));
            let env: Vec<String> = p.env.iter().map(|(k, v)| format!("{k}={}", rlmesh_mesh::launch::sh_quote(v))).collect();
            println!("    env {}", env.join(" "));
        }
        println!("{}", serde_json::to_string_pretty(&recipe)?);
        // The plan is printed for review either way; a topology this build cannot start is still refused.
        return check_startable(&a.deploy, &topology, &placement);
    }
    if placement.processes.len() == 1 {
        wait_passively_if_busy();
    }
    if let Some(s) = &steps {
        let stale = slurm::cancel_stale_steps(s)?;
        if !stale.is_empty() {
            eprintln!("[up] cancelled {} step(s) an earlier start of this run left in Slurm job {}: {}", stale.len(), s.job_id, stale.join(" "));
        }
    }
    // Rollout actors in this process: all of them in a single-process topology.
    let mine = placement.processes.iter().find(|p| p.actors.iter().any(|a| a.role == Role::Controller)).map(|p| p.name.clone());
    let rollout_actors = placement.processes.iter().filter(|p| Some(&p.name) == mine.as_ref()).flat_map(|p| &p.actors).filter(|a| a.role == Role::Rollout).count();
    let fleet = (placement.processes.len() > 1).then(|| FleetSpec {
        plan: placement.clone(),
        ssh: topology.ssh.clone(),
        program,
        // Pods may wait for a node and pull an image first.
        join_timeout: std::time::Duration::from_secs(if a.external { 900 } else { 120 }),
        slurm: steps,
        external: a.external,
        chaos,
    });
    let opts = RunOptions {
        run_dir,
        recipe,
        rollout_actors,
        tokenizer_dir: models_dir()?.join("smollm2-135m"),
        max_steps: a.max_steps,
        sft_steps: a.sft_steps,
        metrics_addr,
        panic_rollout_on_request: a.panic_rollout_on_request,
        progress: true,
        eval_limit: a.eval_limit,
        resume: a.resume,
        fleet,
        record_batches: a.record_batches,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().usage("starting the runtime")?;
    let dir = opts.run_dir.clone();
    let result = rt.block_on(run(opts));
    // Every task and process of the run ends here, before a start again.
    rt.shutdown_timeout(std::time::Duration::from_secs(10));
    let summary = result.map_err(|e| match e {
        RunError::Refused(_) => CliError::usage(e),
        RunError::Stopped(_) => CliError::terminated(e),
        RunError::LearnerLost { why, cause, exited } => start_again(&dir, &why, &cause, exited),
        e => CliError::from(e),
    })?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

/// An embedded run computes on every core it may use, with libgomp's spinning
/// waits: the fastest on an idle machine, 3.5× slower beside a program that
/// keeps one core busy (a passive wait: 1.8×). When other programs keep at
/// least [`rlmesh_mesh::load::BUSY_CORES`] of this process's cores busy, this
/// process starts again (`exec`: same pid) with `OMP_WAIT_POLICY=PASSIVE`,
/// which libgomp reads only when it is loaded. A policy the user set is kept.
/// The load is looked at once, before the run: a program started later
/// finds the run spinning.
fn wait_passively_if_busy() {
    use rlmesh_mesh::load::{busy_cores_elsewhere, BUSY_CORES, PASSIVE_WHY_ENV};
    use std::os::unix::process::CommandExt;
    if std::env::var_os("OMP_WAIT_POLICY").is_some() || std::env::var_os(PASSIVE_WHY_ENV).is_some() {
        return;
    }
    let busy = match busy_cores_elsewhere(std::time::Duration::from_millis(500)) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("[up] the load of this host's cores is unreadable ({e}); OpenMP keeps its spinning waits");
            return;
        }
    };
    if busy < BUSY_CORES {
        return;
    }
    let cores = rlmesh_mesh::load::allowed_cpus().len();
    let why = format!("other programs kept {busy:.1} of this process's {cores} cores busy at start (set OMP_WAIT_POLICY yourself to choose)");
    eprintln!("[up] {why}: starting again with OMP_WAIT_POLICY=PASSIVE, so OpenMP threads sleep between parallel regions instead of spinning");
    let program = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("launcher"));
    let err = std::process::Command::new(&program).args(std::env::args_os().skip(1)).env("OMP_WAIT_POLICY", "PASSIVE").env(PASSIVE_WHY_ENV, &why).exec();
    eprintln!("[up] starting again failed (exec {}: {err}); OpenMP keeps its spinning waits", program.display());
}

/// Starts of a run again after a learner rank was lost, per `launcher up`.
const LEARNER_RESTARTS: u32 = 3;
/// How many starts again came before this one (set on each).
const RESTARTS_ENV: &str = rlmesh_actors::node::LEARNER_RESTARTS_ENV;

/// A learner rank was lost and every process of the run has stopped: this
/// process becomes `launcher up … --resume` (`exec`, so its pid, which
/// `status.json`, `launcher down` and a scheduler know, stays the same), after a
/// back-off, while the budget lasts and a checkpoint exists. A rank that fell
/// silent rather than exited (its host unreachable?) is not started again
/// here: a start would wait for the host. Returns only the error to exit with.
fn start_again(dir: &Path, why: &str, cause: &str, exited: bool) -> CliError {
    use std::os::unix::process::CommandExt;
    let done: u32 = std::env::var(RESTARTS_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let resumable = !rlmesh_actors::learner::list_checkpoints(&dir.join("checkpoints")).is_empty();
    let lost = format!("a learner rank is lost ({why}): {cause}");
    if !resumable || done >= LEARNER_RESTARTS || !exited {
        let why_not = match (resumable, exited) {
            (false, _) => "there is no checkpoint to start again from".to_string(),
            (true, false) => "it fell silent rather than exited (is its host reachable?), so the run is not started again by itself".to_string(),
            (true, true) => format!("the run was started again {done} times already (the budget)"),
        };
        return CliError::from(anyhow::anyhow!("{lost}; {why_not}. `launcher up … --resume --run-dir {}` continues from the newest checkpoint", dir.display()));
    }
    let backoff = std::time::Duration::from_secs(1 << done);
    let line = format!("{lost}; starting the run again from its newest checkpoint (restart {} of {LEARNER_RESTARTS}) in {backoff:?}", done + 1);
    eprintln!("{line}");
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(dir.join("progress.log")) {
        use std::io::Write;
        let _ = writeln!(f, "{line}");
    }
    std::thread::sleep(backoff);
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if !args.iter().any(|a| a == "--resume") {
        args.push("--resume".into());
    }
    let program = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("launcher"));
    let err = std::process::Command::new(&program).args(&args).env(RESTARTS_ENV, (done + 1).to_string()).exec();
    CliError::from(anyhow::anyhow!("{lost}; starting it again failed: exec {}: {err}", program.display()))
}

/// What this build starts: CPU actors anywhere; GPU actors in processes of
/// their own (not the controller's), and on this machine only GPUs that
/// libtorch sees here. The error names the placement at fault.
fn check_startable(deploy: &Path, topology: &Topology, placement: &Plan) -> CliResult {
    let refuse = |field: &str, why: String| Err(CliError::usage(anyhow::anyhow!("{}: field \"{field}\": {why}", deploy.display())));
    let slots = topology.actors();
    let gpu_slots = slots.iter().filter_map(|s| if let Device::Gpu(g) = s.device { Some((s, g)) } else { None });
    let controller_process = placement.processes.iter().find(|p| p.actors.iter().any(|a| a.role == Role::Controller)).map(|p| p.name.clone());
    let mut seen_here: Option<u32> = None;
    for (s, g) in gpu_slots {
        let process = format!("{}/{}", s.node, rlmesh_actors::controller::topology::process_name(s));
        if Some(&process) == controller_process.as_ref() {
            return refuse(&s.field, format!("a GPU actor in the controller's process \"{process}\"; give it a process of its own (drop `process = ...`)"));
        }
        let host = topology.node(&s.node).map_or(s.node.as_str(), |n| n.host.as_str());
        if matches!(rlmesh_mesh::launch::Host::resolve(host, topology.ssh.clone()), rlmesh_mesh::launch::Host::Local) {
            let n = *seen_here.get_or_insert_with(|| tch::Cuda::device_count().max(0) as u32);
            if g >= n {
                return refuse(&s.field, format!("GPU {g} on this machine, but libtorch sees {n} CUDA device(s) here; `--device cpu` runs the topology on the CPU"));
            }
        }
    }
    let controller = placement.processes.iter().find(|p| p.actors.iter().any(|a| a.role == Role::Controller));
    let local_ranks = controller.map_or(0, |p| p.actors.iter().filter(|a| a.role == Role::Learner).count());
    if placement.world_size > 1 && local_ranks > 0 {
        return Err(CliError::usage(anyhow::anyhow!(
            "{}: [learner] ranks = {}: with more than one rank, each rank needs its own process (not the controller's)",
            deploy.display(),
            placement.world_size
        )));
    }
    Ok(())
}

/// Fills every process's `command` outside Slurm: `launcher node` as a local
/// child, or behind `ssh [options] HOST --` for another host.
pub(crate) fn fill_commands(plan: &mut rlmesh_actors::controller::plan::Plan, topology: &Topology, program: &Path, up_argv: &[String]) {
    for p in &mut plan.processes {
        let program = program.display().to_string();
        if p.command.get(1).map(String::as_str) == Some("up") {
            p.command = std::iter::once(program).chain(up_argv.iter().cloned()).collect();
            continue;
        }
        let node = vec![program, "node".to_string()];
        p.command = match rlmesh_mesh::launch::Host::resolve(&p.host, topology.ssh.clone()) {
            rlmesh_mesh::launch::Host::Local => node,
            _ => [topology.ssh.program.clone(), p.host.clone(), "--".into()].into_iter().chain(node).collect(),
        };
    }
}

/// The run's memory plan fits every GPU it uses (`launcher plan --recipe` shows it):
/// a refusal names the process, its device and its largest item.
fn check_memory(deploy: &Path, file: &Path, recipe: &Recipe, placement: &Plan, topology: &Topology) -> CliResult {
    let shape = ModelShape::of_recipe(recipe).map_err(|e| CliError::usage(anyhow::anyhow!("{}: {e}", file.display())))?;
    let memory = MemoryPlan::of(placement, topology, recipe, shape, Assumptions::default());
    memory.check().map_err(|o| {
        CliError::usage(anyhow::anyhow!(
            "{} on {}: the run does not fit its GPUs' memory: {}; see `launcher plan {} --recipe {}` ([learner] shard, dtype, checkpoint_activations, micro_batch_tokens lower it)",
            file.display(),
            deploy.display(),
            MemoryPlan::describe(&o),
            deploy.display(),
            file.display()
        ))
    })
}

/// A recipe's `model.path` other than `"tiny"` is a transformers directory with a tokenizer.
pub(crate) fn check_model(file: &Path, recipe: &Recipe) -> CliResult {
    model_dir_check(file, recipe, true)
}

/// [`check_model`] without the tokenizer: what the memory plan needs.
fn check_model_config(file: &Path, recipe: &Recipe) -> CliResult {
    model_dir_check(file, recipe, false)
}

fn model_dir_check(file: &Path, recipe: &Recipe, tokenizer: bool) -> CliResult {
    if recipe.tiny_model() {
        return Ok(());
    }
    let dir = Path::new(&recipe.model.path);
    let why = if !dir.is_dir() {
        "does not exist (or is not a directory)"
    } else if !dir.join("config.json").is_file() {
        "holds no config.json (not a transformers model directory)"
    } else if tokenizer && !dir.join("tokenizer.json").is_file() {
        "holds no tokenizer.json"
    } else {
        return Ok(());
    };
    Err(CliError::usage(anyhow::anyhow!("{}: field \"model.path\": {} {why}; give an HF model directory or \"tiny\"", file.display(), dir.display())))
}

/// No live run owns `dir`, and a resume has something to resume.
pub(crate) fn check_run_dir(dir: &Path, recipe: &Recipe, resume: bool) -> CliResult {
    if let Some(pid) = RunDirLock::holder(dir).usage(format!("--run-dir {}", dir.display()))? {
        return Err(CliError::usage(anyhow::anyhow!(
            "--run-dir {}: a live run owns this directory (pid {pid}); stop it first (`launcher down --run-dir {}`) or pick another --run-dir",
            dir.display(),
            dir.display()
        )));
    }
    if resume {
        check_resumable(dir, recipe).map_err(CliError::usage)?;
    }
    Ok(())
}

/// Arguments of `launcher node`.
#[derive(Args)]
pub struct NodeArgs {
    /// Take this process's place from a plan (`launcher plan --json`, or the
    /// ConfigMap of `launcher k8s`) instead of the RLMESH_* environment: the
    /// process whose node is --node (default: this host's name, a pod's name).
    #[arg(long)]
    plan: Option<PathBuf>,
    /// The node to take from --plan.
    #[arg(long, requires = "plan")]
    node: Option<String>,
}

/// `launcher node`: one process of a distributed run (started by `up`, or by Kubernetes).
pub fn node(a: NodeArgs) -> CliResult {
    if let Some(path) = &a.plan {
        let text = std::fs::read_to_string(path).usage(format!("--plan {}", path.display()))?;
        let plan: rlmesh_actors::controller::plan::Plan = serde_json::from_str(&text).usage(format!("--plan {}: not a plan", path.display()))?;
        let me = a.node.clone().unwrap_or_else(rlmesh_actors::controller::status::host_name);
        let p = plan.processes.iter().find(|p| p.node == me).ok_or_else(|| {
            CliError::usage(anyhow::anyhow!("--plan {}: no process on node {me:?} (its nodes: {})", path.display(), plan.processes.iter().map(|p| p.node.as_str()).collect::<Vec<_>>().join(", ")))
        })?;
        // Before any thread exists: the runtime is built below.
        for (k, v) in &p.env {
            std::env::set_var(k, v);
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().usage("starting the runtime")?;
    rt.block_on(rlmesh_actors::node::serve::serve()).map_err(|e| CliError::from(anyhow::anyhow!("launcher node: {e}")))
}
