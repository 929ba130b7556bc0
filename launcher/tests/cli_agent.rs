//! `[agent]` through `launcher up`: each rollout runs a Python program on the
//! stock `openai` client against its rollout actor's endpoint; the calls it
//! made become the trajectories the learner trains. Programs that crash or
//! hang are killed, counted and their groups dropped as `failed_agent`, never
//! scored 0, with every group trained at most once.
mod common;

use common::*;

const RL: &str = "[rl]\nsteps = 2\ngroup_size = 2\ngroups_per_step = 2\n";

/// `examples/openai-agent/agent.py` as it is: two RL steps train on the
/// sessions it made, and its rollouts reach the learner as one sequence each.
#[test]
fn the_example_agent_program_trains_two_rl_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    tasks_file(&d.join("tasks.jsonl"), 24);
    let agent = repo().join("examples/openai-agent/agent.py");
    let recipe = format!("reward = \"process\"\n[tasks]\nfile = \"tasks.jsonl\"\nheld_out = 2\n[agent]\ncommand = [\"python3\", {:?}]\ntimeout_s = 120\n{RL}", agent.display().to_string());
    let run = d.join("run");
    let o = up_recipe(d, &recipe, &run);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("the policy's endpoint for agent programs is http://127.0.0.1:"), "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 2);
    assert_trained_once(&run);
    // Each trained rollout is the program's calls: policy tokens, the tool results between them as environment tokens.
    let rollouts = jsonl(&run.join("rollouts.jsonl"));
    assert_eq!(rollouts.len(), 8, "2 steps of 2 groups of 2");
    let trained = jsonl(&run.join("metrics.jsonl")).into_iter().filter(|r| r.get("reward_mean").is_some()).count();
    assert_eq!(trained, 2);
}

const FLAKY_AGENT: &str = r#"
import json, subprocess, sys, time
task = json.loads(sys.stdin.readline())
kind = int(task["id"].split("-")[1]) % 5
if kind == 0:
    sys.exit(3)
if kind == 1:
    subprocess.Popen(["sleep", "301.25"])  # a child that must die with it
    time.sleep(300)
from openai import OpenAI  # about a second of CPU: after the failing kinds, so they fail fast
c = OpenAI(max_retries=0)
r = c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=6)
print(json.dumps({"answer": r.choices[0].message.content, "reward": 0.25 * kind}))
"#;

/// Programs that exit non-zero or hang (with a child) on some tasks: killed at
/// the timeout, their groups dropped as `failed_agent` and replaced, the run
/// finishes with every group trained at most once; the programs' own
/// `reward` is the reward function `agent`; no program or child outlives it.
#[test]
fn crashing_and_hanging_agents_are_dropped_as_failed_agent_and_the_run_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    tasks_file(&d.join("tasks.jsonl"), 40);
    std::fs::write(d.join("flaky.py"), FLAKY_AGENT).unwrap();
    let recipe = format!("reward = \"process\"\n[tasks]\nfile = \"tasks.jsonl\"\nheld_out = 2\n[agent]\ncommand = [\"python3\", \"flaky.py\"]\ntimeout_s = 20\n[reward_weights]\nprocess = 0\n{RL}");
    let run = d.join("run");
    let o = up_recipe(d, &recipe, &run);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let log = stderr(&o);
    assert!(log.contains("dropped as failed_agent") && log.contains("exited with code 3") && log.contains("past its timeout of 20 s"), "{log}");
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 2);
    let dropped = summary["counters"]["groups_dropped"]["failed_agent"].as_u64().unwrap_or(0);
    assert!(dropped > 0, "{}", summary["counters"]);
    let (trained, _) = ledger_counts(&run);
    assert!(trained.values().all(|&n| n == 1), "{trained:?}");
    let failed: Vec<u64> = jsonl(&run.join("ledger.jsonl")).iter().filter(|e| e["event"] == "dropped" && e["reason"] == "failed_agent").map(|e| e["group"].as_u64().unwrap()).collect();
    assert_eq!(failed.len() as u64, dropped);
    assert!(failed.iter().all(|g| !trained.contains_key(g)));
    // The trained steps' rewards are the programs' own (the rubric weighted 0):
    // 0.5, 0.75 or 1.0 (the failing kinds 0 and 1 never reach a step).
    for row in jsonl(&run.join("metrics.jsonl")).iter().filter(|r| r.get("reward_mean").is_some()) {
        let mean = row["reward_function/agent"].as_f64().unwrap_or(f64::NAN);
        assert!((0.5..=1.0).contains(&mean), "{row}");
        assert_eq!(row["reward_mean"], row["reward_function/agent"], "{row}");
    }
    let left = std::process::Command::new("pgrep").args(["-f", "sleep 301.25"]).output().unwrap();
    assert!(left.stdout.is_empty(), "a hanging program's child outlived the run: {}", String::from_utf8_lossy(&left.stdout));
}

