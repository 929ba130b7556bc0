//! `RUN_DIR/status.json`: the live state of a run, rewritten by the job and read
//! by `launcher status` and `launcher down`.
//!
//! One type serves the writer and the readers, so a field the job writes is the
//! field they read. Beside its pid the job records what makes that pid its own:
//! the host, the boot and the process's start time (`/proc/<pid>/stat`, field 22).
//! A pid alone is not an identity: it is reused once the job is gone, and a
//! hand-edited or corrupt file can hold any number, so [`RunStatus::whose_pid`]
//! checks all of them before anyone acts on it.
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The file's name inside the run directory.
pub const STATUS_FILE: &str = "status.json";

/// One process of a run and the roles of its actors.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessEntry {
    /// The process's name in the plan (`main`).
    pub name: String,
    /// Its pid on `host`.
    pub pid: u32,
    /// Where it runs.
    pub host: String,
    /// The roles of its actors (`controller`, `rollout`, …).
    pub roles: Vec<String>,
    /// Its start time in clock ticks after boot (`/proc/<pid>/stat` field 22).
    pub start_time: Option<u64>,
    /// The policy version its actors hold (rollout: loaded and checked; learner: trained).
    pub version: Option<u64>,
    /// Seconds since the controller last heard from it (its heartbeat), when the status was written.
    pub heartbeat_age_s: Option<f64>,
    /// Times it was restarted.
    pub restarts: u32,
    /// Its Slurm job step (`job.step`), when it runs as one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_step: Option<String>,
}

/// The Slurm job a run is inside.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlurmJob {
    /// `SLURM_JOB_ID`.
    pub job_id: String,
    /// The job was made by `launcher submit` for this run alone, so `launcher
    /// down` may cancel the whole job (otherwise only the run's own steps).
    pub submitted: bool,
    /// The run's step name (`-J`): every step of this run carries it.
    pub step_name: String,
}

/// The content of `status.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunStatus {
    /// The job's pid (on `host`).
    pub pid: u32,
    /// The job's start time in clock ticks after boot (`/proc/<pid>/stat` field 22).
    pub start_time: Option<u64>,
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`) when the job started.
    pub boot_id: Option<String>,
    /// The job's host name.
    pub host: String,
    /// `warmup`, `rl`, `eval`, `done`, or `stopped` (on SIGTERM, after a checkpoint where one can be taken).
    pub phase: String,
    /// RL steps trained.
    pub step: u64,
    /// The policy version.
    pub version: u64,
    /// When the file was written, in unix seconds.
    pub updated_at: f64,
    /// Rollout generation throughput at the last RL step.
    pub tokens_per_s: Option<f64>,
    /// The largest staleness (policy versions) the last RL step trained on.
    pub staleness_max: Option<u64>,
    /// Where `/metrics` is served.
    pub metrics_addr: Option<String>,
    /// Every process of the run.
    pub processes: Vec<ProcessEntry>,
    /// The Slurm job it runs in, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmJob>,
}

/// Who a status file's pid is, as far as this host can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PidOwner {
    /// The live process that wrote the file (same host, boot and start time).
    Job,
    /// No such process any more (or the machine was rebooted since).
    Gone,
    /// The pid is live but belongs to some other process, or cannot be checked; why.
    Other(String),
}

impl RunStatus {
    /// The status of this process now: pid, identity and host filled in, one process entry with `roles`.
    pub fn of_this_process(roles: &[&str]) -> RunStatus {
        let pid = std::process::id();
        let start_time = start_time(pid);
        let host = host_name();
        RunStatus {
            pid,
            start_time,
            boot_id: boot_id(),
            host: host.clone(),
            processes: vec![ProcessEntry { name: "main".into(), pid, host, roles: roles.iter().map(|r| r.to_string()).collect(), start_time, ..Default::default() }],
            ..Default::default()
        }
    }

    /// Writes the file into `dir` (atomically), stamping `updated_at`.
    pub fn write(&mut self, dir: &Path) -> std::io::Result<()> {
        self.updated_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let text = serde_json::to_string(self).expect("status serialises");
        let tmp = dir.join(format!("{STATUS_FILE}.tmp.{}", std::process::id()));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, dir.join(STATUS_FILE))
    }

    /// Whether `pid` is still the process that wrote this file. Only [`PidOwner::Job`] may be signalled.
    pub fn whose_pid(&self) -> PidOwner {
        let pid = self.pid;
        if self.host.is_empty() {
            return PidOwner::Other(format!("the status file names no host, so pid {pid} cannot be shown to be the run's"));
        }
        if self.host != host_name() {
            return PidOwner::Other(format!("the run's host is \"{}\", this is \"{}\"", self.host, host_name()));
        }
        if self.boot_id.is_some() && self.boot_id != boot_id() {
            return PidOwner::Gone;
        }
        let Some(now) = live_start_time(pid) else { return PidOwner::Gone };
        match self.start_time {
            Some(t) if t == now => PidOwner::Job,
            Some(t) => PidOwner::Other(format!("pid {pid} is another process now (it started at tick {now}; the run's started at tick {t})")),
            None => PidOwner::Other(format!("the status file records no start time for pid {pid}, so it cannot be shown to be the run's")),
        }
    }
}

/// The largest pid this kernel hands out (`/proc/sys/kernel/pid_max`; 2^22 when unreadable).
pub fn pid_max() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(1 << 22)
}

/// `/proc/<pid>/stat` split after the command name (which may hold spaces and parentheses).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = text.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// The start time of `pid` in clock ticks after boot, if it exists.
pub fn start_time(pid: u32) -> Option<u64> {
    // After the name come state (field 3) … starttime (field 22).
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// The start time of `pid` if it is alive (a zombie is not).
pub fn live_start_time(pid: u32) -> Option<u64> {
    let f = stat_fields(pid)?;
    if f.first().is_some_and(|s| s == "Z" || s == "X") {
        return None;
    }
    f.get(19)?.parse().ok()
}

/// This machine's host name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_its_own_job_and_a_reused_pid_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = RunStatus::of_this_process(&["controller"]);
        s.phase = "rl".into();
        s.tokens_per_s = Some(12.5);
        s.write(dir.path()).unwrap();
        let back: RunStatus = serde_json::from_str(&std::fs::read_to_string(dir.path().join(STATUS_FILE)).unwrap()).unwrap();
        assert_eq!(back.tokens_per_s, Some(12.5));
        assert_eq!(back.processes[0].roles, ["controller"]);
        assert_eq!(back.whose_pid(), PidOwner::Job);
        let reused = RunStatus { start_time: back.start_time.map(|t| t + 1), ..back.clone() };
        assert!(matches!(reused.whose_pid(), PidOwner::Other(_)));
        let unchecked = RunStatus { start_time: None, ..back };
        assert!(matches!(unchecked.whose_pid(), PidOwner::Other(_)));
    }
}
