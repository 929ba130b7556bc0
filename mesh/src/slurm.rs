//! Slurm: the allocation a run is inside, and its job steps.
//!
//! Inside a Slurm allocation (`SLURM_JOB_ID` set: an `sbatch` script or an
//! `salloc` shell), every process of a run other than the one that runs
//! `launcher up` starts as a **job step of its own**: `srun --jobid=J -N1 -n1
//! -w NODE --exact --overlap --kill-on-bad-exit=1 --gpus-per-node=G -J NAME
//! --export=ALL -- sh -c SCRIPT`, where `SCRIPT` is the same one an ssh start
//! runs ([`crate::launch::ProcessSpec::remote_script`]): secrets come on srun's
//! stdin, which srun forwards to the single task, and the task prints its pid,
//! start time, boot id and step id before it `exec`s the program. So Slurm
//! owns the process (its accounting, `scancel`, `--kill-on-bad-exit`), and the
//! launcher still knows its pid.
//!
//! - `--exact`: a step gets only what it asks for, so the steps start in parallel
//!   instead of one after another.
//! - `--overlap`: a step may share CPUs with the others: rlmesh pins each process
//!   to its share of a node's cores itself, and a step that waited for CPUs the
//!   batch step holds would stall the start.
//! - `--gpus-per-node=G`: each step asks for its own GPU count (0 for a CPU
//!   process). Without it, a step inherits the job's `SLURM_GPUS_PER_NODE` and
//!   asks for every GPU of the node.
//!
//! Processes listen and dial at each node's address as Slurm knows it
//! (`NodeAddr`, [`Allocation::look_up_addresses`]), not at its name: a node
//! name need not resolve (cloud, dynamic and test clusters), and several
//! nodes may share one address. Only `srun -w` takes the name.
//!
//! The helpers here call the Slurm client commands (`scontrol`, `squeue`,
//! `scancel`, `sbatch`); each error names the command and what it printed.
use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

/// Errors of the Slurm client commands.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// Not inside an allocation (a variable is missing).
    #[error("not inside a Slurm allocation: {0} is not set (run under sbatch or salloc, or use `launcher submit`)")]
    NoAllocation(&'static str),
    /// A client command could not run, or failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Its stderr, or the OS error.
        detail: String,
    },
}

/// Result of this module.
pub type Result<T, E = SlurmError> = std::result::Result<T, E>;

/// Run a Slurm client command; its stdout on success.
pub fn client(program: &str, args: &[&str]) -> Result<String> {
    let command = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| SlurmError::Command { command: command.clone(), detail: format!("{e} (is Slurm's client installed? Debian: slurm-client)") })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(SlurmError::Command { command, detail: format!("{}: {err}", out.status) });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The allocation this process runs in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// `SLURM_JOB_ID`.
    pub job_id: String,
    /// The job's hosts in Slurm's order (`scontrol show hostnames $SLURM_JOB_NODELIST`).
    pub hosts: Vec<String>,
    /// The node this process runs on (`SLURMD_NODENAME`; in a batch script the first host).
    pub this_node: String,
    /// Each host's address as Slurm knows it (`NodeAddr`), once
    /// [`Allocation::look_up_addresses`] has asked; a host missing here is
    /// reached by its name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub addresses: BTreeMap<String, String>,
}

impl Allocation {
    /// Whether `SLURM_JOB_ID` is set.
    pub fn inside() -> bool {
        std::env::var_os("SLURM_JOB_ID").is_some_and(|v| !v.is_empty())
    }

    /// Reads the allocation from the environment and expands its node list.
    pub fn from_env() -> Result<Allocation> {
        let var = |k: &'static str| std::env::var(k).ok().filter(|v| !v.is_empty()).ok_or(SlurmError::NoAllocation(k));
        let job_id = var("SLURM_JOB_ID")?;
        let list = var("SLURM_JOB_NODELIST").or_else(|_| var("SLURM_NODELIST"))?;
        let hosts = hostnames(&list)?;
        let this_node = var("SLURMD_NODENAME").unwrap_or_else(|_| hosts.first().cloned().unwrap_or_default());
        Ok(Allocation { job_id, hosts, this_node, addresses: BTreeMap::new() })
    }

    /// Asks Slurm for every host's `NodeAddr` ([`node_addresses`]). A node's
    /// name need not resolve (cloud, dynamic and test clusters give nodes an
    /// address of their own), so processes listen and dial there.
    pub fn look_up_addresses(&mut self) -> Result<()> {
        self.addresses = node_addresses(&self.hosts)?;
        Ok(())
    }

    /// Where node `node` is reached: its `NodeAddr`, else its name (resolved by name lookup).
    pub fn address<'a>(&'a self, node: &'a str) -> &'a str {
        self.addresses.get(node).map_or(node, String::as_str)
    }
}

/// `scontrol show hostnames LIST`: `h[1-3],g7` → `h1 h2 h3 g7`.
pub fn hostnames(list: &str) -> Result<Vec<String>> {
    Ok(client("scontrol", &["show", "hostnames", list])?.split_whitespace().map(String::from).collect())
}

/// `scontrol show node -o NODES`: each node's `NodeAddr` (Slurm's default for
/// it is the node's name). Nodes Slurm does not show are left out.
pub fn node_addresses(nodes: &[String]) -> Result<BTreeMap<String, String>> {
    if nodes.is_empty() {
        return Ok(BTreeMap::new());
    }
    Ok(parse_node_addresses(&client("scontrol", &["show", "node", "-o", &nodes.join(",")])?))
}

