//! Slurm: `launcher submit`, and what `up`, `plan`, `status` and `down` do
//! inside an allocation.
//!
//! - **`launcher submit TOPOLOGY`** writes `RUN_DIR/slurm/job.sbatch` (one node
//!   per topology node, `--exclusive`, the GPUs per node the topology places,
//!   output to `RUN_DIR/slurm/slurm-<job>.out`) whose only command is
//!   `launcher up TOPOLOGY --slurm …`, submits it with `sbatch --parsable`, and
//!   records the job in `RUN_DIR/slurm/job.json`. `--dry-run` prints the script.
//! - **Inside the allocation** (`--slurm`, or `SLURM_JOB_ID` set) the topology's
//!   nodes map onto the allocation's hosts (`scontrol show hostnames`): the
//!   controller's node onto the node `up` runs on, the others in file order.
//!   Every other process starts as a job step of its own (`mesh::slurm`), named
//!   after the run (`rlmesh-<hash of the run directory>`), so a new `up` first
//!   cancels steps an earlier one in the same allocation left behind.
//! - **`launcher down`** of a submitted run signals the batch step (the
//!   controller: it checkpoints and stops its steps), waits, then `scancel`s
//!   the job; a run inside someone else's allocation only loses its own steps.
use crate::cmd::up::UpArgs;
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_actors::controller::plan::Plan;
use rlmesh_actors::controller::recipe::Recipe;
use rlmesh_actors::controller::topology::{Device, Topology};
use rlmesh_actors::node::fleet::SlurmSteps;
use rlmesh_mesh::launch::{sh_join, sh_quote};
use rlmesh_mesh::slurm::{self, Allocation};
use serde::{Deserialize, Serialize};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// The folder of a run directory that belongs to its Slurm submission.
pub const SLURM_DIR: &str = "slurm";
/// Set in the environment of a job `launcher submit` made.
const SUBMITTED_ENV: &str = "RLMESH_SUBMITTED";

/// Arguments of `launcher submit`: those of `up`, and the job's.
#[derive(Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    up: UpArgs,
    /// Slurm partition (`--partition`).
    #[arg(long)]
    partition: Option<String>,
    /// Time limit (`--time`, e.g. `2-00:00:00`).
    #[arg(long)]
    time: Option<String>,
    /// Account to charge (`--account`).
    #[arg(long)]
    account: Option<String>,
}

/// `RUN_DIR/slurm/job.json`: the job `launcher submit` made.
#[derive(Debug, Serialize, Deserialize)]
pub struct Submitted {
    /// The job id.
    pub job_id: String,
    /// The batch script.
    pub script: PathBuf,
    /// Where Slurm writes its output (`%j` filled in).
    pub output: PathBuf,
}

/// The run's step name: stable for a run directory, so a new `up` finds an earlier one's steps.
pub fn step_name(run_dir: &Path) -> String {
    let abs = std::fs::canonicalize(run_dir).unwrap_or_else(|_| std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf()));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    abs.hash(&mut h);
    format!("rlmesh-{:08x}", h.finish() as u32)
}

/// The allocation `up`/`plan` run in: with `--slurm` (an error outside one),
/// or whenever `SLURM_JOB_ID` is set and the topology has more than one
/// process (a one-process run needs no steps, wherever it runs).
pub fn allocation(asked: bool, topology: &Topology) -> CliResult<Option<Allocation>> {
    if !asked && (!Allocation::inside() || rlmesh_actors::controller::plan::plan(topology).processes.len() < 2) {
        return Ok(None);
    }
    Allocation::from_env().map(Some).map_err(CliError::usage)
}

/// `up` runs the controller, so it must run on a node of the allocation
/// (a batch script, or a step), not on a login node holding an `salloc`.
pub fn check_on_a_node(alloc: &Allocation) -> CliResult {
    let me = rlmesh_actors::controller::status::host_name();
    let short = me.split('.').next().unwrap_or(&me).to_string();
    if std::env::var_os("SLURMD_NODENAME").is_some() || alloc.hosts.iter().any(|h| *h == me || *h == short) {
        return Ok(());
    }
    Err(CliError::usage(anyhow::anyhow!(
        "Slurm job {}: this host ({me}) is not one of the allocation's nodes ({}), and the controller must run on one: use `launcher submit`, or `srun --nodes=1 --ntasks=1 --nodelist={} launcher up …`",
        alloc.job_id,
        alloc.hosts.join(","),
        alloc.hosts.first().map_or("NODE", String::as_str)
    )))
}

