//! A user's own files through `launcher up`: bad task and warm-up files are
//! refused with exit 2, naming file:line:field, before anything is created;
//! verifiers that crash, hang or answer garbage now and then make their
//! groups unscorable — dropped, counted, replaced — and the run finishes with
//! every group trained at most once.
mod common;

use common::*;
use std::io::Write;
use std::path::Path;


const RL: &str = "[rl]\nsteps = 3\ngroup_size = 2\ngroups_per_step = 2\nmax_turns = 2\nmax_new_tokens = 8\n";

#[test]
fn bad_files_are_refused_naming_file_line_and_field_with_nothing_created() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let good = "{\"prompt\": \"What is 2 plus 3?\", \"answer\": \"5\"}\n";
    let mut long = String::from("{\"prompt\": \"");
    long.push_str(&"x".repeat(17 << 20));
    long.push_str("\"}\n");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("missing.jsonl", format!("{good}{{\"answer\": \"5\"}}\n").into_bytes(), "missing.jsonl:2: missing field \"prompt\""),
        ("wrong_type.jsonl", format!("{good}{good}{{\"prompt\": \"p\", \"requires_tool\": \"yes\"}}\n").into_bytes(), "wrong_type.jsonl:3: field \"requires_tool\": expected a boolean"),
        ("empty.jsonl", Vec::new(), "empty.jsonl: "),
        ("long.jsonl", format!("{good}{long}").into_bytes(), "long.jsonl:2"),
        ("latin1.jsonl", [good.as_bytes(), b"{\"prompt\": \"caf\xe9\"}\n"].concat(), "latin1.jsonl:2"),
    ];
    for (name, bytes, want) in cases {
        std::fs::write(d.join(name), bytes).unwrap();
        let run = d.join(format!("run-{name}"));
        let o = up_recipe(d, &format!("reward = \"process\"\n[tasks]\nfile = \"{name}\"\nheld_out = 1\n{RL}"), &run);
        assert_eq!(code(&o), 2, "{name}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{name}: wanted {want:?} in\n{}", stderr(&o));
        assert!(!run.exists(), "{name}: a refused run creates nothing");
    }
    // A warm-up file is checked the same way.
    tasks_file(&d.join("tasks.jsonl"), 8);
    std::fs::write(d.join("sft.jsonl"), "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistent\", \"content\": \"x\"}]}\n").unwrap();
    let run = d.join("run-sft");
    let o = up_recipe(d, &format!("reward = \"process\"\n[tasks]\nfile = \"tasks.jsonl\"\nheld_out = 2\n[sft]\nfile = \"sft.jsonl\"\nsteps = 2\n{RL}"), &run);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("sft.jsonl:1") && stderr(&o).contains("role"), "{}", stderr(&o));
    assert!(!run.exists());
    // A task that needs a tool nothing offers.
    std::fs::write(d.join("odd.jsonl"), "{\"prompt\": \"p\", \"tools\": [\"weather\"]}\n{\"prompt\": \"q\"}\n").unwrap();
    let run = d.join("run-odd");
    let o = up_recipe(d, &format!("reward = \"process\"\n[tasks]\nfile = \"odd.jsonl\"\nheld_out = 1\n{RL}"), &run);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("weather"), "{}", stderr(&o));
    assert!(!run.exists());
    // A tool server that cannot start: its name and the end of its stderr.
    tasks_file(&d.join("tasks.jsonl"), 8);
    std::fs::write(d.join("broken.py"), "import sys\nsys.stderr.write('no module named shop_data\\n')\nsys.exit(1)\n").unwrap();
    let run = d.join("run-server");
    let o = up_recipe(d, &format!("reward = \"process\"\n[tasks]\nfile = \"tasks.jsonl\"\nheld_out = 2\n[[tool_server]]\nname = \"shop\"\ncommand = [\"python3\", \"broken.py\"]\n{RL}"), &run);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("shop") && stderr(&o).contains("no module named shop_data"), "{}", stderr(&o));
    assert!(!run.exists());
}

/// A verifier that fails one request in `every`, the way `how` says, and otherwise checks the answer.
const FLAKY: &str = r#"
import json, sys, time
how, every = sys.argv[1], int(sys.argv[2])
seen = 0
for line in sys.stdin:
    req = json.loads(line)
    seen += 1
    if seen % every == 0:
        if how == "crash":
            sys.exit(1)
        if how == "sleep":
            time.sleep(30)
        if how == "garbage":
            print("{not a response", flush=True)
            continue
    ok = str(req["task"]["answer"]) in req["completion"]
    print(json.dumps({"id": req["id"], "score": 1.0 if ok else 0.0}), flush=True)
