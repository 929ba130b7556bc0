//! `launcher status` and `launcher down`: a running job's `RUN_DIR/status.json`
//! ([`RunStatus`], rewritten by the job) and its process.
//!
//! Nothing read from the file is trusted: its pid is signalled only when it is
//! in range, is still the process that wrote the file (host, boot, start time)
//! and holds the run directory's lock; its text is printed with control
//! characters escaped.
use crate::cmd::submit;
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_actors::controller::run_dir::{RunDirLock, LOCK_FILE};
use rlmesh_actors::controller::status::{live_start_time, pid_max, PidOwner, RunStatus, STATUS_FILE};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where runs live when `--run-dir` is not given.
const RUNS: &str = "runs";
/// How long `down` waits for the job to checkpoint and exit.
const DOWN_WAIT: Duration = Duration::from_secs(60);
/// A status file is a few hundred bytes; anything past this is not one.
const MAX_STATUS_BYTES: u64 = 1 << 20;
/// Strings from the file are cut to this many characters when printed.
const MAX_SHOWN: usize = 200;

/// Arguments of `launcher status` and `launcher down`.
#[derive(Args)]
pub struct RunDirArgs {
    /// Run directory (default: the one under ./runs/ whose status.json changed last).
    #[arg(long)]
    run_dir: Option<PathBuf>,
}

/// A job's last `status.json` and where it was read.
struct Loaded {
    dir: PathBuf,
    status: RunStatus,
}

/// `launcher status`.
pub fn status(a: RunDirArgs) -> CliResult {
    let dir_arg = a.run_dir.clone();
    let Loaded { dir, status: s } = match load(a.run_dir) {
        Ok(l) => l,
        Err(e) => return pending_submission(dir_arg.as_deref()).unwrap_or(Err(e)),
    };
    let shown = clean(&dir.display().to_string());
    let owner = slurm_owner(&s, s.whose_pid());
    let finished = dir.join("summary.json").is_file();
    let state = match &owner {
        PidOwner::Job => "running".to_string(),
        PidOwner::Gone if finished => "finished".to_string(),
        PidOwner::Gone => "NOT RUNNING".to_string(),
        PidOwner::Other(why) => format!("NOT RUNNING ({})", clean(why)),
    };
    println!("run {shown}: {state} (pid {})", s.pid);
    println!("  phase {}, step {}, policy version {}", clean(&s.phase), s.step, s.version);
    let throughput = s.tokens_per_s.filter(|x| x.is_finite()).map_or_else(|| "?".to_string(), |x| format!("{x:.1}"));
    println!("  throughput {throughput} tokens/s, staleness {}", s.staleness_max.map_or_else(|| "?".to_string(), |x| x.to_string()));
    println!("  updated {}", updated(s.updated_at));
    if let Some(addr) = &s.metrics_addr {
        println!("  metrics http://{}/metrics", clean(addr));
    }
    if let Some(j) = &s.slurm {
        let state = rlmesh_mesh::slurm::job_state(&j.job_id).ok().flatten().unwrap_or_else(|| "ended".into());
        let how = if j.submitted { "submitted by `launcher submit`" } else { "started inside its allocation" };
        println!("  Slurm job {} ({how}): {}, steps named {}", clean(&j.job_id), clean(&state), clean(&j.step_name));
    }
    println!("  processes ({}):", s.processes.len());
    for p in &s.processes {
        let mut line = format!("    {}  pid={}  host={}  roles={}", clean(&p.name), p.pid, clean(&p.host), clean(&p.roles.join(",")));
        if let Some(v) = p.version {
            line.push_str(&format!("  version={v}"));
        }
        if let Some(a) = p.heartbeat_age_s {
            line.push_str(&format!("  heartbeat={a:.1}s ago"));
        }
        if p.heartbeat_age_s.is_some() || p.restarts > 0 {
            line.push_str(&format!("  restarts={}", p.restarts));
        }
        if let Some(step) = &p.slurm_step {
            line.push_str(&format!("  step={}", clean(step)));
        }
        println!("{line}");
    }
    match owner {
        PidOwner::Job => Ok(()),
        PidOwner::Gone if finished => {
            println!("  it finished: summary.json holds its held-out figures (`launcher report {shown}`)");
            Ok(())
        }
        _ => Err(anyhow::anyhow!("run {shown} is not running: pid {} is gone; {}", s.pid, what_next(&dir, &s)).into()),
    }
}