/// Node name → `NodeAddr` from `scontrol show node -o` output: one line per
/// node, `Key=Value` words (some values, `OS=` and `Reason=`, hold spaces).
pub fn parse_node_addresses(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let field = |key: &str| line.split_whitespace().find_map(|w| w.strip_prefix(key)).filter(|v| !v.is_empty() && *v != "(null)");
            Some((field("NodeName=")?.to_string(), field("NodeAddr=")?.to_string()))
        })
        .collect()
}

/// The steps of job `job_id` now: `(step id, step name)`, e.g. `("12.3", "rlmesh-ab12")`.
pub fn steps(job_id: &str) -> Result<Vec<(String, String)>> {
    let out = client("squeue", &["-h", "-s", "-j", job_id, "-o", "%i %j"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(i, n)| (i.trim().to_string(), n.trim().to_string())))
        .collect())
}

/// `scancel TARGET…` (a job id or `job.step`); `signal` sends that signal instead of ending them.
pub fn cancel(targets: &[String], signal: Option<&str>) -> Result<()> {
    if targets.is_empty() {
        return Ok(());
    }
    let mut args: Vec<&str> = Vec::new();
    let s;
    if let Some(sig) = signal {
        s = format!("--signal={sig}");
        args.push(&s);
    }
    args.extend(targets.iter().map(String::as_str));
    client("scancel", &args).map(|_| ())
}

/// The state of a job (`PENDING`, `RUNNING`, …), or `None` once Slurm has forgotten it.
pub fn job_state(job_id: &str) -> Result<Option<String>> {
    match client("squeue", &["-h", "-j", job_id, "-o", "%T"]) {
        Ok(out) => Ok(out.lines().next().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())),
        // squeue exits 1 with "Invalid job id specified" for a job that has left the queue.
        Err(SlurmError::Command { detail, .. }) if detail.contains("Invalid job id") => Ok(None),
        Err(e) => Err(e),
    }
}

/// How one process starts as a job step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrunConfig {
    /// The srun program (default `srun`, on PATH).
    pub program: String,
    /// The job the step belongs to.
    pub job_id: String,
    /// The node it runs on (`-w`).
    pub node: String,
    /// The step's name (`-J`): the run's step names, so a new run can find an earlier one's.
    pub step_name: String,
    /// GPUs of this process (`--gpus-per-node`).
    pub gpus: u32,
    /// Further srun options, as given.
    pub extra: Vec<String>,
}

impl SrunConfig {
    /// srun's arguments up to and including `--`.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec![
            format!("--jobid={}", self.job_id),
            "--nodes=1".into(),
            "--ntasks=1".into(),
            format!("--nodelist={}", self.node),
            "--exact".into(),
            "--overlap".into(),
            "--kill-on-bad-exit=1".into(),
            format!("--gpus-per-node={}", self.gpus),
            format!("--job-name={}", self.step_name),
            "--export=ALL".into(),
        ];
        a.extend(self.extra.iter().cloned());
        a.push("--".into());
        a
    }

    /// The whole command line of a step running `sh -c SCRIPT` (for plans and messages).
    pub fn command_line(&self, script_words: &[&str]) -> Vec<String> {
        let mut w = vec![self.program.clone()];
        w.extend(self.args());
        w.extend(script_words.iter().map(|s| s.to_string()));
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srun_arguments_ask_for_one_task_on_one_node_with_its_own_gpus() {
        let c = SrunConfig { program: "srun".into(), job_id: "42".into(), node: "h2".into(), step_name: "rlmesh-x".into(), gpus: 0, extra: vec![] };
        let a = c.args();
        for want in ["--jobid=42", "--nodes=1", "--ntasks=1", "--nodelist=h2", "--exact", "--kill-on-bad-exit=1", "--gpus-per-node=0", "--job-name=rlmesh-x"] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        assert_eq!(a.last().map(String::as_str), Some("--"));
    }

    #[test]
    fn node_addresses_come_from_each_line_of_scontrol_show_node() {
        // Slurm 22.05's `scontrol show node -o n1,n2,n3`, shortened; n3 has no NodeAddr of its own.
        let text = "NodeName=n1 Arch=x86_64 CoresPerSocket=4 CPUAlloc=0 CPUTot=4 NodeAddr=10.77.0.11 NodeHostName=n1 Version=22.05.8 OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01) RealMemory=1000 State=IDLE Partitions=debug\n\
                    NodeName=n2 Arch=x86_64 NodeAddr=10.77.0.12 NodeHostName=n2 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2024-05-01T10:00:00] \n\
                    NodeName=n3 Arch=x86_64 NodeAddr=n3 NodeHostName=n3 State=IDLE\n\
                    \n";
        let a = parse_node_addresses(text);
        assert_eq!(a, BTreeMap::from([("n1".to_string(), "10.77.0.11".to_string()), ("n2".into(), "10.77.0.12".into()), ("n3".into(), "n3".into())]));
        assert!(parse_node_addresses("Node n9 not found\n").is_empty());
        assert!(parse_node_addresses("NodeName=n4 NodeAddr= State=FUTURE\n").is_empty());
    }

    #[test]
    fn a_node_is_reached_at_its_address_or_else_by_its_name() {
        let mut a = Allocation { job_id: "7".into(), hosts: vec!["n1".into(), "n2".into()], this_node: "n1".into(), addresses: BTreeMap::new() };
        assert_eq!(a.address("n1"), "n1");
        a.addresses.insert("n1".into(), "127.0.0.1".into());
        assert_eq!((a.address("n1"), a.address("n2")), ("127.0.0.1", "n2"));
    }
}