/// The topology on the allocation's hosts (see [`Topology::on_hosts`]).
pub fn map_topology(deploy: &Path, topology: &Topology, alloc: &Allocation) -> CliResult<Topology> {
    topology.on_hosts(&alloc.hosts, &alloc.this_node).map_err(|e| CliError::usage(anyhow::anyhow!("{}: Slurm job {}: {e}", deploy.display(), alloc.job_id)))
}

/// How the processes start in this allocation.
pub fn steps(alloc: &Allocation, run_dir: &Path) -> SlurmSteps {
    SlurmSteps { job_id: alloc.job_id.clone(), step_name: step_name(run_dir), submitted: std::env::var(SUBMITTED_ENV).is_ok_and(|v| v == "1") }
}

/// Cancels the steps an earlier `up` of this run left in the job.
pub fn cancel_stale_steps(s: &SlurmSteps) -> CliResult<Vec<String>> {
    let stale: Vec<String> = slurm::steps(&s.job_id).usage("listing the job's steps")?.into_iter().filter(|(_, n)| *n == s.step_name).map(|(i, _)| i).collect();
    slurm::cancel(&stale, None).usage("cancelling stale steps")?;
    Ok(stale)
}

/// Fills every process's `command` with what will run it: `srun … launcher
/// node` for a step, `launcher up …` for the controller's own process.
pub fn fill_commands(plan: &mut Plan, s: &SlurmSteps, program: &Path, up_argv: &[String]) {
    for p in &mut plan.processes {
        let program = program.display().to_string();
        if p.command.get(1).map(String::as_str) == Some("up") {
            p.command = std::iter::once(program).chain(up_argv.iter().cloned()).collect();
            continue;
        }
        let gpus = p.actors.iter().filter(|a| matches!(a.device, Device::Gpu(_))).count() as u32;
        let srun = slurm::SrunConfig { program: "srun".into(), job_id: s.job_id.clone(), node: p.host.clone(), step_name: s.step_name.clone(), gpus, extra: vec![] };
        p.command = srun.command_line(&[&program, "node"]);
    }
}

/// The batch script of a run.
fn script(a: &SubmitArgs, topology: &Topology, run_dir: &Path) -> CliResult<String> {
    let abs = |p: &Path, what: &str| std::fs::canonicalize(p).usage(format!("{what} {}", p.display()));
    let program = std::env::current_exe().usage("finding the launcher binary")?;
    let cwd = std::env::current_dir().usage("the working directory")?;
    let run_dir = std::path::absolute(run_dir).usage("--run-dir")?;
    let gpus = topology.nodes.iter().map(|n| n.gpus).max().unwrap_or(0);
    let mut s = String::from("#!/bin/bash\n");
    s.push_str(&format!("# Written by `launcher submit` for the run in {}.\n", run_dir.display()));
    s.push_str("# Its one command is `launcher up --slurm`: every other process of the plan starts as a job step.\n");
    let mut sb = |k: &str, v: &str| s.push_str(&format!("#SBATCH --{k}={v}\n"));
    sb("job-name", &format!("rlmesh-{}", topology.name));
    sb("nodes", &topology.nodes.len().to_string());
    sb("ntasks-per-node", "1");
    if gpus > 0 {
        sb("gpus-per-node", &gpus.to_string());
    }
    sb("output", &run_dir.join(SLURM_DIR).join("slurm-%j.out").display().to_string());
    sb("open-mode", "append");
    for (k, v) in [("partition", &a.partition), ("time", &a.time), ("account", &a.account)] {
        if let Some(v) = v {
            sb(k, v);
        }
    }
    s.push_str("#SBATCH --exclusive\n");
    s.push_str("set -euo pipefail\n");
    s.push_str(&format!("export {SUBMITTED_ENV}=1\n"));
    s.push_str(&format!("cd {}\n", sh_quote(&cwd.display().to_string())));
    let mut argv = vec![program.display().to_string(), "up".into(), abs(&a.up.deploy, "topology")?.display().to_string(), "--slurm".into()];
    argv.extend(a.up.forwarded(&abs(&a.up.recipe, "recipe")?, &run_dir));
    s.push_str(&format!("exec {}\n", sh_join(&argv)));
    Ok(s)
}

