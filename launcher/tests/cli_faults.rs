//! Faults across processes: real `launcher node` children over loopback,
//! killed with SIGKILL in the middle of a run.
//!
//! - a killed rollout process and a killed reward process are started again
//!   (counted, logged, shown by `status.json`), the restarted rollout process
//!   gets the current version and rejoins the weight-sync group, and the run
//!   finishes with every group trained exactly once;
//! - a killed controller takes every node process with it within the
//!   heartbeat deadline, and `launcher up --resume` finishes the run with
//!   nothing trained twice.
mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// RL steps of the restart test: a tiny model's step takes milliseconds, and
/// the restarts (1 s back-off, a start, a setup) must end inside the RL phase.
const STEPS: u32 = 400;

/// Rollouts per RL step: 2 groups of 2.
const ROWS_PER_STEP: u64 = 4;

/// A tiny-model `sync` recipe with enough RL steps for a restart to happen inside it.
fn recipe(dir: &Path, steps: u32) -> String {
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
steps = {steps}
group_size = 2
groups_per_step = 2
max_turns = 2
max_new_tokens = 16
checkpoint_every = 4
mode = "sync"
"#
    );
    let path = dir.join("faults.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// Controller and weight sync in `main`; two rollout processes, a reward process and a learner process.
fn topology(dir: &Path) -> String {
    topology_with_ranks(dir, 1)
}

/// As [`topology`], with `ranks` learner processes.
fn topology_with_ranks(dir: &Path, ranks: u32) -> String {
    let text = format!(
        "name = \"faults\"\n[[nodes]]\nname = \"local\"\nhost = \"127.0.0.1\"\n{}\n\
         [controller]\nnode = \"local\"\nprocess = \"main\"\n[weight_sync]\nnode = \"local\"\nprocess = \"main\"\n\
         [rollout]\nplacement = [{{ node = \"local\", actors = 2 }}]\n[reward]\nplacement = [{{ node = \"local\", actors = 1, process = \"reward\" }}]\n\
         [learner]\nranks = {ranks}\nplacement = [{{ node = \"local\", actors = {ranks} }}]\n",
        free_ports_table(8)
    );
    let path = dir.join("faults-topology.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn start(topology: &str, recipe: &str, run: &Path, log: &Path, extra: &[&str]) -> Child {
    start_with(topology, recipe, run, log, extra, &[])
}

fn start_with(topology: &str, recipe: &str, run: &Path, log: &Path, extra: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_launcher"))
        .current_dir(repo())
        .args(["up", topology, "--recipe", recipe, "--run-dir", run.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0", "--eval-limit", "4"])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

fn status(run: &Path) -> Value {
    std::fs::read_to_string(run.join("status.json")).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or(Value::Null)
}

/// The status entry of the process named `name`.
fn process(status: &Value, name: &str) -> Value {
    status["processes"].as_array().and_then(|ps| ps.iter().find(|p| p["name"] == name).cloned()).unwrap_or(Value::Null)
}

/// Waits until the run has logged `rows` RL steps (the run must not end first).
fn wait_for_steps(child: &mut Child, run: &Path, rows: usize, log: &Path) {
    let t0 = Instant::now();
    loop {
        let n = std::fs::read_to_string(run.join("metrics.jsonl")).map(|s| s.lines().count()).unwrap_or(0);
        if n >= rows {
            return;
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended before step {rows}: {}", std::fs::read_to_string(log).unwrap_or_default());
        assert!(t0.elapsed() < Duration::from_secs(180), "no step {rows} in 180 s: {}", std::fs::read_to_string(log).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kill9(pid: u64) {
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success(), "kill -9 {pid}");
}

fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
}

#[test]
fn killed_rollout_and_reward_processes_are_started_again_and_nothing_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let (topo, recipe) = (topology(tmp.path()), recipe(tmp.path(), STEPS));
    let (run, log) = (tmp.path().join("run"), tmp.path().join("up.log"));
    let mut child = start(&topo, &recipe, &run, &log, &[]);
    wait_for_steps(&mut child, &run, 3, &log);
    let before = status(&run);
    let rollout = process(&before, "local/rollout-0")["pid"].as_u64().expect("rollout-0's pid");
    let reward = process(&before, "local/reward")["pid"].as_u64().expect("the reward process's pid");
    kill9(rollout);
    kill9(reward);
    let exit = child.wait().unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(exit.success(), "the run survives its killed processes:\n{logged}");

    // Started again, once each, and counted.
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["process_restarts"]["local/rollout-0"], 1, "{summary}");
    assert_eq!(summary["process_restarts"]["local/reward"], 1, "{summary}");
    assert!(summary["process_restarts"].get("local/rollout-1").is_none(), "{summary}");
    for name in ["local/rollout-0", "local/reward"] {
        assert!(logged.contains(&format!("restarting {name} (restart 1 of 3)")), "{name}'s restart is logged:\n{logged}");
        assert!(logged.contains(&format!("{name} is back")), "{name} came back:\n{logged}");
    }
    let after = status(&run);
    let r0 = process(&after, "local/rollout-0");
    assert_eq!(r0["restarts"], 1, "{after}");
    assert_ne!(r0["pid"].as_u64(), Some(rollout), "a new rollout-0 process: {after}");
    // It was given the current version, then rejoined the weight-sync group (a later epoch) for the last ones.
    assert_eq!(r0["version"], after["version"], "{after}");
    let r0_log = std::fs::read_to_string(run.join("logs/local_rollout-0.log")).unwrap();
    assert!(r0_log.lines().any(|l| l.contains("joining epoch") && !l.contains("epoch 0 ")), "rollout-0 rejoined a later epoch:\n{r0_log}");
    let r1_log = std::fs::read_to_string(run.join("logs/local_rollout-1.log")).unwrap();
    assert!(r1_log.contains("joining epoch 1 "), "the survivor formed the group again:\n{r1_log}");
    // The killed processes' work went out again; nothing was trained twice or lost.
    assert!(summary["groups"]["redispatched"].as_u64().unwrap() <= 4, "only in-flight groups are re-dispatched: {summary}");
    assert_eq!(summary["steps"], STEPS);
    assert_trained_once_replayed(&run);
    assert_logged_once(&run, STEPS as u64, ROWS_PER_STEP);
    for p in after["processes"].as_array().unwrap().iter().skip(1) {
        let pid = p["pid"].as_u64().unwrap();
        assert!(!alive(pid), "{} (pid {pid}) outlived its run", p["name"]);
    }
}

#[test]
fn a_killed_controller_takes_its_nodes_with_it_and_the_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (topo, recipe) = (topology(tmp.path()), recipe(tmp.path(), 12));
    let (run, log) = (tmp.path().join("run"), tmp.path().join("up.log"));
    let mut child = start(&topo, &recipe, &run, &log, &[]);
    // Past the checkpoint of step 4.
    wait_for_steps(&mut child, &run, 6, &log);
    let nodes: Vec<u64> = status(&run)["processes"].as_array().unwrap().iter().skip(1).map(|p| p["pid"].as_u64().unwrap()).collect();
    assert_eq!(nodes.len(), 4, "two rollout processes, a reward and a learner process");
    kill9(child.id() as u64);
    let _ = child.wait();
    // The control plane's deadline is 5 s: every node leaves soon after.
    let t0 = Instant::now();
    while nodes.iter().any(|&p| alive(p)) {
        assert!(t0.elapsed() < Duration::from_secs(20), "nodes outlived their controller by 20 s: {:?}", nodes.iter().filter(|&&p| alive(p)).collect::<Vec<_>>());
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = t0.elapsed();
    assert!(left < Duration::from_secs(12), "nodes left {left:?} after their controller died");
    for n in ["local_rollout-0", "local_reward", "local_learner-0"] {
        let text = std::fs::read_to_string(run.join(format!("logs/{n}.log"))).unwrap();
        assert!(text.contains("the controller is lost"), "{n} says why it left:\n{text}");
    }
    // The run continues from its last checkpoint.
    let log2 = tmp.path().join("resume.log");
    let mut again = start(&topo, &recipe, &run, &log2, &["--resume"]);
    let exit = again.wait().unwrap();
    assert!(exit.success(), "{}", std::fs::read_to_string(&log2).unwrap());
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 12);
    assert_trained_once_replayed(&run);
    // The counters go on from the checkpoint's: 12 steps of 2 groups in all, not only the resumed ones.
    assert_eq!(summary["counters"]["groups_trained"], 24, "{summary}");
    let redispatched = jsonl(&run.join("ledger.jsonl")).iter().filter(|e| e["event"] == "redispatch").count();
    assert_eq!(summary["counters"]["groups_redispatched"], redispatched as u64, "{summary}");
    assert_logged_once(&run, 12, ROWS_PER_STEP);
}

#[test]
fn a_killed_learner_rank_starts_the_run_again_from_its_checkpoint() {
    killed_learner_rank(1, "local/learner-0");
}

/// With two data-parallel ranks, killing rank 1 stops rank 0 too, and both start again.
#[test]
fn a_killed_learner_rank_of_two_stops_both_and_the_run_starts_again_from_its_checkpoint() {
    killed_learner_rank(2, "local/learner-1");
}

fn killed_learner_rank(ranks: u32, victim: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (topo, recipe) = (topology_with_ranks(tmp.path(), ranks), recipe(tmp.path(), 12));
    let (run, log) = (tmp.path().join("run"), tmp.path().join("up.log"));
    let mut child = start(&topo, &recipe, &run, &log, &[]);
    wait_for_steps(&mut child, &run, 6, &log);
    let before = status(&run);
    let nodes: Vec<u64> = before["processes"].as_array().unwrap().iter().skip(1).map(|p| p["pid"].as_u64().unwrap()).collect();
    kill9(process(&before, victim)["pid"].as_u64().unwrap());
    let exit = child.wait().unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(exit.success(), "the run starts again by itself and finishes:\n{logged}");
    assert!(logged.contains(&format!("a learner rank is lost ({victim} exited")), "{logged}");
    assert!(logged.contains("starting the run again from its newest checkpoint (restart 1 of 3)"), "{logged}");
    // From a checkpoint (every 4 steps; the run may have passed step 8 before the kill landed).
    let from: u64 = logged.split("resuming at RL step ").nth(1).and_then(|r| r.split_whitespace().next()?.parse().ok()).unwrap_or_else(|| panic!("no resume:\n{logged}"));
    assert!(from >= 4 && from.is_multiple_of(4), "resumed at step {from}");
    // The first start's processes all stopped; the second start's are new ones.
    for p in &nodes {
        assert!(!alive(*p), "pid {p} of the first start outlived it");
    }
    let after = status(&run);
    assert_eq!(after["pid"], before["pid"], "the same `up` process (exec), so `launcher down` still finds it");
    assert_trained_once_replayed(&run);
    assert_logged_once(&run, 12, ROWS_PER_STEP);
    let progress = std::fs::read_to_string(run.join("progress.log")).unwrap();
    assert!(progress.contains("restart 1 of 3"), "the progress log says so too:\n{progress}");
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["counters"]["groups_trained"], 24, "counted over both starts: {summary}");
}

/// A learner rank whose collective breaks while every process lives (rank 1
/// shuts its ring down mid-run, as a timed-out NCCL call aborts its
/// communicator): both ranks' steps fail, both processes leave, and the run
/// starts again from its newest checkpoint with the group formed anew,
/// nothing trained or logged twice.
#[test]
fn a_broken_learner_collective_makes_both_ranks_leave_and_the_run_starts_again_from_its_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (topo, recipe) = (topology_with_ranks(tmp.path(), 2), recipe(tmp.path(), 12));
    let (run, log) = (tmp.path().join("run"), tmp.path().join("up.log"));
    // The node processes, started as children of `up`, inherit it.
    let exit = start_with(&topo, &recipe, &run, &log, &[], &[(rlmesh_actors::node::RING_FAULT_ENV, "1:6")]).wait().unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(exit.success(), "the run starts again by itself and finishes:\n{logged}");
    assert!(logged.contains("a learner rank is lost (local/learner-"), "{logged}");
    assert!(logged.contains("starting the run again from its newest checkpoint (restart 1 of 3)"), "{logged}");
    let from: u64 = logged.split("resuming at RL step ").nth(1).and_then(|r| r.split_whitespace().next()?.parse().ok()).unwrap_or_else(|| panic!("no resume:\n{logged}"));
    assert_eq!(from, 4, "the checkpoint before the fault at step 6");
    // Both ranks left on their own, each naming its broken collective.
    for rank in 0..2 {
        let node = std::fs::read_to_string(run.join(format!("logs/local_learner-{rank}.log"))).unwrap();
        assert!(
            node.contains(&format!("[node] learner rank {rank}: learner group broken: data-parallel collective: ")) && node.contains("leaving so that the learner group forms again"),
            "rank {rank}:\n{node}"
        );
    }
    assert_trained_once_replayed(&run);
    assert_logged_once(&run, 12, ROWS_PER_STEP);
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["counters"]["groups_trained"], 24, "counted over both starts: {summary}");

    // A malformed fault value is refused by the learner's process, naming it, not silently ignored.
    let (run, log) = (tmp.path().join("run-bad"), tmp.path().join("up-bad.log"));
    let exit = start_with(&topo, &recipe, &run, &log, &[], &[(rlmesh_actors::node::RING_FAULT_ENV, "rank1-step6")]).wait().unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!exit.success() && logged.contains("RLMESH_FAULT_LEARNER_RING_ABORT_AT=\"rank1-step6\": expected RANK:STEP"), "{logged}");
}