"#;

#[test]
fn failing_verifiers_drop_their_groups_as_unscorable_and_the_run_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    tasks_file(&d.join("tasks.jsonl"), 40);
    std::fs::write(d.join("flaky.py"), FLAKY).unwrap();
    let v = |how: &str, every: u32| format!("[[reward_function]]\nname = \"{how}\"\ncommand = [\"python3\", \"flaky.py\", \"{how}\", \"{every}\"]\nweight = 0.5\ntimeout_s = 2\n");
    let recipe = format!("reward = \"process\"\n[tasks]\nfile = \"tasks.jsonl\"\nheld_out = 4\n{}{}{}{RL}", v("crash", 9), v("sleep", 11), v("garbage", 7));
    let run = d.join("run");
    let o = up_recipe(d, &recipe, &run);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 3);
    let dropped = summary["counters"]["groups_dropped"]["unscorable"].as_u64().unwrap_or(0);
    assert!(dropped > 0, "some groups must have met a failing verifier: {}", summary["counters"]);
    // Exactly once: no group trained twice, none both trained and dropped, every one dispatched accounted for.
    let (trained, _) = ledger_counts(&run);
    assert!(trained.values().all(|&n| n == 1), "{trained:?}");
    let mut dropped_ids = std::collections::HashSet::new();
    for e in jsonl(&run.join("ledger.jsonl")) {
        if e["event"] == "dropped" && e["reason"] == "unscorable" {
            let id = e["group"].as_u64().unwrap();
            assert!(!trained.contains_key(&id), "group {id} was dropped as unscorable and trained");
            dropped_ids.insert(id);
        }
    }
    assert_eq!(dropped_ids.len() as u64, dropped);
    // The trained steps saw only scorable rollouts: every total is a number, with each verifier's value.
    for row in jsonl(&run.join("metrics.jsonl")).iter().filter(|r| r.get("step").is_some() && r.get("reward_mean").is_some()) {
        assert!(row["reward_mean"].as_f64().is_some_and(f64::is_finite), "{row}");
        assert!(row.get("reward_function/verifier:crash").is_some(), "{row}");
    }
}

/// A task whose reset always fails (its `env_state` is refused by the reset
/// tool) fails every request it is in: its group is retried on its own, then
/// dropped as unscorable and replaced, and the run finishes; the other
/// groups of its first request train. (Before, the controller re-dispatched
/// it for ever.)
#[test]
fn a_group_whose_reset_always_fails_is_dropped_and_the_run_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("counter.py"), COUNTER).unwrap();
    let mut f = std::fs::File::create(d.join("tasks.jsonl")).unwrap();
    for i in 0..16 {
        let (id, start) = if i % 5 == 1 { (format!("bad-{i}"), -1) } else { (format!("good-{i}"), i) };
        writeln!(f, "{}", serde_json::json!({"id": id, "prompt": "Add one to the counter.", "answer": "1", "env_state": {"start": start}})).unwrap();
    }
    let recipe = format!("reward = \"process\"\n[tasks]\nfile = \"tasks.jsonl\"\nheld_out = 1\n[[tool_server]]\nname = \"counter\"\ncommand = [\"python3\", \"counter.py\"]\nreset_tool = \"reset\"\n{RL}");
    let run = d.join("run");
    let o = up_recipe(d, &recipe, &run);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 3);
    let log = stderr(&o);
    let dropped_lines: Vec<&str> = log.lines().filter(|l| l.contains("dropped as unscorable")).collect();
    assert!(!dropped_lines.is_empty(), "a bad task must have come up in 3 steps: {log}");
    for l in &dropped_lines {
        assert!(l.contains("(task bad-") && l.contains("failed in 3 requests") && l.contains("start must be at least 0, got -1"), "{l}");
    }
    assert_eq!(summary["counters"]["groups_dropped"]["unscorable"].as_u64(), Some(dropped_lines.len() as u64), "{}", summary["counters"]);
    let (trained, _) = ledger_counts(&run);
    assert!(trained.values().all(|&n| n == 1), "{trained:?}");
    assert_eq!(trained.len(), 6, "3 steps of 2 groups: {trained:?}");
    for e in jsonl(&run.join("ledger.jsonl")) {
        if e["event"] == "dropped" {
            assert!(!trained.contains_key(&e["group"].as_u64().unwrap()), "{e}");
        }
    }
}