const REWRITING_AGENT: &str = r#"
import json, sys
from openai import OpenAI
task = json.loads(sys.stdin.readline())
c = OpenAI(max_retries=0)
first = c.chat.completions.create(model="m", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=6)
# A harness that starts each call afresh instead of keeping the history.
second = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say the answer to: " + task["prompt"]}], max_tokens=6)
print(json.dumps({"answer": second.choices[0].message.content, "reward": len(first.choices[0].message.content or "") % 3 / 2}))
"#;

/// A program whose second call does not extend its first (it rewrote the
/// history): each call is a segment, the last one is the rollout that is
/// scored, and the learner trains both with the rollout's advantage.
#[test]
fn a_history_rewriting_program_trains_one_segment_per_call_with_its_rollouts_advantage() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    tasks_file(&d.join("tasks.jsonl"), 24);
    std::fs::write(d.join("rewrite.py"), REWRITING_AGENT).unwrap();
    let recipe = format!("reward = \"process\"\n[tasks]\nfile = \"tasks.jsonl\"\nheld_out = 2\n[agent]\ncommand = [\"python3\", \"rewrite.py\"]\n[reward_weights]\nprocess = 0\n{RL}");
    let path = d.join("recipe.toml");
    std::fs::write(&path, recipe).unwrap();
    let run = d.join("run");
    let args = ["up", "deploy/local.toml", "--recipe", path.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0", "--eval-limit", "2", "--record-batches"];
    let o = launcher(&args);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_trained_once(&run);
    let mut segments = 0;
    for step in jsonl(&run.join("batches.jsonl")) {
        let seqs = step["sequences"].as_array().unwrap();
        // Per rollout: its scored last call, then its earlier call.
        let mut by_rollout: std::collections::BTreeMap<(u64, u64), Vec<f64>> = Default::default();
        for s in seqs {
            let mask = s["loss_mask"].as_array().unwrap();
            let adv = s["advantages"].as_array().unwrap();
            let trained: Vec<f64> = mask.iter().zip(adv).filter(|(m, _)| m.as_u64() == Some(1)).map(|(_, a)| a.as_f64().unwrap()).collect();
            assert!(!trained.is_empty() && trained.iter().all(|&a| a == trained[0]), "one advantage per sequence: {trained:?}");
            by_rollout.entry((s["group"].as_u64().unwrap(), s["sample"].as_u64().unwrap())).or_default().push(trained[0]);
        }
        assert_eq!(by_rollout.len(), 4, "2 groups of 2 rollouts");
        for (rollout, advantages) in by_rollout {
            assert_eq!(advantages.len(), 2, "{rollout:?}: two calls, two segments");
            assert_eq!(advantages[0], advantages[1], "{rollout:?}: the earlier segment has its rollout's advantage");
            segments += 1;
        }
    }
    assert_eq!(segments, 8, "2 steps of 4 rollouts");
}

/// As `local-procs`: each rollout process serves its own endpoint and runs
/// the programs of the requests it gets; both work, and the ledger holds.
#[test]
fn agent_programs_run_against_each_rollout_process_of_local_procs() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    tasks_file(&d.join("tasks.jsonl"), 24);
    let agent = repo().join("examples/openai-agent/agent.py");
    std::fs::write(d.join("recipe.toml"), format!("reward = \"process\"\n[tasks]\nfile = \"tasks.jsonl\"\nheld_out = 2\n[agent]\ncommand = [\"python3\", {:?}]\n{RL}", agent.display().to_string())).unwrap();
    let topo = shipped_on_free_ports("local-procs", d);
    let run = d.join("run");
    let o = launcher(&["up", topo.to_str().unwrap(), "--recipe", d.join("recipe.toml").to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0", "--eval-limit", "2"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for i in 0..2 {
        let log = std::fs::read_to_string(run.join(format!("logs/local_rollout-{i}.log"))).unwrap();
        assert!(log.contains("the policy's endpoint for agent programs is http://127.0.0.1:"), "rollout-{i} serves its own endpoint: {log}");
    }
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 2);
    let generated = summary["counters"]["generated_tokens"].as_object().unwrap();
    assert!(generated.len() == 2 && generated.values().all(|v| v.as_u64().unwrap() > 0), "both rollout processes served programs: {generated:?}");
    assert_trained_once(&run);
}
