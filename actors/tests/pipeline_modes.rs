//! The whole pipeline, short, in every mode: the ledger holds each group
//! once, no trained group is older than the mode's bound, weights arrive
//! digest-checked, `/metrics` serves the named series, a rollout actor
//! killed mid-run is restarted with its groups re-dispatched, and a step's
//! groups are spread over every rollout actor.
use rlmesh_actors::controller::recipe::Recipe;
use rlmesh_actors::controller::run::{run, RunOptions, Summary};
use serde_json::Value;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

fn tokenizer_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let out = std::process::Command::new(root.join("scripts/prepare-models.sh")).output().unwrap();
    assert!(out.status.success());
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim().lines().last().unwrap()).join("smollm2-135m")
}

fn recipe(mode: &str) -> Recipe {
    let text = format!(
        r#"
reward = "process"
[tasks]
size = 64
held_out = 100
tool_fraction = 0.5
[sft]
steps = 2
batch_size = 4
tasks = 256
[rl]
steps = 3
lr = 1e-4
group_size = 2
groups_per_step = 2
max_turns = 2
max_new_tokens = 16
mode = "{mode}"
{extra}
"#,
        extra = if mode == "async" { "max_staleness = 2" } else { "" }
    );
    Recipe::parse(&format!("test-{mode}.toml"), &text).unwrap()
}

fn options(dir: &Path, mode: &str, panic_on: Option<u64>) -> RunOptions {
    RunOptions {
        run_dir: dir.to_path_buf(),
        recipe: recipe(mode),
        rollout_actors: 1,
        tokenizer_dir: tokenizer_dir(),
        max_steps: None,
        sft_steps: None,
        metrics_addr: "127.0.0.1:0".into(),
        panic_rollout_on_request: panic_on,
        progress: false,
        eval_limit: Some(4),
        resume: false,
        fleet: None,
        record_batches: false,
    }
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Replays the ledger: every group's events in order.
fn ledger(dir: &Path) -> HashMap<u64, Vec<String>> {
    let mut groups: HashMap<u64, Vec<String>> = HashMap::new();
    for line in std::fs::read_to_string(dir.join("ledger.jsonl")).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        if let Some(g) = v["group"].as_u64() {
            groups.entry(g).or_default().push(v["event"].as_str().unwrap().to_string());
        }
    }
    groups
}

fn check_run(dir: &Path, summary: &Summary, bound: u64) {
    assert_eq!(summary.steps, 3);
    assert_eq!(summary.eval_tasks, 4);
    let groups = ledger(dir);
    assert!(!groups.is_empty());
    for (g, events) in &groups {
        let trained = events.iter().filter(|e| *e == "trained").count();
        let dropped = events.iter().filter(|e| *e == "dropped").count();
        assert!(trained + dropped == 1, "group {g}: {events:?} must end trained or dropped exactly once");
        assert_eq!(events[0], "dispatch", "group {g}: {events:?}");
    }
    let rows: Vec<Value> = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 3);
    // Progress reaches a file too (logs, Slurm), each long phase's lines with an ETA.
    let log = std::fs::read_to_string(dir.join("progress.log")).unwrap();
    assert!(log.lines().any(|l| l.contains("] sft 1/") && l.contains("ETA")), "{log}");
    assert!(log.lines().any(|l| l.contains("] rl 3/3 ") && l.contains("ETA 0m00s")), "{log}");
    assert!(log.lines().any(|l| l.contains("done: held-out success")), "{log}");
    for r in &rows {
        assert!(r["staleness_max"].as_u64().unwrap() <= bound, "{r}");
    }
    check_step_timing(&rows, bound == 0);
    let trained_rows = std::fs::read_to_string(dir.join("rollouts.jsonl")).unwrap().lines().count();
    let trained_groups: usize = groups.values().filter(|e| e.iter().any(|x| x == "trained")).count();
    assert_eq!(trained_rows, trained_groups * 2, "one error-analysis row per trained rollout");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    for k in ["trajectory_success", "final_answer_accuracy", "unnecessary_tool_rate", "repeated_call_rate", "eval_tasks", "steps", "wall_seconds", "recipe"] {
        assert!(s.get(k).is_some(), "summary.json lacks {k}");
    }
    // The final checkpoint is a transformers-style directory.
    assert!(dir.join("checkpoints/latest/model.safetensors").exists());
    assert!(dir.join("checkpoints/latest/config.json").exists());
}

