//! Slurm: what `up`, `plan` and `down` do inside an allocation.
//!
//! With `--slurm`, or `SLURM_JOB_ID` set, the topology's nodes map onto the
//! allocation's hosts (`scontrol show hostnames`): the controller's node onto
//! the node `up` runs on, the others in file order. Each node's `host` becomes
//! the address Slurm reaches it at (`scontrol show node`'s `NodeAddr`), so
//! node names that do not resolve work, and the name is kept for `srun -w`.
//! Every other process starts as a job step of its own (`mesh::slurm`), named
//! after the run (`rlmesh-<hash of the run directory>`), so a new `up` first
//! cancels steps an earlier one in the same allocation left behind, and a run
//! inside someone else's allocation only ever stops its own steps. A run as a
//! batch job of its own is [`super::submit`].
use crate::error::{CliError, CliResult, UsageContext};
use rlmesh_actors::controller::plan::Plan;
use rlmesh_actors::controller::topology::Topology;
use rlmesh_actors::node::fleet::SlurmSteps;
use rlmesh_mesh::slurm::{self, Allocation};
use std::collections::BTreeMap;
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
/// Where Slurm cannot say a node's address, the node is reached by its name.
pub fn allocation(asked: bool, topology: &Topology) -> CliResult<Option<Allocation>> {
    if !asked && (!Allocation::inside() || rlmesh_actors::controller::plan::plan(topology).processes.len() < 2) {
        return Ok(None);
    }
    let mut alloc = Allocation::from_env().map_err(CliError::usage)?;
    if let Err(e) = alloc.look_up_addresses() {
        eprintln!("Slurm job {}: the nodes' addresses are unknown ({e}); reaching each node by its name", alloc.job_id);
    }
    Ok(Some(alloc))
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

/// The topology on the allocation's nodes (see [`Topology::on_hosts`]), each
/// node's `host` the address Slurm reaches it at ([`Allocation::address`]),
/// and the Slurm node of each topology node.
pub fn map_topology(deploy: &Path, topology: &Topology, alloc: &Allocation) -> CliResult<(Topology, BTreeMap<String, String>)> {
    let mut t = topology.on_hosts(&alloc.hosts, &alloc.this_node).map_err(|e| CliError::usage(anyhow::anyhow!("{}: Slurm job {}: {e}", deploy.display(), alloc.job_id)))?;
    let mut nodes = BTreeMap::new();
    for n in &mut t.nodes {
        let address = alloc.address(&n.host).to_string();
        nodes.insert(n.name.clone(), std::mem::replace(&mut n.host, address));
    }
    Ok((t, nodes))
}

/// How the processes start in this allocation, on the Slurm nodes `nodes` ([`map_topology`]'s).
pub fn steps(alloc: &Allocation, run_dir: &Path, nodes: BTreeMap<String, String>) -> SlurmSteps {
    SlurmSteps { job_id: alloc.job_id.clone(), step_name: step_name(run_dir), submitted: std::env::var(SUBMITTED_ENV).is_ok_and(|v| v == "1"), nodes }
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
        p.command = s.srun(p).command_line(&[&program, "node"]);
    }
}
