//! `launcher plan`: the placement of a topology file, as a table or JSON.
use crate::error::{CliError, CliResult};
use clap::Args;
use rlmesh_actors::controller::{plan::plan, topology::Topology};
use std::path::PathBuf;

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
    if a.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", plan.table());
    }
    Ok(())
}
