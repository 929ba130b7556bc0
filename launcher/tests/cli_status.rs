//! `launcher status` and `launcher down` against hand-written status files and real processes.
mod common;

use common::*;
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn write_status(dir: &Path, pid: u32) {
    std::fs::create_dir_all(dir).unwrap();
    let status = json!({"pid": pid, "step": 12, "version": 11, "phase": "train", "tokens_per_s": 1234.56, "staleness": 1,
                        "processes": [{"name": "local/main", "pid": pid, "roles": "controller,rollout,learner"}],
                        "updated_at": 1_700_000_000.0});
    std::fs::write(dir.join("status.json"), status.to_string()).unwrap();
}

#[test]
fn status_without_a_run_says_so_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let o = launcher_in(Some(dir.path()), &["status"]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("no run: runs does not exist here (pass --run-dir DIR)"), "{}", stderr(&o));

    let o = launcher_in(Some(dir.path()), &["status", "--run-dir", "elsewhere"]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("no run in elsewhere: the directory does not exist"), "{}", stderr(&o));

    std::fs::create_dir_all(dir.path().join("runs/empty")).unwrap();
    let o = launcher_in(Some(dir.path()), &["down"]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("no directory under runs holds a status.json"), "{}", stderr(&o));
}

#[test]
fn status_of_a_live_run_and_of_a_dead_one() {
    let dir = tempfile::tempdir().unwrap();
    // Live: this test process stands in for the job; found as the newest run under ./runs.
    write_status(&dir.path().join("runs/old"), 1);
    std::thread::sleep(Duration::from_millis(20));
    write_status(&dir.path().join("runs/live"), std::process::id());
    let o = launcher_in(Some(dir.path()), &["status"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with(&format!("run runs/live: running (pid {})", std::process::id())), "{out}");
    assert!(out.contains("phase train, step 12, policy version 11") && out.contains("1234.6 tokens/s, staleness 1"), "{out}");
    assert!(out.contains("local/main  pid="), "{out}");

    // Dead: a process that has exited.
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let run = dir.path().join("dead");
    write_status(&run, pid);
    let o = launcher(&["status", "--run-dir", run.to_str().unwrap()]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("NOT RUNNING"), "{}", stdout(&o));
    assert!(stderr(&o).contains(&format!("is not running: pid {pid} is gone")), "{}", stderr(&o));
    let o = launcher(&["down", "--run-dir", run.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("nothing to stop"), "{}", stdout(&o));
}

#[test]
fn down_sends_sigterm_and_waits_for_the_exit() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    // Reap it as soon as it dies, as a job's parent shell would.
    let reaper = std::thread::spawn(move || {
        let mut child = child;
        child.wait().unwrap()
    });
    write_status(dir.path(), pid);
    let t0 = Instant::now();
    let o = launcher(&["down", "--run-dir", dir.path().to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains(&format!("sent SIGTERM to pid {pid}")) && stdout(&o).contains("stopped after"), "{}", stdout(&o));
    assert!(t0.elapsed() < Duration::from_secs(10));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(reaper.join().unwrap().signal(), Some(15), "ended by SIGTERM");
}
