//! `launcher status` against status files written by the job's own writer
//! ([`RunStatus`]) and by hand, for live, finished and dead runs.
//! (`launcher down` signals processes: it is tested in cli_down_ns.rs, inside a pid namespace.)
mod common;

use common::*;
use rlmesh_actors::controller::status::RunStatus;
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A status file as the job writes it, for this test process (which stands in for the job).
fn write_live(dir: &Path) -> RunStatus {
    std::fs::create_dir_all(dir).unwrap();
    let mut s = RunStatus::of_this_process(&["controller", "rollout", "learner"]);
    s.phase = "rl".into();
    s.step = 12;
    s.version = 11;
    s.tokens_per_s = Some(1234.56);
    s.staleness_max = Some(1);
    s.write(dir).unwrap();
    s
}

/// The status file of a job whose process has exited.
fn write_dead(dir: &Path, phase: &str) -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let mut s = RunStatus::of_this_process(&["controller"]);
    s.pid = pid;
    s.start_time = Some(1);
    s.phase = phase.into();
    s.write(dir).unwrap();
    pid
}

#[test]
fn status_without_a_run_says_so_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let o = launcher_in(Some(dir.path()), &["status"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("no run: runs does not exist here (pass --run-dir DIR)"), "{}", stderr(&o));

    for cmd in ["status", "down"] {
        let o = launcher_in(Some(dir.path()), &[cmd, "--run-dir", "elsewhere"]);
        assert_eq!(code(&o), 2, "{cmd}");
        assert!(stderr(&o).contains("no run in elsewhere: the directory does not exist"), "{}", stderr(&o));
    }

    std::fs::create_dir_all(dir.path().join("runs/empty")).unwrap();
    let o = launcher_in(Some(dir.path()), &["down"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("no directory under runs holds a status.json"), "{}", stderr(&o));
}

#[test]
fn status_shows_the_throughput_and_staleness_the_job_writes() {
    let dir = tempfile::tempdir().unwrap();
    // Found as the newest run under ./runs.
    write_dead(&dir.path().join("runs/old"), "rl");
    std::thread::sleep(Duration::from_millis(20));
    write_live(&dir.path().join("runs/live"));
    let o = launcher_in(Some(dir.path()), &["status"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with(&format!("run runs/live: running (pid {})", std::process::id())), "{out}");
    assert!(out.contains("phase rl, step 12, policy version 11") && out.contains("throughput 1234.6 tokens/s, staleness 1"), "{out}");
    assert!(out.contains(&format!("main  pid={}  host=", std::process::id())) && out.contains("roles=controller,rollout,learner"), "{out}");
    assert!(out.contains(" s ago"), "{out}");
}

#[test]
fn a_reused_pid_is_not_reported_as_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = write_live(dir.path());
    // This process, but not the one that wrote the file: another start time.
    s.start_time = s.start_time.map(|t| t + 1);
    s.write(dir.path()).unwrap();
    let o = launcher(&["status", "--run-dir", dir.path().to_str().unwrap()]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("NOT RUNNING (pid") && stdout(&o).contains("is another process now"), "{}", stdout(&o));
}

#[test]
fn status_of_a_finished_run_says_it_finished_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    write_dead(dir.path(), "done");
    std::fs::write(dir.path().join("summary.json"), "{}").unwrap();
    let o = launcher(&["status", "--run-dir", dir.path().to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains(": finished (pid") && stdout(&o).contains("it finished: summary.json holds its held-out figures"), "{}", stdout(&o));
}

#[test]
fn a_run_dead_before_its_first_checkpoint_is_told_to_start_again_not_to_resume() {
    let dir = tempfile::tempdir().unwrap();
    let pid = write_dead(dir.path(), "warmup");
    let o = launcher(&["status", "--run-dir", dir.path().to_str().unwrap()]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("NOT RUNNING"), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains(&format!("is not running: pid {pid} is gone")) && err.contains("before its first checkpoint, so there is nothing to resume"), "{err}");
    assert!(!err.contains("--resume"), "{err}");

    // With a checkpoint, --resume is what to do.
    std::fs::create_dir_all(dir.path().join("checkpoints/step-00000003")).unwrap();
    let err = stderr(&launcher(&["status", "--run-dir", dir.path().to_str().unwrap()]));
    assert!(err.contains("continue it from its newest checkpoint with") && err.contains("--resume"), "{err}");
}

#[test]
fn status_escapes_control_characters_and_absurd_times() {
    let dir = tempfile::tempdir().unwrap();
    let status = json!({"pid": 12345, "host": "h\u{1b}]0;owned\u{7}", "phase": "\u{1b}[2J\u{1b}[31mred\nline", "updated_at": -1e300,
                        "processes": [{"name": "\u{1b}[1mmain", "pid": 12345, "host": "x", "roles": ["a\rb"]}]});
    std::fs::write(dir.path().join("status.json"), status.to_string()).unwrap();
    let o = launcher(&["status", "--run-dir", dir.path().to_str().unwrap()]);
    let out = stdout(&o) + &stderr(&o);
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\r'), "{out:?}");
    assert!(out.contains("phase \\u{1b}[2J\\u{1b}[31mred\\nline"), "{out}");
    assert!(out.contains("updated at an implausible time (updated_at = -1e300)"), "{out}");
    assert!(out.len() < 4000, "{out}");

    for (at, says) in [(1e300, "implausible"), (0.0, "implausible"), (4e9, "in the future")] {
        let status = json!({"pid": 12345, "updated_at": at});
        std::fs::write(dir.path().join("status.json"), status.to_string()).unwrap();
        let out = stdout(&launcher(&["status", "--run-dir", dir.path().to_str().unwrap()]));
        assert!(out.contains(says) && out.len() < 1000, "{at}: {out}");
    }
}

#[test]
fn status_refuses_a_pid_out_of_range_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    for pid in [json!(0), json!(1), json!(-1), json!(4294967295u64), json!(1e300), json!("12"), json!(null)] {
        std::fs::write(dir.path().join("status.json"), json!({"pid": pid}).to_string()).unwrap();
        let o = launcher(&["status", "--run-dir", dir.path().to_str().unwrap()]);
        assert_eq!(code(&o), 2, "{pid}");
        assert!(stderr(&o).contains("status.json: field \"pid\": expected a process id in 2..="), "{pid}: {}", stderr(&o));
    }
    std::fs::write(dir.path().join("status.json"), json!({"pid": 12345, "step": -3}).to_string()).unwrap();
    let o = launcher(&["status", "--run-dir", dir.path().to_str().unwrap()]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("status.json: field \"step\": invalid value"), "{}", stderr(&o));
}
