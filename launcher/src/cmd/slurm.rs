//! Slurm: what `up`, `plan` and `down` do inside an allocation.
//!
//! With `--slurm`, or `SLURM_JOB_ID` set, the topology's nodes map onto the
//! allocation's hosts (`scontrol show hostnames`): the controller's node onto
//! the node `up` runs on, the others in file order. Every other process
//! starts as a job step of its own (`mesh::slurm`), named after the run
//! (`rlmesh-<hash of the run directory>`), so a new `up` first cancels steps
//! an earlier one in the same allocation left behind, and a run inside
//! someone else's allocation only ever stops its own steps. A run as a batch
//! job of its own is [`super::submit`].
use crate::error::{CliError, CliResult, UsageContext};
use rlmesh_actors::controller::plan::Plan;
use rlmesh_actors::controller::topology::{Device, Topology};
use rlmesh_actors::node::fleet::SlurmSteps;
use rlmesh_mesh::slurm::{self, Allocation};
use std::hash::{Hash, Hasher};
use std::path::Path;

/// Set in the environment of a job `launcher submit` made.
pub(crate) const SUBMITTED_ENV: &str = "RLMESH_SUBMITTED";

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
