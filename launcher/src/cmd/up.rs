//! `launcher up`: start a run on a topology.
use crate::cmd::bench::models_dir;
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_actors::controller::plan::plan;
use rlmesh_actors::controller::recipe::Recipe;
use rlmesh_actors::controller::run::{run, RunOptions};
use rlmesh_actors::controller::topology::{Role, Topology};
use std::path::PathBuf;

/// Arguments of `launcher up`.
#[derive(Args)]
pub struct UpArgs {
    /// Topology file (deploy/*.toml).
    deploy: PathBuf,
    /// Recipe file (configs/*.toml).
    #[arg(long, default_value = "configs/calculator-process.toml")]
    recipe: PathBuf,
    /// Run directory (default: runs/<recipe>).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// Override the recipe's RL steps.
    #[arg(long)]
    max_steps: Option<u64>,
    /// Override the recipe's SFT warm-up steps.
    #[arg(long)]
    sft_steps: Option<u64>,
    /// Evaluate on at most this many held-out tasks.
    #[arg(long)]
    eval_limit: Option<usize>,
    /// Continue a run from its latest checkpoint.
    #[arg(long)]
    resume: bool,
    /// Print the plan and the resolved recipe; start nothing.
    #[arg(long)]
    dry_run: bool,
    /// Serve /metrics here (default: the topology's metrics port on 127.0.0.1).
    #[arg(long)]
    metrics_addr: Option<String>,
    /// Fault injection (tests): rollout actor 0 panics on this request number.
    #[arg(long, hide = true)]
    panic_rollout_on_request: Option<u64>,
}

/// `launcher up`.
pub fn up(a: UpArgs) -> CliResult {
    let topology = Topology::load(&a.deploy).map_err(CliError::usage)?;
    let recipe = Recipe::load(&a.recipe).map_err(CliError::usage)?;
    let placement = plan(&topology);
    if a.dry_run {
        println!("{}", placement.table());
        println!("{}", serde_json::to_string_pretty(&recipe)?);
        return Ok(());
    }
    let gpus: usize = placement.processes.iter().flat_map(|p| &p.actors).filter(|a| matches!(a.device, rlmesh_actors::controller::topology::Device::Gpu(_))).count();
    if placement.processes.len() > 1 || gpus > 0 {
        return Err(CliError::usage(anyhow::anyhow!(
            "{}: {} processes, {} GPU actors — this build starts single-process CPU topologies only (see `launcher plan {}`)",
            a.deploy.display(),
            placement.processes.len(),
            gpus,
            a.deploy.display()
        )));
    }
    let rollout_actors = placement.processes.iter().flat_map(|p| &p.actors).filter(|a| a.role == Role::Rollout).count();
    let run_dir = a.run_dir.unwrap_or_else(|| PathBuf::from("runs").join(&recipe.name));
    let metrics_addr = a.metrics_addr.unwrap_or_else(|| format!("127.0.0.1:{}", topology.ports.metrics));
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
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().usage("starting the runtime")?;
    let summary = rt.block_on(run(opts))?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}