/// What can be done with a run that stopped before its end.
fn what_next(dir: &Path, s: &RunStatus) -> String {
    let shown = clean(&dir.display().to_string());
    if rlmesh_actors::learner::list_checkpoints(&dir.join("checkpoints")).is_empty() {
        format!(
            "it stopped in the {} phase before its first checkpoint, so there is nothing to resume: start it again with `launcher up DEPLOY.toml --recipe RECIPE --run-dir {shown}` (the old directory is set aside as {shown}.prev-<secs>)",
            clean(&s.phase)
        )
    } else {
        format!("no summary.json, so it stopped early: continue it from its newest checkpoint with `launcher up DEPLOY.toml --recipe RECIPE --run-dir {shown} --resume`")
    }
}

/// A run on another host of a Slurm job is alive while the job runs (its pid cannot be checked from here).
fn slurm_owner(s: &RunStatus, owner: PidOwner) -> PidOwner {
    match (&s.slurm, &owner) {
        (Some(j), PidOwner::Other(_)) if s.host != rlmesh_actors::controller::status::host_name() => match rlmesh_mesh::slurm::job_state(&j.job_id) {
            Ok(Some(state)) if state == "RUNNING" => PidOwner::Job,
            Ok(_) => PidOwner::Gone,
            Err(_) => owner,
        },
        _ => owner,
    }
}

/// `launcher status` of a run whose job was submitted but has not written its status yet.
fn pending_submission(dir: Option<&Path>) -> Option<CliResult> {
    let dir = dir?;
    let job = submit::submitted(dir)?;
    let state = rlmesh_mesh::slurm::job_state(&job.job_id).ok().flatten().unwrap_or_else(|| "ended".into());
    println!("run {}: Slurm job {} is {state} (no status.json yet; Slurm's output: {})", clean(&dir.display().to_string()), clean(&job.job_id), job.output.display());
    Some(Ok(()))
}