/// `examples/tool-agent` as a user runs it, cut to 2 warm-up and 2 RL steps: SmolLM2 with the shop's
/// MCP server, the JSONL tasks, the warm-up file and the verifier, to a finished run.
#[test]
fn the_example_trains_two_rl_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let recipe = repo().join("examples/tool-agent/recipe.toml");
    let args = ["up", "deploy/local.toml", "--recipe", recipe.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0"];
    let o = launcher(&[&args[..], &["--sft-steps", "2", "--max-steps", "2", "--eval-limit", "4", "--record-batches"]].concat());
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 2);
    let (trained, _) = ledger_counts(&run);
    assert!(trained.len() == 8 && trained.values().all(|&n| n == 1), "2 steps of 4 groups, each trained once: {trained:?}");
    let steps: Vec<serde_json::Value> = jsonl(&run.join("metrics.jsonl")).into_iter().filter(|r| r.get("reward_mean").is_some()).collect();
    assert_eq!(steps.len(), 2);
    for row in &steps {
        // The verifier scored every trained rollout, and a group's prompt was computed once.
        assert!(row["reward_function/verifier:catalogue"].as_f64().is_some_and(|v| (0.0..=1.0).contains(&v)), "{row}");
        assert!(row["learner_computed_per_trained"].as_f64().is_some_and(|r| r > 0.0), "{row}");
    }
    // Every task id in the ledger comes from the file.
    let rollouts = jsonl(&run.join("rollouts.jsonl"));
    assert!(!rollouts.is_empty() && rollouts.iter().all(|r| r["prompt_id"].as_str().is_some_and(|id| id.starts_with("shop-"))));

    // `launcher reward --recipe` scores the recorded rollouts offline to the
    // totals (and each function's value) the live run trained on.
    let scored = run.join("scored.jsonl");
    let live = jsonl(&scored);
    assert_eq!(live.len(), 32, "2 steps × 4 groups × 4 rollouts");
    let o = launcher(&["reward", "--recipe", recipe.to_str().unwrap(), "--input", scored.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let offline: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(offline.len(), live.len());
    let mut verified = 0;
    for (a, b) in live.iter().zip(&offline) {
        let (x, y) = (a["total"].as_f64().unwrap(), b["total"].as_f64().unwrap());
        assert!((x - y).abs() < 1e-12, "live {x} offline {y}: {b}");
        assert_eq!(a["functions"], b["functions"], "{b}");
        verified += b["functions"]["verifier:catalogue"].is_number() as usize;
    }
    assert!(verified > 0, "the verifier's values were compared, not only the rubric's");

    // The final checkpoint in transformers: its own tokenizer and chat template
    // render the prompts rlmesh rendered in the run (the script exits 1 on a
    // difference), and its log-probs of whole rollouts equal rlmesh's.
    let checkpoint = run.join("checkpoints/latest");
    let o = std::process::Command::new("python3")
        .arg(repo().join("launcher/tests/user_work/transformers_check.py"))
        .args([checkpoint.as_os_str(), scored.as_os_str(), repo().join("examples/tool-agent").as_os_str(), "4".as_ref()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let oracle: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(oracle.len(), 4);
    let ids: String = oracle.iter().map(|r| format!("{}\n", serde_json::json!({"token_ids": r["token_ids"]}))).collect();
    let ids_file = tmp.path().join("ids.jsonl");
    std::fs::write(&ids_file, ids).unwrap();
    let o = launcher(&["score", "--model", checkpoint.to_str().unwrap(), "--input", ids_file.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let ours: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for (a, b) in oracle.iter().zip(&ours) {
        let (a, b): (Vec<f64>, Vec<f64>) = (serde_json::from_value(a["logprobs"].clone()).unwrap(), serde_json::from_value(b["logprobs"].clone()).unwrap());
        assert!(a.len() > 100 && a.len() == b.len());
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-4, "transformers and rlmesh differ by {worst} on the final checkpoint");
    }
}

/// A stateful environment served over MCP: one server process per rollout,
/// reset with the task's `env_state`, graded by its hidden reward tool. It logs
/// every start (with its parent, the process that started it) and every grade.
const COUNTER: &str = r#"
import os, random, sys
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("counter")
state = {"start": None, "count": 0}
os.makedirs("started", exist_ok=True)
open(f"started/{os.getpid()}", "w").write(str(os.getppid()))

@server.tool()
def increment() -> str:
    """Adds one to the counter and returns it."""
    state["count"] += 1
    return str(state["count"])

@server.tool()
def reset(start: int) -> str:
    """Hidden: sets the counter (the server dies instead while a file `broken` exists); refuses a negative start."""
    if os.path.exists("broken"):
        os._exit(3)
    if start < 0:
        raise ToolError(f"start must be at least 0, got {start}")
    state.update(start=start, count=start)
    return f"The counter is at {start}."

@server.tool()
def get_reward() -> str:
    """Hidden: a grade that depends on this rollout's state and on the process (so a group's rollouts differ)."""
    value = state["count"] / 10 + random.Random(os.getpid()).randint(1, 9) / 100
    with open(f"grades-{os.getpid()}", "a") as f:
        f.write(f"{state['start']} {value!r}\n")
    return repr(value)

server.run("stdio")
"#;

/// `session = "per_rollout"` under `local-procs`: every rollout process starts
/// its own servers, each rollout's state is reset from its task's `env_state`,
/// the reward tool's grade is the rollout's total (the rubric weighted 0), the
/// learner is sent advantages ordered by it, and no server outlives the run.
#[test]
fn per_rollout_servers_run_in_every_rollout_process_and_their_grades_reach_the_learner() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("counter.py"), COUNTER).unwrap();
    let mut f = std::fs::File::create(d.join("tasks.jsonl")).unwrap();
    for i in 0..24 {
        writeln!(f, "{}", serde_json::json!({"id": format!("count-{i}"), "prompt": "Add one to the counter.", "answer": (i % 5 + 1).to_string(), "env_state": {"start": i % 5}})).unwrap();
    }
    let recipe = format!(
        "reward = \"process\"\n[tasks]\nfile = \"tasks.jsonl\"\nheld_out = 2\n[[tool_server]]\nname = \"counter\"\ncommand = [\"python3\", \"counter.py\"]\nsession = \"per_rollout\"\nreset_tool = \"reset\"\nreward_tool = \"get_reward\"\ntimeout_s = 20\n[reward_weights]\nprocess = 0\n{}",
        RL.replace("steps = 3", "steps = 2")
    );
    std::fs::write(d.join("recipe.toml"), recipe).unwrap();
    let topo = shipped_on_free_ports("local-procs", d);
    let run = d.join("run");
    let o = launcher(&["up", topo.to_str().unwrap(), "--recipe", d.join("recipe.toml").to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0", "--eval-limit", "2", "--record-batches"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    // Every rollout process started its own servers (and logged them).
    for i in 0..2 {
        let log = std::fs::read_to_string(run.join(format!("logs/local_rollout-{i}.log"))).unwrap();
        assert!(log.contains("tool server counter ready: 1 tools (increment)"), "rollout-{i}: {log}");
    }
    let mut servers = Vec::new();
    let mut parents = std::collections::HashSet::new();
    for e in std::fs::read_dir(d.join("started")).unwrap() {
        let e = e.unwrap();
        servers.push(e.file_name().to_str().unwrap().parse::<i32>().unwrap());
        parents.insert(std::fs::read_to_string(e.path()).unwrap());
    }
    assert!(parents.len() >= 3, "the controller (its start-up check) and both rollout processes start servers: {parents:?}");
    // Each trained rollout's total is the grade its own server gave, from the task's env_state.
    let mut grades = std::collections::HashSet::new();
    for e in std::fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().unwrap().to_str().unwrap().starts_with("grades-") {
            grades.extend(std::fs::read_to_string(&p).unwrap().lines().map(str::to_string));
        }
    }
    let scored = jsonl(&run.join("scored.jsonl"));
    assert_eq!(scored.len(), 8, "2 steps × 2 groups × 2 rollouts");
    let mut value = std::collections::HashMap::new();
    for r in &scored {
        let v = r["functions"]["env:counter"].as_f64().unwrap();
        assert!((r["total"].as_f64().unwrap() - v).abs() < 1e-12, "{r}");
        let start = r["task"]["env_state"]["start"].as_i64().unwrap();
        // The tiny model calls no tool, so the count is the start the reset set.
        // (within an ulp: serde_json's default parser may round the last digit)
        let given = |g: &String| g.split_once(' ').is_some_and(|(s, x)| s == start.to_string() && (x.parse::<f64>().unwrap() - v).abs() < 1e-12);
        assert!(grades.iter().any(given), "{start} {v:?} not among the servers' grades {grades:?}");
        value.insert((r["group"].as_u64().unwrap(), r["sample"].as_u64().unwrap()), v);
    }
    // The learner was sent advantages in the grades' order within each group.
    let mut compared = 0;
    for step in jsonl(&run.join("batches.jsonl")) {
        let seqs = step["sequences"].as_array().unwrap();
        for a in seqs {
            for b in seqs.iter().filter(|b| b["group"] == a["group"] && b["sample"] != a["sample"]) {
                let key = |s: &serde_json::Value| (s["group"].as_u64().unwrap(), s["sample"].as_u64().unwrap());
                let adv = |s: &serde_json::Value| {
                    let mask = s["loss_mask"].as_array().unwrap();
                    let i = mask.iter().position(|m| m.as_u64() == Some(1)).unwrap();
                    s["advantages"][i].as_f64().unwrap()
                };
                let (va, vb) = (value[&key(a)], value[&key(b)]);
                assert_eq!(va > vb, adv(a) > adv(b), "grades {va} {vb}, advantages {} {}", adv(a), adv(b));
                compared += 1;
            }
        }
    }
    assert!(compared > 0);
    // No server outlives the run.
    std::thread::sleep(std::time::Duration::from_millis(500));
    for pid in servers {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running = stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z'));
        assert!(!running, "tool server {pid} outlived the run: {stat}");
    }
}

/// A tool server past its restart budget stops the run at a checkpoint,
/// naming the server; once it is mended, `--resume` finishes the run with no
/// group trained twice. (It took 10 minutes while the tiny model's tokenizer
/// rendered all 200 tasks, starting a server for each; now 2.)
#[test]
fn a_server_past_its_restart_budget_stops_the_run_and_resume_trains_no_group_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("counter.py"), COUNTER).unwrap();
    let mut f = std::fs::File::create(d.join("tasks.jsonl")).unwrap();
    for i in 0..200 {
        writeln!(f, "{}", serde_json::json!({"id": format!("count-{i}"), "prompt": "Add one to the counter.", "answer": "1", "env_state": {"start": i % 5}})).unwrap();
    }
    let recipe = format!(
        "reward = \"process\"\n[tasks]\nfile = \"tasks.jsonl\"\nheld_out = 2\n[[tool_server]]\nname = \"counter\"\ncommand = [\"python3\", \"counter.py\"]\nsession = \"per_rollout\"\nreset_tool = \"reset\"\nreward_tool = \"get_reward\"\ntimeout_s = 20\nmax_restarts = 2\n[reward_weights]\nprocess = 0\n{}",
        RL.replace("steps = 3", "steps = 6")
    );
    let path = d.join("recipe.toml");
    std::fs::write(&path, recipe).unwrap();
    let run = d.join("run");
    let args = ["up", "deploy/local.toml", "--recipe", path.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0", "--eval-limit", "2"];
    let log = std::fs::File::create(d.join("up.log")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_launcher"))
        .current_dir(repo())
        .args(args)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    // Break the server once the first RL step is recorded.
    let trained = |run: &Path| jsonl_if_any(&run.join("metrics.jsonl")).iter().filter(|r| r.get("reward_mean").is_some()).count();
    let t = std::time::Instant::now();
    while trained(&run) == 0 {
        assert!(t.elapsed().as_secs() < 600 && child.try_wait().unwrap().is_none(), "no RL step: {}", std::fs::read_to_string(d.join("up.log")).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    std::fs::write(d.join("broken"), "").unwrap();
    let status = child.wait().unwrap();
    let log = std::fs::read_to_string(d.join("up.log")).unwrap();
    assert!(!status.success(), "{log}");
    assert!(log.contains("a tool server was given up") && log.contains("counter"), "{log}");
    let before = trained(&run);
    assert!(before < 6, "the run stopped early: {before} steps");
    assert!(run.join("checkpoints/latest/model.safetensors").exists(), "it stopped at a checkpoint");

    std::fs::remove_file(d.join("broken")).unwrap();
    let o = launcher(&[&args[..], &["--resume"]].concat());
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 6);
    assert_trained_once_replayed(&run);
}

fn jsonl_if_any(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}