#[test]
fn a_chaos_run_survives_its_kills_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (topo, recipe) = (topology(tmp.path()), recipe(tmp.path(), 2 * STEPS));
    let (run, log) = (tmp.path().join("run"), tmp.path().join("up.log"));
    // Refused where it cannot act: the embedded default has no process of its own to kill.
    let out = Command::new(env!("CARGO_BIN_EXE_launcher"))
        .current_dir(repo())
        .args(["up", "deploy/local.toml", "--recipe", &recipe, "--run-dir", tmp.path().join("nothing").to_str().unwrap(), "--chaos", "rollout:1", "--dry-run"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("places no rollout actor in a process of its own"), "{}", stderr(&out));
    let exit = start(&topo, &recipe, &run, &log, &["--chaos", "rollout:2:1"]).wait().unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(exit.success(), "{logged}");
    for k in ["(1 of 2)", "(2 of 2)"] {
        assert!(logged.lines().any(|l| l.contains("chaos: killed local/rollout-") && l.contains(k)), "chaos kill {k} is logged:\n{logged}");
    }
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let restarts: u64 = summary["process_restarts"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(restarts, 2, "each kill was followed by a restart: {summary}");
    assert_trained_once_replayed(&run);
    assert_logged_once(&run, 2 * STEPS as u64, ROWS_PER_STEP);
}

/// The runs of these tests bind ports a helper chose for them earlier, while
/// the other tests run: no two spans handed out at once may overlap. (Chosen
/// only by probing, 100 spans of 32 would overlap about 11 times; one such
/// clash failed a run here with "Address already in use".)
#[test]
fn port_spans_handed_out_at_once_never_overlap() {
    let spans: Vec<u16> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4).map(|_| s.spawn(|| (0..25).map(|_| free_port_base(32)).collect::<Vec<u16>>())).collect();
        threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    let mut sorted = spans.clone();
    sorted.sort_unstable();
    for w in sorted.windows(2) {
        assert!(w[1] >= w[0] + 32, "spans at {} and {} overlap (of {spans:?})", w[0], w[1]);
    }
    assert_eq!(sorted.len(), 100);
}

