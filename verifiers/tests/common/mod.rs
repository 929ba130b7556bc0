//! Fixtures: verifier scripts written by the test and run by the project's
//! Python (`$RLMESH_PYTHON`), tasks, and a look at /proc.
#![allow(dead_code)]
use rlmesh_core::{Message, Task};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The project's Python (scripts/env.sh sets it), else `python3`.
pub fn python() -> String {
    std::env::var("RLMESH_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Writes `body` as `dir/name` and returns its path.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

/// A task with `answer` and `info`.
pub fn task(answer: &str, info: Value) -> Task {
    Task { id: "t1".into(), prompt: "What is 17 * 24?".into(), expected_answer: Some(answer.into()), info: Some(info), ..Task::default() }
}

/// The conversation of a rollout that answered `completion`.
pub fn messages(completion: &str) -> Vec<Message> {
    vec![Message::user("What is 17 * 24?"), Message::assistant(completion)]
}

/// Is `pid` a live process (not gone, not a zombie)?
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next().unwrap_or('?')).unwrap_or('?');
            !matches!(state, 'Z' | 'X')
        }
        Err(_) => false,
    }
}

/// Waits up to `within` for `pid` to be gone.
pub fn gone_within(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}

/// Pids of live processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(needle) && alive(pid) {
                out.push(pid);
            }
        }
    }
    out
}

/// The verifier used by most tests: the completion must equal the task's
/// answer; `info.mode` makes it answer null, an error, or sleep first.
pub const GOOD: &str = r#"
import json, sys, time
for line in sys.stdin:
    req = json.loads(line)
    info = req["task"].get("info") or {}
    mode = info.get("mode", "grade")
    if mode == "null":
        out = {"id": req["id"], "score": None}
    elif mode == "error":
        out = {"id": req["id"], "error": "cannot parse the answer"}
    else:
        if mode == "sleep":
            time.sleep(info["seconds"])
        out = {"id": req["id"], "score": 1.0 if req["completion"].strip() == (req["task"]["answer"] or "") else 0.0}
    print(json.dumps(out))
"#;

/// A request's JSON shape as the verifier sees it, echoed back in the error field.
pub fn echo_task() -> Value {
    json!({})
}
