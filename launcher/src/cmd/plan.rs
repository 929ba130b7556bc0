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
}

/// `launcher plan`.
pub fn run(a: PlanArgs) -> CliResult {
    let topology = Topology::load(&a.deploy).map_err(CliError::usage)?;
    let plan = plan(&topology);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", plan.table());
    }
    Ok(())
}
