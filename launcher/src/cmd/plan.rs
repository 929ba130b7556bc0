//! `launcher plan`: the placement of a topology file, as a table or JSON; with
//! `--recipe`, also the bytes each process will hold on its device
//! ([`rlmesh_actors::controller::memory`]).
use crate::error::{CliError, CliResult};
use clap::Args;
use rlmesh_actors::controller::memory::{Assumptions, MemoryPlan, ModelShape};
use rlmesh_actors::controller::plan::Plan;
use rlmesh_actors::controller::recipe::Recipe;
use rlmesh_actors::controller::{plan::plan, topology::Topology};
use std::path::{Path, PathBuf};

/// Arguments of `launcher plan`.
#[derive(Args)]
pub struct PlanArgs {
    /// Topology file (e.g. deploy/local.toml).
    deploy: PathBuf,
    /// Print the plan as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Plan every GPU actor on the CPU instead, as `up --device cpu` runs it.
    #[arg(long, value_parser = ["cpu"])]
    device: Option<String>,
    /// The run directory `up` would use (inside Slurm it names the run's job steps).
    #[arg(long, default_value = "runs/run")]
    run_dir: PathBuf,
    /// Also plan each process's device memory for this recipe (configs/*.toml);
    /// its model is read from config.json (no weights needed).
    #[arg(long)]
    recipe: Option<PathBuf>,
    /// Tokens assumed for a task's prompt (system prompt, tool schemas, task) in the memory plan.
    #[arg(long, default_value_t = Assumptions::default().prompt_tokens)]
    prompt_tokens: u64,
}

/// `launcher plan`.
pub fn run(a: PlanArgs) -> CliResult {
    let topology = Topology::load(&a.deploy).map_err(CliError::usage)?;
    // Inside a Slurm allocation, the nodes are the allocation's hosts.
    let topology = if a.device.is_some() { topology.on_cpu() } else { topology };
    let alloc = crate::cmd::slurm::allocation(false, &topology)?;
    let (topology, slurm_nodes) = match &alloc {
        Some(al) => crate::cmd::slurm::map_topology(&a.deploy, &topology, al)?,
        None => (topology, Default::default()),
    };
    let mut plan = plan(&topology);
    let program = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("launcher"));
    let up = vec!["up".to_string(), a.deploy.display().to_string()];
    match &alloc {
        Some(al) => crate::cmd::slurm::fill_commands(&mut plan, &crate::cmd::slurm::steps(al, &a.run_dir, slurm_nodes), &program, &up),
        None => crate::cmd::up::fill_commands(&mut plan, &topology, &program, &up),
    }
    let memory = match &a.recipe {
        Some(r) => Some(memory_plan(r, &plan, &topology, Assumptions { prompt_tokens: a.prompt_tokens })?),
        None => None,
    };
    match (a.json, &memory) {
        (true, None) => println!("{}", serde_json::to_string_pretty(&plan)?),
        (true, Some(m)) => println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "plan": plan, "memory": m }))?),
        (false, _) => {
            print!("{}", plan.table());
            if let Some(m) = &memory {
                print!("\n{}", m.table());
                match m.check() {
                    Ok(()) => println!("fits: every GPU holds its processes{}", unknown(m)),
                    Err(o) => println!("does not fit: {}", MemoryPlan::describe(&o)),
                }
            }
        }
    }
    Ok(())
}

/// The memory plan of the recipe at `path` on a placement; a bad recipe or model is a usage error.
pub(crate) fn memory_plan(path: &Path, plan: &Plan, topology: &Topology, assumptions: Assumptions) -> CliResult<MemoryPlan> {
    let recipe = Recipe::load(path).map_err(CliError::usage)?;
    let shape = ModelShape::of_recipe(&recipe).map_err(|e| CliError::usage(anyhow::anyhow!("{}: {e}", path.display())))?;
    Ok(MemoryPlan::of(plan, topology, &recipe, shape, assumptions))
}

/// A note on the GPUs whose memory the plan could not check.
pub(crate) fn unknown(m: &MemoryPlan) -> String {
    match m.unknown_gpus() {
        v if v.is_empty() => String::new(),
        v => format!(" (not checked: no memory size known for gpu_type {})", v.join(", ")),
    }
}
