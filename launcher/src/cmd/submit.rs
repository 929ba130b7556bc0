//! `launcher submit TOPOLOGY`: a run as a Slurm batch job.
//!
//! It writes `RUN_DIR/slurm/job.sbatch` (one node per topology node,
//! `--exclusive`, the GPUs per node the topology places, output to
//! `RUN_DIR/slurm/slurm-<job>.out`) whose only command is `launcher up
//! TOPOLOGY --slurm …`, submits it with `sbatch --parsable`, and records the
//! job in `RUN_DIR/slurm/job.json`. `--dry-run` prints the script.
//! `launcher down` of a submitted run signals the batch step (the controller:
//! it checkpoints and stops its steps), waits, then `scancel`s the job.
//! What `up` does inside the allocation is in [`super::slurm`].
use super::slurm::SUBMITTED_ENV;
use crate::cmd::up::UpArgs;
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_actors::controller::recipe::Recipe;
use rlmesh_actors::controller::topology::Topology;
use rlmesh_mesh::launch::{sh_join, sh_quote};
use rlmesh_mesh::slurm;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The folder of a run directory that belongs to its Slurm submission.
pub const SLURM_DIR: &str = "slurm";

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
