//! Agent programs behind the endpoint: one key per rollout, the calls made
//! with it, and the program's process.
//!
//! [`SessionTable`] is the [`Sessions`] of an endpoint in training: a rollout
//! opens a session (a fresh key), its program calls the endpoint with that key
//! (`OPENAI_API_KEY`), every call is recorded, and closing the session hands
//! the calls back and makes the key answer 401 from then on.
//!
//! [`run_agent`] starts the program with `OPENAI_BASE_URL`, `OPENAI_API_KEY`
//! and the task's JSON row on stdin, in a process group of its own, and kills
//! the whole group at the timeout or when the future is dropped (shutdown).
use crate::sessions::{CallRecord, Sessions};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// A live session: its calls so far, and the temperature it samples at (if fixed).
#[derive(Default)]
struct Live {
    calls: Vec<CallRecord>,
    temperature: Option<f64>,
}

/// The live sessions of an endpoint, by key.
#[derive(Default)]
pub struct SessionTable {
    live: Mutex<HashMap<String, Live>>,
    opened: AtomicU64,
    secret: u64,
}

impl SessionTable {
    /// An empty table whose keys are unguessable from each other.
    pub fn new() -> SessionTable {
        let secret = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64) ^ (std::process::id() as u64).rotate_left(32);
        SessionTable { secret, ..Default::default() }
    }

    /// Opens a session; returns its key.
    pub fn open(&self, label: &str) -> String {
        self.open_at(label, None)
    }

    /// Opens a session whose every call samples at `temperature` (when
    /// given), whatever the request asks; returns its key.
    pub fn open_at(&self, label: &str, temperature: Option<f64>) -> String {
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        let key = format!("rlmesh-{label}-{n}-{:016x}", mix(self.secret ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        self.live.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), Live { calls: vec![], temperature });
        key
    }

    /// Closes a session: its calls, in order; its key is refused from now on.
    pub fn close(&self, key: &str) -> Vec<CallRecord> {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).remove(key).map(|l| l.calls).unwrap_or_default()
    }
}

impl Sessions for SessionTable {
    fn check(&self, key: &str) -> Result<(), String> {
        match self.live.lock().unwrap_or_else(|p| p.into_inner()).contains_key(key) {
            true => Ok(()),
            false => Err("this key belongs to no live rollout session (unknown, or its rollout has finished)".into()),
        }
    }

    fn record(&self, key: &str, call: CallRecord) -> Result<(), String> {
        match self.live.lock().unwrap_or_else(|p| p.into_inner()).get_mut(key) {
            Some(live) => {
                live.calls.push(call);
                Ok(())
            }
            None => Err("the rollout session of this key finished while the call ran".into()),
        }
    }

    fn adjust(&self, key: &str, params: &mut rlmesh_model::SamplingParams) {
        if let Some(t) = self.live.lock().unwrap_or_else(|p| p.into_inner()).get(key).and_then(|l| l.temperature) {
            params.temperature = t;
        }
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How an agent program ended.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentExit {
    /// It exited with this code (0: success); `last_line` is its last non-empty line of stdout.
    Exited {
        /// Exit code (-1 when killed by a signal).
        code: i32,
        /// The last non-empty stdout line.
        last_line: Option<String>,
        /// The end of its stderr (up to 2 KiB), for the log.
        stderr_tail: String,
    },
    /// It ran past its timeout; it and its children were killed.
    TimedOut,
    /// It could not be started.
    NotStarted(String),
}

/// Runs `command` for one rollout: `OPENAI_BASE_URL=base_url`, `OPENAI_API_KEY=key`,
/// `row` (the task's JSON) on stdin. Its process group is killed at `timeout`
/// and if this future is dropped before the program ends.
pub async fn run_agent(command: &[String], base_url: &str, key: &str, row: &str, timeout: Duration) -> AgentExit {
    run_agent_in(command, None, base_url, key, row, timeout).await
}

/// [`run_agent`] in the directory `cwd` (this process's when `None`).
pub async fn run_agent_in(command: &[String], cwd: Option<&std::path::Path>, base_url: &str, key: &str, row: &str, timeout: Duration) -> AgentExit {
    let Some((program, args)) = command.split_first() else { return AgentExit::NotStarted("the agent command is empty".into()) };
    let mut cmd = tokio::process::Command::new(program);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    cmd.args(args)
        .env("OPENAI_BASE_URL", base_url)
        .env("OPENAI_API_KEY", key)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return AgentExit::NotStarted(format!("starting {program}: {e}")),
    };
    let group = GroupKill(child.id().map(|p| p as i32));
    if let Some(mut stdin) = child.stdin.take() {
        let row = format!("{row}\n");
        // A program that never reads its stdin is fine: it just does not see the row.
        tokio::spawn(async move {
            let _ = stdin.write_all(row.as_bytes()).await;
        });
    }
    let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return AgentExit::NotStarted(format!("waiting for {program}: {e}")),
        Err(_) => return AgentExit::TimedOut, // `group` kills the process group on the way out
    };
    drop(group);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail_from = stderr.len().saturating_sub(2048);
    let tail_from = (tail_from..stderr.len()).find(|&i| stderr.is_char_boundary(i)).unwrap_or(stderr.len());
    AgentExit::Exited {
        code: out.status.code().unwrap_or(-1),
        last_line: stdout.lines().rev().find(|l| !l.trim().is_empty()).map(|l| l.trim().to_string()),
        stderr_tail: stderr[tail_from..].to_string(),
    }
}

/// Kills a process group when dropped (the program's children included).
struct GroupKill(Option<i32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.filter(|&p| p > 0) {
            // SAFETY: kill(2) on a process group this code created; a group already gone is ESRCH, ignored.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}
