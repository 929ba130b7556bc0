//! `launcher up --resume`: a run killed with SIGKILL mid-RL continues from its
//! newest checkpoint, and the ledger, the metrics and the error-analysis table
//! end up as if it had never stopped — no group trained twice, no step logged twice.
mod common;

use common::*;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const STEPS: u64 = 10;
const GROUPS_PER_STEP: u64 = 2;
const GROUP_SIZE: usize = 2;

fn recipe(dir: &Path, name: &str, lr: &str) -> String {
    let text = format!(
        r#"
reward = "process"
[model]
hidden = 32
layers = 1
[tasks]
size = 64
held_out = 100
[sft]
steps = 2
batch_size = 4
tasks = 256
[rl]
steps = {STEPS}
lr = {lr}
group_size = {GROUP_SIZE}
groups_per_step = {GROUPS_PER_STEP}
max_turns = 2
max_new_tokens = 16
checkpoint_every = 3
"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn up(recipe: &str, run: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_launcher"));
    c.current_dir(repo()).args(["up", "deploy/local.toml", "--recipe", recipe, "--run-dir", run.to_str().unwrap()]);
    c.args(["--metrics-addr", "127.0.0.1:0", "--eval-limit", "4"]).args(extra);
    c
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_killed_run_resumes_without_training_a_group_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = recipe(tmp.path(), "resume-test", "1e-4");
    let run = tmp.path().join("run");

    // Nothing to resume yet: refused as bad input, and nothing is created.
    let o = up(&recipe, &run, &["--resume"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(!run.exists());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no checkpoint to resume from"), "{}", String::from_utf8_lossy(&o.stderr));

    // Start, and kill -9 once RL is past the checkpoint of step 3 but before the end.
    let mut child = up(&recipe, &run, &[]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let status: Option<Value> = std::fs::read_to_string(run.join("status.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
        let step = status.as_ref().filter(|s| s["phase"] == "rl").and_then(|s| s["step"].as_u64()).unwrap_or(0);
        if step >= 5 {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended before it could be killed");
        assert!(Instant::now() < deadline, "the run never reached RL step 5");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!run.join("summary.json").exists());
    let before = lines(&run.join("metrics.jsonl")).len();
    assert!(before >= 5, "{before} metric rows before the kill");

    // A crash mid-write leaves a torn last ledger line.
    let mut ledger = std::fs::read(run.join("ledger.jsonl")).unwrap();
    ledger.extend_from_slice(b"{\"event\":\"disp");
    std::fs::write(run.join("ledger.jsonl"), &ledger).unwrap();

    // Another recipe is refused, naming the stored one, and the refusal changes no file.
    let elsewhere = tmp.path().join("other");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let other = self::recipe(&elsewhere, "resume-test", "2e-4");
    let o = up(&other, &run, &["--resume"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(std::fs::read(run.join("ledger.jsonl")).unwrap(), ledger, "a refused resume rewrote the ledger");
    assert!(String::from_utf8_lossy(&o.stderr).contains("the run was started with another recipe: `rl.lr` was 0.0001 in its config.json, is 0.0002 now"), "{}", String::from_utf8_lossy(&o.stderr));

    // A copy whose ledger lost its records is refused, not resumed.
    let damaged = tmp.path().join("damaged");
    assert!(Command::new("cp").arg("-a").arg(&run).arg(&damaged).status().unwrap().success());
    std::fs::write(damaged.join("ledger.jsonl"), "").unwrap();
    let o = up(&recipe, &damaged, &["--resume"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("the ledger lost records, refusing to resume"), "{}", String::from_utf8_lossy(&o.stderr));

    // A run started by an earlier build has no entry for a field added since
    // (here `model.number_chunk`): it reads as the default and the run resumes.
    let cfg_path = run.join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    assert!(cfg["recipe"]["model"].as_object_mut().unwrap().remove("number_chunk").is_some());
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();

    // Resume to the end.
    let newest = std::fs::read_link(run.join("checkpoints/latest")).map(|l| run.join("checkpoints").join(l)).unwrap();
    let state: Value = serde_json::from_slice(&std::fs::read(newest.join("state.json")).unwrap()).unwrap();
    let before_resume = state["meta"]["data_cursor"]["wall_seconds"].as_f64().unwrap_or(0.0);
    let t = Instant::now();
    let o = up(&recipe, &run, &["--resume"]).output().unwrap();
    let resumed = t.elapsed();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("resuming at RL step 3") || err.contains("resuming at RL step 6"), "{err}");
    let summary: Value = serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], STEPS);
    // The counters carried over the kill: every step's groups, not only the resumed process's.
    assert_eq!(summary["counters"]["groups_trained"], STEPS * GROUPS_PER_STEP, "{summary}");
    // The whole run's wall time: the killed process's to its checkpoint, then the resumed one's.
    let wall = summary["wall_seconds"].as_f64().unwrap();
    assert!(before_resume > 0.0 && wall > before_resume && wall < before_resume + resumed.as_secs_f64(), "{wall} s: {before_resume} s to the checkpoint, {resumed:?} resuming");
    assert_eq!(lines(&run.join("eval_rollouts.jsonl")).len(), 4, "one table of the final policy");

    // The ledger: replaying it, a group is trained at most once between rollbacks,
    // and at the end every step's groups are trained exactly once.
    let mut trained: HashMap<u64, u64> = HashMap::new();
    let mut rollbacks = 0;
    for e in lines(&run.join("ledger.jsonl")) {
        match e["event"].as_str().unwrap() {
            "trained" => {
                let g = e["group"].as_u64().unwrap();
                assert!(trained.insert(g, e["step"].as_u64().unwrap()).is_none(), "group {g} trained twice");
            }
            "rollback" => {
                rollbacks += 1;
                let s = e["step"].as_u64().unwrap();
                trained.retain(|_, step| *step <= s);
            }
            _ => {}
        }
    }
    assert_eq!(rollbacks, 1);
    assert_eq!(trained.len() as u64, STEPS * GROUPS_PER_STEP, "{trained:?}");
    let steps: BTreeSet<u64> = trained.values().copied().collect();
    assert_eq!(steps, (1..=STEPS).collect());

    // Logs: one metrics row per step, one error-analysis row per trained rollout.
    let rows: Vec<u64> = lines(&run.join("metrics.jsonl")).iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(rows, (1..=STEPS).collect::<Vec<_>>());
    assert_eq!(lines(&run.join("rollouts.jsonl")).len(), STEPS as usize * GROUPS_PER_STEP as usize * GROUP_SIZE);
}