/// `launcher down`.
pub fn down(a: RunDirArgs) -> CliResult {
    let dir_arg = a.run_dir.clone();
    let Loaded { dir, status: s } = match load(a.run_dir) {
        Ok(l) => l,
        // Submitted, not started yet: the job is all there is to stop.
        Err(e) => match dir_arg.as_deref().and_then(submit::submitted) {
            Some(job) => return submit::down_job(&job.job_id, &clean(&dir_arg.unwrap_or_default().display().to_string()), DOWN_WAIT),
            None => return Err(e),
        },
    };
    let shown = clean(&dir.display().to_string());
    if let Some(j) = s.slurm.as_ref().filter(|j| j.submitted) {
        return submit::down_job(&j.job_id, &shown, DOWN_WAIT);
    }
    let pid = s.pid;
    let refuse = |why: String| Err(CliError::usage(anyhow::anyhow!("run {shown}: not signalling pid {pid}: {why}")));
    match s.whose_pid() {
        PidOwner::Gone => {
            println!("run {shown} is not running (pid {pid} is gone); nothing to stop");
            return Ok(());
        }
        PidOwner::Other(why) => return refuse(format!("{}; if you know it is the job, `kill {pid}` stops it", clean(&why))),
        PidOwner::Job => {}
    }
    match RunDirLock::holder(&dir).usage(format!("run {shown}"))? {
        Some(holder) if holder == pid => {}
        Some(holder) => return refuse(format!("{LOCK_FILE} is held by pid {holder}, so pid {pid} is not this run's job")),
        None => return refuse(format!("nobody holds {shown}/{LOCK_FILE}, so pid {pid} is not this run's job")),
    }
    let start = s.start_time;
    let alive = || live_start_time(pid).is_some() && live_start_time(pid) == start;
    // SAFETY: kill(2) with a pid checked above to be 2..=pid_max and the run's own process.
    let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    if rc != 0 && alive() {
        return Err(anyhow::anyhow!("cannot send SIGTERM to pid {pid} (run {shown}): {}", std::io::Error::last_os_error()).into());
    }
    println!("sent SIGTERM to pid {pid} (run {shown}); waiting up to {} s for it to checkpoint and exit", DOWN_WAIT.as_secs());
    let t0 = Instant::now();
    while t0.elapsed() < DOWN_WAIT {
        if !alive() {
            println!("stopped after {:.1} s", t0.elapsed().as_secs_f64());
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(anyhow::anyhow!("pid {pid} (run {shown}) is still running {} s after SIGTERM; `launcher status --run-dir {shown}` shows its phase, `kill -KILL {pid}` ends it without a checkpoint", DOWN_WAIT.as_secs()).into())
}

/// Reads `status.json` of `dir`, or of the run under `./runs/` updated last.
fn load(dir: Option<PathBuf>) -> CliResult<Loaded> {
    let dir = match dir {
        Some(d) => d,
        None => newest_run(Path::new(RUNS))?,
    };
    let path = dir.join(STATUS_FILE);
    let shown = clean(&path.display().to_string());
    if !path.exists() {
        let what = if dir.is_dir() { "holds no status.json (no run was started there)" } else { "does not exist" };
        return Err(CliError::usage(anyhow::anyhow!("no run in {}: the directory {what}", clean(&dir.display().to_string()))));
    }
    let len = path.metadata().usage(format!("{shown}: cannot read"))?.len();
    if len > MAX_STATUS_BYTES {
        return Err(CliError::usage(anyhow::anyhow!("{shown}: {len} bytes, more than a status file's {MAX_STATUS_BYTES}")));
    }
    let text = std::fs::read_to_string(&path).usage(format!("{shown}: cannot read"))?;
    let json: Value = serde_json::from_str(&text).usage(format!("{shown}: not valid JSON"))?;
    let Value::Object(fields) = &json else { return Err(CliError::usage(anyhow::anyhow!("{shown}: expected a JSON object"))) };
    let max = pid_max();
    let pid = fields.get("pid").and_then(Value::as_u64).filter(|p| (2..=u64::from(max)).contains(p));
    if pid.is_none() {
        let got = fields.get("pid").map_or_else(|| "nothing".to_string(), |v| clean(&v.to_string()));
        return Err(CliError::usage(anyhow::anyhow!("{shown}: field \"pid\": expected a process id in 2..={max}, got {got}")));
    }
    let status = serde_json::from_value::<RunStatus>(json.clone()).map_err(|e| {
        // Name the field: the first one that fails on its own.
        let field = fields.iter().find(|(k, v)| serde_json::from_value::<RunStatus>(Value::Object([((*k).clone(), (*v).clone())].into_iter().collect())).is_err()).map_or("?", |(k, _)| k.as_str());
        CliError::usage(anyhow::anyhow!("{shown}: field \"{}\": {}", clean(field), clean(&e.to_string())))
    })?;
    Ok(Loaded { dir, status })
}

/// The directory under `runs` whose `status.json` was modified last.
fn newest_run(runs: &Path) -> CliResult<PathBuf> {
    let entries = std::fs::read_dir(runs).map_err(|_| CliError::usage(anyhow::anyhow!("no run: {} does not exist here (pass --run-dir DIR)", runs.display())))?;
    entries
        .filter_map(|e| {
            let dir = e.ok()?.path();
            let modified = dir.join(STATUS_FILE).metadata().ok()?.modified().ok()?;
            Some((modified, dir))
        })
        .max()
        .map(|(_, d)| d)
        .ok_or_else(|| CliError::usage(anyhow::anyhow!("no run: no directory under {} holds a status.json (pass --run-dir DIR)", runs.display())))
}

/// `updated_at` (unix seconds) as an age; a value no clock could have written says so.
fn updated(at: f64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    /// A century: older than any run.
    const CENTURY: f64 = 100.0 * 365.25 * 86400.0;
    let age = now - at;
    if !at.is_finite() || at <= 0.0 || age.abs() > CENTURY {
        format!("at an implausible time (updated_at = {at:e})")
    } else if age < -60.0 {
        format!("{:.0} s in the future (updated_at = {at:e}; are the clocks apart?)", -age)
    } else {
        format!("{:.0} s ago", age.max(0.0))
    }
}

/// Text from a file, safe to print: control characters (ANSI escapes, newlines) escaped, long text cut.
fn clean(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == MAX_SHOWN {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}