/// A rollout process that stops answering while its connection stays open (SIGSTOP,
/// with a heartbeat deadline longer than the test) is caught by the call timeout:
/// its request fails after `[faults] call_timeout_s`, it is taken down and started
/// again, and the run finishes with every group trained once.
#[test]
fn a_stalled_rollout_process_is_taken_down_after_the_call_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let (topo, recipe) = (topology(tmp.path()), recipe(tmp.path(), STEPS));
    let mut text = std::fs::read_to_string(&topo).unwrap();
    text.push_str("[faults]\nheartbeat_s = 0.5\ndeadline_s = 120\ncall_timeout_s = 3\n");
    std::fs::write(&topo, text).unwrap();
    let (run, log) = (tmp.path().join("run"), tmp.path().join("up.log"));
    let mut child = start(&topo, &recipe, &run, &log, &[]);
    wait_for_steps(&mut child, &run, 3, &log);
    let stalled = process(&status(&run), "local/rollout-0")["pid"].as_u64().unwrap();
    assert!(Command::new("kill").args(["-STOP", &stalled.to_string()]).status().unwrap().success());
    let exit = child.wait().unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(exit.success(), "{logged}");
    assert!(logged.contains("local/rollout-0 stalled: it answered no call within 3s"), "the stall is named:\n{logged}");
    assert!(logged.contains("local/rollout-0 is back"), "{logged}");
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["process_restarts"]["local/rollout-0"], 1, "{summary}");
    assert_trained_once_replayed(&run);
    assert_logged_once(&run, STEPS as u64, ROWS_PER_STEP);
    assert!(!alive(stalled), "the stalled process was stopped when it was replaced");
}
