//! `launcher status` and `launcher down`: a running job's `RUN_DIR/status.json`
//! (`{pid, step, version, phase, tokens_per_s, staleness, processes, updated_at}`,
//! rewritten by the job) and its process.
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where runs live when `--run-dir` is not given.
const RUNS: &str = "runs";
/// How long `down` waits for the job to checkpoint and exit.
const DOWN_WAIT: Duration = Duration::from_secs(60);

/// Arguments of `launcher status` and `launcher down`.
#[derive(Args)]
pub struct RunDirArgs {
    /// Run directory (default: the one under ./runs/ whose status.json changed last).
    #[arg(long)]
    run_dir: Option<PathBuf>,
}

/// A job's last `status.json` and where it was read.
struct Status {
    dir: PathBuf,
    pid: u32,
    json: Value,
}

/// `launcher status`.
pub fn status(a: RunDirArgs) -> CliResult {
    let s = load(a.run_dir)?;
    let j = &s.json;
    let field = |k: &str| j.get(k).map_or_else(|| "?".to_string(), |v| v.as_str().map_or_else(|| v.to_string(), str::to_string));
    let alive = is_alive(s.pid);
    println!("run {}: {} (pid {})", s.dir.display(), if alive { "running" } else { "NOT RUNNING" }, s.pid);
    println!("  phase {}, step {}, policy version {}", field("phase"), field("step"), field("version"));
    println!("  throughput {} tokens/s, staleness {}", j.get("tokens_per_s").and_then(Value::as_f64).map_or_else(|| "?".to_string(), |x| format!("{x:.1}")), field("staleness"));
    println!("  updated {}", updated(j.get("updated_at")));
    if let Some(ps) = j.get("processes").and_then(Value::as_array) {
        println!("  processes ({}):", ps.len());
        for p in ps {
            println!("    {}", process_line(p));
        }
    }
    if alive {
        return Ok(());
    }
    let finished = if s.dir.join("summary.json").exists() { "; summary.json is there, so it finished" } else { "; no summary.json, so it stopped early (resume with launcher up --resume)" };
    Err(anyhow::anyhow!("run {} is not running: pid {} is gone{finished}", s.dir.display(), s.pid).into())
}

/// `launcher down`.
pub fn down(a: RunDirArgs) -> CliResult {
    let s = load(a.run_dir)?;
    if !is_alive(s.pid) {
        println!("run {} is not running (pid {} is gone); nothing to stop", s.dir.display(), s.pid);
        return Ok(());
    }
    let sent = Command::new("kill").args(["-TERM", &s.pid.to_string()]).stderr(Stdio::null()).status().usage("running kill")?;
    if !sent.success() && is_alive(s.pid) {
        return Err(anyhow::anyhow!("cannot send SIGTERM to pid {} (run {}): permission denied?", s.pid, s.dir.display()).into());
    }
    println!("sent SIGTERM to pid {} (run {}); waiting up to {} s for it to checkpoint and exit", s.pid, s.dir.display(), DOWN_WAIT.as_secs());
    let t0 = Instant::now();
    while t0.elapsed() < DOWN_WAIT {
        if !is_alive(s.pid) {
            println!("stopped after {:.1} s", t0.elapsed().as_secs_f64());
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(anyhow::anyhow!("pid {} (run {}) is still running {} s after SIGTERM; `launcher status --run-dir {}` shows its phase, `kill -KILL {}` ends it without a checkpoint", s.pid, s.dir.display(), DOWN_WAIT.as_secs(), s.dir.display(), s.pid).into())
}

/// Reads `status.json` of `dir`, or of the run under `./runs/` updated last.
fn load(dir: Option<PathBuf>) -> CliResult<Status> {
    let dir = match dir {
        Some(d) => d,
        None => newest_run(Path::new(RUNS))?,
    };
    let path = dir.join("status.json");
    if !path.exists() {
        let what = if dir.is_dir() { "holds no status.json (no run was started there)" } else { "does not exist" };
        return Err(anyhow::anyhow!("no run in {}: the directory {what}", dir.display()).into());
    }
    let text = std::fs::read_to_string(&path).usage(format!("{}: cannot read", path.display()))?;
    let json: Value = serde_json::from_str(&text).usage(format!("{}: not valid JSON", path.display()))?;
    let pid = json
        .get("pid")
        .and_then(Value::as_u64)
        .and_then(|p| u32::try_from(p).ok())
        .ok_or_else(|| CliError::usage(anyhow::anyhow!("{}: field \"pid\": expected a process id", path.display())))?;
    Ok(Status { dir, pid, json })
}

/// The directory under `runs` whose `status.json` was modified last.
fn newest_run(runs: &Path) -> CliResult<PathBuf> {
    let entries = std::fs::read_dir(runs).map_err(|_| anyhow::anyhow!("no run: {} does not exist here (pass --run-dir DIR)", runs.display()))?;
    entries
        .filter_map(|e| {
            let dir = e.ok()?.path();
            let modified = dir.join("status.json").metadata().ok()?.modified().ok()?;
            Some((modified, dir))
        })
        .max()
        .map(|(_, d)| d)
        .ok_or_else(|| anyhow::anyhow!("no run: no directory under {} holds a status.json (pass --run-dir DIR)", runs.display()).into())
}

/// Whether `pid` is a live process (`kill -0`), not counting zombies.
fn is_alive(pid: u32) -> bool {
    let signalled = Command::new("kill").args(["-0", &pid.to_string()]).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')));
    signalled && !zombie
}

/// `updated_at` as an age (unix seconds) or as written.
fn updated(v: Option<&Value>) -> String {
    match v {
        Some(Value::Number(n)) => {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            format!("{:.0} s ago", (now - n.as_f64().unwrap_or(now)).max(0.0))
        }
        Some(Value::String(s)) => format!("at {s}"),
        _ => "at an unknown time".into(),
    }
}

/// One process of `status.json`: its name, then its other fields as `key=value`.
fn process_line(p: &Value) -> String {
    match p {
        Value::Object(m) => {
            let mut parts: Vec<String> = m.get("name").and_then(Value::as_str).map(str::to_string).into_iter().collect();
            parts.extend(m.iter().filter(|(k, _)| *k != "name").map(|(k, v)| format!("{k}={}", v.as_str().map_or_else(|| v.to_string(), str::to_string))));
            parts.join("  ")
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