/// `launcher submit`.
pub fn submit(a: SubmitArgs) -> CliResult {
    let topology = Topology::load(&a.up.deploy).map_err(CliError::usage)?;
    let recipe = Recipe::load(&a.up.recipe).map_err(CliError::usage)?;
    let run_dir = a.up.run_dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(&recipe.name));
    crate::cmd::up::check_model(&a.up.recipe, &recipe)?;
    crate::cmd::up::check_run_dir(&run_dir, &recipe, a.up.resume)?;
    check_fresh(&run_dir, a.up.resume)?;
    let text = script(&a, &topology, &run_dir)?;
    if a.up.dry_run {
        print!("{text}");
        return Ok(());
    }
    let dir = run_dir.join(SLURM_DIR);
    std::fs::create_dir_all(&dir).usage(format!("creating {}", dir.display()))?;
    let path = std::path::absolute(dir.join("job.sbatch")).usage("the script's path")?;
    std::fs::write(&path, &text).usage(format!("writing {}", path.display()))?;
    let out = slurm::client("sbatch", &["--parsable", &path.display().to_string()]).usage("submitting the job")?;
    let job_id = out.trim().split(';').next().unwrap_or("").to_string();
    if job_id.is_empty() {
        return Err(CliError::from(anyhow::anyhow!("sbatch printed no job id: {out:?}")));
    }
    let output = std::path::absolute(dir.join(format!("slurm-{job_id}.out"))).unwrap_or_default();
    let rec = Submitted { job_id: job_id.clone(), script: path, output };
    std::fs::write(dir.join("job.json"), serde_json::to_string_pretty(&rec)?).usage("writing job.json")?;
    eprintln!("submitted Slurm job {job_id}: its output goes to {}; `launcher status --run-dir {}` follows it, `launcher down --run-dir {}` ends it", rec.output.display(), run_dir.display(), run_dir.display());
    println!("{}", serde_json::to_string_pretty(&serde_json::json!({"job_id": job_id, "script": rec.script, "output": rec.output, "run_dir": run_dir}))?);
    Ok(())
}

/// A submission starts a run of its own: the directory holds nothing but an
/// earlier submission's folder (unless `--resume`), and no job of it is still queued.
fn check_fresh(run_dir: &Path, resume: bool) -> CliResult {
    if let Some(job) = submitted(run_dir) {
        if let Ok(Some(state)) = slurm::job_state(&job.job_id) {
            return Err(CliError::usage(anyhow::anyhow!("--run-dir {}: Slurm job {} of this run is {state}; `launcher down --run-dir {}` ends it", run_dir.display(), job.job_id, run_dir.display())));
        }
    }
    let occupied = std::fs::read_dir(run_dir).map(|d| d.flatten().any(|e| e.file_name() != SLURM_DIR && e.file_name() != rlmesh_actors::controller::run_dir::LOCK_FILE)).unwrap_or(false);
    if occupied && !resume {
        return Err(CliError::usage(anyhow::anyhow!(
            "--run-dir {}: holds an earlier run; continue it with --resume, or pick another --run-dir",
            run_dir.display()
        )));
    }
    Ok(())
}

/// The submission recorded in `RUN_DIR/slurm/job.json`, if any.
pub fn submitted(run_dir: &Path) -> Option<Submitted> {
    serde_json::from_str(&std::fs::read_to_string(run_dir.join(SLURM_DIR).join("job.json")).ok()?).ok()
}

/// `launcher down` of a run in a Slurm job this run owns: TERM to the batch
/// step (the controller checkpoints and ends its steps), then `scancel` of
/// whatever is left once `wait` has passed.
pub fn down_job(job_id: &str, shown: &str, wait: std::time::Duration) -> CliResult {
    match slurm::job_state(job_id).usage("asking Slurm")? {
        None => {
            println!("run {shown}: Slurm job {job_id} has ended; nothing to stop");
            return Ok(());
        }
        Some(s) if s == "PENDING" => {
            slurm::cancel(&[job_id.to_string()], None).usage("scancel")?;
            println!("run {shown}: Slurm job {job_id} was pending; cancelled");
            return Ok(());
        }
        Some(_) => {}
    }
    slurm::client("scancel", &["--batch", "--signal=TERM", job_id]).usage("scancel --batch --signal=TERM")?;
    println!("sent SIGTERM to the batch step of Slurm job {job_id} (run {shown}: its controller); waiting up to {} s for it to checkpoint and exit", wait.as_secs());
    let t0 = std::time::Instant::now();
    while t0.elapsed() < wait {
        if slurm::job_state(job_id).usage("asking Slurm")?.is_none_or(|s| s == "COMPLETING" || s == "COMPLETED") {
            println!("stopped after {:.1} s", t0.elapsed().as_secs_f64());
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    slurm::cancel(&[job_id.to_string()], None).usage("scancel")?;
    println!("Slurm job {job_id} was still running {} s after SIGTERM: cancelled (`scancel {job_id}`)", wait.as_secs());
    Ok(())
}