/// Each step's own wall time and phases (what `launcher bench grpo` reads):
/// the step times are the gaps between the runs' clocks, and with no overlap
/// (sync) the phases fit inside their step.
fn check_step_timing(rows: &[Value], sync: bool) {
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or_else(|| panic!("metrics row lacks {k}: {r}"));
    for w in rows.windows(2) {
        let gap = f(&w[1], "seconds") - f(&w[0], "seconds");
        assert!((f(&w[1], "step_seconds") - gap).abs() < 0.05, "step_seconds {} against the clock's {gap}", f(&w[1], "step_seconds"));
    }
    for r in rows {
        assert!(r["generated_tokens"].as_u64().unwrap() > 0, "{r}");
        let phases: Vec<f64> = ["generate", "tools", "reward", "train", "sync"].iter().map(|p| f(r, &format!("phase/{p}_seconds"))).collect();
        assert!(phases.iter().all(|&p| p >= 0.0) && phases[0] > 0.0 && phases[3] > 0.0, "{r}");
        if sync {
            assert!(phases.iter().sum::<f64>() <= f(r, "step_seconds") + 0.01, "sync phases overlap: {r}");
        }
    }
}

#[test]
fn every_mode_trains_each_group_once_within_the_staleness_bound() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (mode, bound) in [("sync", 0), ("one_step_off", 1), ("async", 2)] {
        let dir = tempfile::tempdir().unwrap();
        let opts = options(dir.path(), mode, None);
        let d = dir.path().to_path_buf();
        // Scrape /metrics while the run is training.
        let scraper = std::thread::spawn(move || {
            for _ in 0..1200 {
                if let Ok(text) = std::fs::read_to_string(d.join("status.json")) {
                    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    if v["phase"] == "rl" {
                        return Some(http_get(v["metrics_addr"].as_str().unwrap(), "/metrics"));
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            None
        });
        let summary = rt.block_on(run(opts)).unwrap();
        check_run(dir.path(), &summary, bound);
        if mode == "sync" {
            // A second run into the same directory starts a fresh ledger; the first is kept aside.
            let again = rt.block_on(run(options(dir.path(), mode, None))).unwrap();
            check_run(dir.path(), &again, bound);
            let parent = dir.path().parent().unwrap();
            let stem = dir.path().file_name().unwrap().to_string_lossy().to_string();
            let kept: Vec<PathBuf> = std::fs::read_dir(parent)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&format!("{stem}.prev-")))
                .collect();
            assert_eq!(kept.len(), 1, "{kept:?}");
            check_run(&kept[0], &summary, bound);
            std::fs::remove_dir_all(&kept[0]).unwrap();
            let body = scraper.join().unwrap().expect("the run reached the rl phase and served /metrics");
            // The warm-up's progress is on /metrics too (it is most of the job).
            let warmup_steps: f64 = body.lines().find_map(|l| l.strip_prefix("rlmesh_warmup_step ")).and_then(|v| v.trim().parse().ok()).expect("rlmesh_warmup_step");
            assert!(warmup_steps >= 1.0, "{body}");
            for series in ["rlmesh_warmup_loss", "rlmesh_learner_loss", "rlmesh_reward_component", "rlmesh_trajectory_success", "rlmesh_groups_trained_total", "rlmesh_staleness_bucket", "rlmesh_weight_sync_seconds_count"] {
                assert!(body.contains(series), "/metrics lacks {series}:\n{body}");
            }
        }
    }
}

#[test]
fn a_killed_rollout_actor_is_restarted_and_nothing_is_lost_or_doubled() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The rollout actor panics on its third generation request: the first RL
    // request, after the greedy and the sampled evaluation of the warm-up.
    let summary = rt.block_on(run(options(dir.path(), "sync", Some(3)))).unwrap();
    check_run(dir.path(), &summary, 0);
    assert!(summary.actor_restarts >= 1, "{summary:?}");
    let groups = ledger(dir.path());
    let redispatched = groups.values().filter(|e| e.iter().any(|x| x == "redispatch")).count();
    assert_eq!(redispatched, 2, "the lost request's two groups are sent out again: {groups:?}");
}

/// Four rollout actors in the controller's process: every step's groups are
/// spread over all four (a request used to carry a whole step, so only
/// `1 + max_staleness` actors worked), the ledger still trains each group
/// exactly once within the mode's bound, and the rollout role's idle ratio
/// and every actor's requests are on `/metrics`.
#[test]
fn every_rollout_actor_works_on_every_step() {
    const ACTORS: usize = 4;
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (mode, bound) in [("sync", 0u64), ("one_step_off", 1)] {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(dir.path(), mode, None);
        opts.rollout_actors = ACTORS;
        opts.recipe.rl.groups_per_step = ACTORS;
        opts.recipe.rl.max_new_tokens = 12;
        let d = dir.path().to_path_buf();
        // Scrape /metrics once the first step's record is written.
        let scraper = std::thread::spawn(move || {
            for _ in 0..3000 {
                let status = std::fs::read_to_string(d.join("status.json")).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok());
                if let Some(v) = status.filter(|v| v["phase"] == "rl" && v["step"].as_u64().is_some_and(|s| s >= 1)) {
                    return Some(http_get(v["metrics_addr"].as_str().unwrap(), "/metrics"));
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            None
        });
        let summary = rt.block_on(run(opts)).unwrap();
        assert_eq!(summary.steps, 3);
        let groups = ledger(dir.path());
        for (g, events) in &groups {
            let ends = events.iter().filter(|e| *e == "trained" || *e == "dropped").count();
            assert_eq!(ends, 1, "{mode}: group {g}: {events:?}");
            assert_eq!(events.iter().filter(|e| *e == "dispatch").count(), 1, "{mode}: group {g}: {events:?}");
        }
        let trained = groups.values().filter(|e| e.iter().any(|x| x == "trained")).count();
        assert_eq!(trained, 3 * ACTORS, "{mode}: every step trained its {ACTORS} groups");
        let steps: Vec<Value> = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(steps.len(), 3);
        for r in &steps {
            assert!(r["staleness_max"].as_u64().unwrap() <= bound, "{mode}: {r}");
            if mode == "sync" {
                // A sync step's groups are all out at once: one to each actor.
                assert_eq!(r["rollout_actors_answering"], ACTORS, "{mode}: step {} answered by fewer than every actor", r["step"]);
            }
        }
        // Each actor generated for training (the evaluation's requests are not counted here).
        let tokens = &summary.counters.generated_tokens;
        for i in 0..ACTORS {
            assert!(tokens.get(&format!("rollout-{i}")).is_some_and(|&n| n > 0), "{mode}: rollout-{i} generated nothing: {tokens:?}");
        }
        let body = scraper.join().unwrap().expect("the run reached its first RL step and served /metrics");
        let idle: f64 = body
            .lines()
            .find_map(|l| l.strip_prefix("rlmesh_idle_ratio{actor_role=\"rollout\"} "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no rollout idle ratio on /metrics:\n{body}"));
        assert!((0.0..1.0).contains(&idle), "{mode}: the rollout actors worked during the step: idle ratio {idle}");
        let per_actor = body.lines().filter(|l| l.starts_with("rlmesh_generate_seconds_count{actor=\"rollout-")).count();
        assert_eq!(per_actor, ACTORS, "{mode}: every actor's requests are timed:\n{body}");
    }
}
