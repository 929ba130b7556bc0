//! `launcher up` across three hosts: network namespaces the test creates,
//! each with its own OpenSSH server (mesh::testing::TestHosts). The
//! controller, the learner and the reward actor run on h0, where `up` is
//! started; one rollout process runs on each of h1 and h2, started over real
//! ssh. A second test cuts h2 off the network mid-run. Where namespaces cannot
//! be created the tests print SKIPPED and pass.
mod common;

use common::*;
use rlmesh_mesh::testing::TestHosts;
use serde_json::Value;

/// The three-host topology: controller, learner and reward actor in h0's `main`, one rollout process on each of h1 and h2.
fn three_hosts(hosts: &TestHosts, dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let nodes: String = (0..3).map(|i| format!("[[nodes]]\nname = \"h{i}\"\nhost = \"{}\"\n", hosts.address(i))).collect();
    let topo = dir.join(format!("{name}.topology.toml"));
    std::fs::write(
        &topo,
        format!(
            "name = \"{name}\"\n{nodes}\n[ports]\ncontrol = 29500\ndata = 29600\nmetrics = 9100\nmaster = 29400\n\
             [ssh]\nconfig_file = \"{}\"\n\
             [controller]\nnode = \"h0\"\nprocess = \"main\"\n[weight_sync]\nnode = \"h0\"\nprocess = \"main\"\n\
             [rollout]\nplacement = [{{ node = \"h1\", actors = 1 }}, {{ node = \"h2\", actors = 1 }}]\n\
             [reward]\nplacement = [{{ node = \"h0\", actors = 1, process = \"main\" }}]\n\
             [learner]\nranks = 1\nplacement = [{{ node = \"h0\", actors = 1, process = \"main\" }}]\n",
            hosts.ssh_config_path().display()
        ),
    )
    .unwrap();
    topo
}

/// `launcher up` inside h0 (whose address is this machine's; the other hosts are reached over ssh).
fn up_in_h0(hosts: &TestHosts, topo: &std::path::Path, recipe: &std::path::Path, run: &std::path::Path, log: &std::path::Path, extra: &[&str]) -> std::process::Child {
    hosts
        .exec_in(0)
        .arg(env!("CARGO_BIN_EXE_launcher"))
        .current_dir(repo())
        .args(["up", topo.to_str().unwrap(), "--recipe", recipe.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--eval-limit", "4"])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Waits until the run has logged `n` RL steps (it must not end first).
fn wait_for_rl_steps(child: &mut std::process::Child, run: &std::path::Path, n: usize, log: &std::path::Path) {
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(run.join("metrics.jsonl")).map(|s| s.lines().count()).unwrap_or(0) < n {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early: {}", std::fs::read_to_string(log).unwrap_or_default());
        assert!(t0.elapsed() < std::time::Duration::from_secs(180), "no RL step {n}: {}", std::fs::read_to_string(log).unwrap_or_default());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_three_host_run_over_ssh_trains_every_group_once() {
    let Some(hosts) = TestHosts::start_or_skip(3) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let recipe = tmp.path().join("hosts-test.toml");
    std::fs::write(
        &recipe,
        "reward = \"process\"\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 40\nbatch_size = 8\ntasks = 512\n\
         [rl]\nsteps = 4\ngroup_size = 4\ngroups_per_step = 2\nmax_turns = 2\nmax_new_tokens = 24\nmode = \"one_step_off\"\n",
    )
    .unwrap();
    let topo = three_hosts(&hosts, tmp.path(), "three-hosts");
    let run = tmp.path().join("run");
    // `up` runs inside h0, so h0's address is this machine's and h1, h2 are reached over ssh.
    let child = hosts
        .exec_in(0)
        .arg(env!("CARGO_BIN_EXE_launcher"))
        .current_dir(repo())
        .args(["up", topo.to_str().unwrap(), "--recipe", recipe.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--eval-limit", "8"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // While it runs, every process listens on its own host's address only.
    let t0 = std::time::Instant::now();
    let live = loop {
        let status: Option<Value> = std::fs::read_to_string(run.join("status.json")).ok().and_then(|s| serde_json::from_str(&s).ok());
        if let Some(st) = status.filter(|st| st["processes"].as_array().is_some_and(|p| p.len() == 3)) {
            break st;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(120), "the processes never joined");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    for (i, p) in live["processes"].as_array().unwrap().iter().enumerate() {
        assert_listens_only_on(p["pid"].as_u64().unwrap() as u32, &hosts.address(i).to_string());
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    let status: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    let placed: Vec<(String, String)> = status["processes"].as_array().unwrap().iter().map(|p| (p["name"].as_str().unwrap().into(), p["host"].as_str().unwrap().into())).collect();
    let addr = |i: usize| hosts.address(i).to_string();
    assert_eq!(placed, [("h0/main".to_string(), addr(0)), ("h1/rollout-0".to_string(), addr(1)), ("h2/rollout-1".to_string(), addr(2))]);

    // Every group trained exactly once, and both remote rollout processes generated some.
    let (trained, dispatched) = ledger_counts(&run);
    let summary: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(summary["steps"], 4);
    assert_logged_once(&run, 4, 8);
    assert_eq!(trained.len() as u64, summary["groups"]["trained"].as_u64().unwrap());
    assert!(trained.values().all(|&n| n == 1), "a group trained twice: {trained:?}");
    assert!(dispatched >= trained.len());
    for i in [1, 2] {
        let log = std::fs::read_to_string(run.join(format!("logs/h{i}_rollout-{}.log", i - 1))).unwrap();
        assert!(log.contains("joined the controller"), "h{i}'s log: {log}");
        // Hosts have their own /dev/shm: versions cross between them on the TCP ring.
        assert!(log.contains("receives versions along the TCP ring"), "h{i}'s log: {log}");
        // The remote process left with the run: nothing of ours is still running on that host.
        let pid = status["processes"][i]["pid"].as_u64().unwrap() as u32;
        assert!(!hosts.pids(i).contains(&pid), "h{i}: rollout process {pid} outlived the run");
    }
}

/// Host h2 is cut off the network (its link down) in the middle of RL: its
/// rollout process is declared lost within the heartbeat deadline, leaves
/// routing, the weight-sync group is formed again without it, and the run
/// finishes on h1 with every group trained exactly once. The process on h2
/// notices its controller is gone and leaves by itself.
#[test]
fn a_lost_rollout_host_leaves_routing_and_the_run_goes_on() {
    let Some(hosts) = TestHosts::start_or_skip(3) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let recipe = tmp.path().join("lost-host.toml");
    std::fs::write(
        &recipe,
        "reward = \"process\"\n[model]\nhidden = 32\nlayers = 1\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 2\nbatch_size = 4\ntasks = 256\n\
         [rl]\nsteps = 200\ngroup_size = 2\ngroups_per_step = 2\nmax_turns = 2\nmax_new_tokens = 16\nmode = \"sync\"\n",
    )
    .unwrap();
    let topo = three_hosts(&hosts, tmp.path(), "lost-host");
    let run = tmp.path().join("run");
    let log = tmp.path().join("up.log");
    let mut child = hosts
        .exec_in(0)
        .arg(env!("CARGO_BIN_EXE_launcher"))
        .current_dir(repo())
        .args(["up", topo.to_str().unwrap(), "--recipe", recipe.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--eval-limit", "4"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(run.join("metrics.jsonl")).map(|s| s.lines().count()).unwrap_or(0) < 3 {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early: {}", std::fs::read_to_string(&log).unwrap_or_default());
        assert!(t0.elapsed() < std::time::Duration::from_secs(180), "no RL step 3: {}", std::fs::read_to_string(&log).unwrap_or_default());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let status: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    let h2_pid = status["processes"][2]["pid"].as_u64().unwrap() as u32;
    hosts.cut(2).unwrap();
    let cut = std::time::Instant::now();
    let out = child.wait_with_output().unwrap();
    let took = cut.elapsed();
    hosts.restore(2).unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(out.status.success(), "the run goes on without h2:\n{logged}");
    eprintln!("the run ended {took:?} after h2 was cut");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["steps"], 200);
    assert!(logged.contains("h2/rollout-1 is lost"), "{logged}");
    let (trained, dispatched) = ledger_counts(&run);
    assert_eq!(trained.len(), dispatched, "every dispatched group is trained");
    assert!(trained.values().all(|&n| n == 1), "a group trained twice: {trained:?}");
    assert_logged_once(&run, 200, 4);
    let h1 = std::fs::read_to_string(run.join("logs/h1_rollout-0.log")).unwrap();
    assert!(h1.contains("joining epoch 1 as rank 1 of 2"), "h1 formed the group again without h2:\n{h1}");
    // The cut-off process noticed its controller was gone and left.
    let t1 = std::time::Instant::now();
    while hosts.pids(2).contains(&h2_pid) {
        assert!(t1.elapsed() < std::time::Duration::from_secs(20), "h2's rollout process {h2_pid} outlived its run");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The learner's host h1 is cut off mid-run: the run stops within the
/// heartbeat deadline with an error that names the rank and the way on, every
/// other process leaves, and once h1 answers again `launcher up --resume`
/// finishes the run from the last checkpoint with nothing trained twice.
#[test]
fn a_lost_learner_host_stops_the_run_with_the_reason_and_resume_finishes_it() {
    let Some(hosts) = TestHosts::start_or_skip(3) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let recipe = tmp.path().join("lost-learner.toml");
    std::fs::write(
        &recipe,
        "reward = \"process\"\n[model]\nhidden = 32\nlayers = 1\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 2\nbatch_size = 4\ntasks = 256\n\
         [rl]\nsteps = 100\ngroup_size = 2\ngroups_per_step = 2\nmax_turns = 2\nmax_new_tokens = 16\nmode = \"sync\"\ncheckpoint_every = 4\n",
    )
    .unwrap();
    let nodes: String = (0..3).map(|i| format!("[[nodes]]\nname = \"h{i}\"\nhost = \"{}\"\n", hosts.address(i))).collect();
    let topo = tmp.path().join("lost-learner.topology.toml");
    std::fs::write(
        &topo,
        format!(
            "name = \"lost-learner\"\n{nodes}\n[ports]\ncontrol = 29500\ndata = 29600\nmetrics = 9100\nmaster = 29400\n\
             [ssh]\nconfig_file = \"{}\"\n\
             [controller]\nnode = \"h0\"\nprocess = \"main\"\n[weight_sync]\nnode = \"h0\"\nprocess = \"main\"\n\
             [rollout]\nplacement = [{{ node = \"h2\", actors = 1 }}]\n\
             [reward]\nplacement = [{{ node = \"h0\", actors = 1, process = \"main\" }}]\n\
             [learner]\nranks = 1\nplacement = [{{ node = \"h1\", actors = 1 }}]\n",
            hosts.ssh_config_path().display()
        ),
    )
    .unwrap();
    let run = tmp.path().join("run");
    let up = |log: &std::path::Path, extra: &[&str]| up_in_h0(&hosts, &topo, &recipe, &run, log, extra);
    let log = tmp.path().join("up.log");
    let mut child = up(&log, &[]);
    wait_for_rl_steps(&mut child, &run, 6, &log);
    let status: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    let pids: Vec<(usize, u32)> = status["processes"].as_array().unwrap().iter().skip(1).map(|p| {
        let host = if p["name"].as_str().unwrap().starts_with("h1/") { 1 } else { 2 };
        (host, p["pid"].as_u64().unwrap() as u32)
    }).collect();
    hosts.cut(1).unwrap();
    let cut = std::time::Instant::now();
    let exit = child.wait().unwrap();
    let took = cut.elapsed();
    let logged = std::fs::read_to_string(&log).unwrap();
    hosts.restore(1).unwrap();
    assert_eq!(exit.code(), Some(1), "the run cannot go on without its learner:\n{logged}");
    assert!(took < std::time::Duration::from_secs(20), "it stopped {took:?} after h1 was cut");
    assert!(logged.contains("a learner rank is lost (h1/learner-0 silent past the heartbeat deadline)"), "{logged}");
    assert!(logged.contains("--resume"), "the error says how to go on:\n{logged}");
    assert!(run.join("checkpoints/latest").exists(), "a checkpoint is left");
    // Every process of the run has left, h1's once it noticed its controller was gone.
    let t1 = std::time::Instant::now();
    while pids.iter().any(|(h, p)| hosts.pids(*h).contains(p)) {
        assert!(t1.elapsed() < std::time::Duration::from_secs(30), "a node outlived the stopped run: {pids:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let log2 = tmp.path().join("resume.log");
    let exit = up(&log2, &["--resume"]).wait().unwrap();
    assert!(exit.success(), "{}", std::fs::read_to_string(&log2).unwrap());
    assert_trained_once_replayed(&run);
    assert_logged_once(&run, 100, 4);
}

/// The controller on h0 is killed (SIGKILL) mid-run: the rollout processes on
/// h1 and h2 notice within the heartbeat deadline and leave, so no rlmesh
/// process is left on any host (`ip netns pids`), and `launcher up --resume`
/// finishes the run with every group trained once and every step logged once.
#[test]
fn a_killed_controller_leaves_no_process_on_any_host_and_resume_finishes() {
    let Some(hosts) = TestHosts::start_or_skip(3) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let recipe = tmp.path().join("killed-controller.toml");
    std::fs::write(
        &recipe,
        "reward = \"process\"\n[model]\nhidden = 32\nlayers = 1\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 2\nbatch_size = 4\ntasks = 256\n\
         [rl]\nsteps = 60\ngroup_size = 2\ngroups_per_step = 2\nmax_turns = 2\nmax_new_tokens = 16\nmode = \"sync\"\ncheckpoint_every = 4\n",
    )
    .unwrap();
    let topo = three_hosts(&hosts, tmp.path(), "killed-controller");
    let run = tmp.path().join("run");
    let up = |log: &std::path::Path, extra: &[&str]| up_in_h0(&hosts, &topo, &recipe, &run, log, extra);
    let log = tmp.path().join("up.log");
    let mut child = up(&log, &[]);
    wait_for_rl_steps(&mut child, &run, 6, &log);
    assert!(!launcher_processes(&hosts.pids(1)).is_empty() && !launcher_processes(&hosts.pids(2)).is_empty(), "a rollout process runs on h1 and h2");
    // `ip netns exec` execs the launcher: the child is the controller itself.
    assert!(std::process::Command::new("kill").args(["-KILL", &child.id().to_string()]).status().unwrap().success());
    let _ = child.wait();
    let killed = std::time::Instant::now();
    while (0..3).any(|h| !launcher_processes(&hosts.pids(h)).is_empty()) {
        let left: Vec<String> = (0..3).flat_map(|h| launcher_processes(&hosts.pids(h))).collect();
        assert!(killed.elapsed() < std::time::Duration::from_secs(20), "processes outlived their controller by 20 s: {left:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let took = killed.elapsed();
    assert!(took < std::time::Duration::from_secs(12), "the hosts were clear {took:?} after the controller died (deadline 5 s)");
    // (A remote process may also end by SIGPIPE on its log, which went through the
    // dead controller's ssh client, before its deadline says "the controller is lost".)
    let log2 = tmp.path().join("resume.log");
    let exit = up(&log2, &["--resume"]).wait().unwrap();
    assert!(exit.success(), "{}", std::fs::read_to_string(&log2).unwrap());
    assert_trained_once_replayed(&run);
    assert_logged_once(&run, 60, 4);
    assert!((0..3).all(|h| launcher_processes(&hosts.pids(h)).is_empty()), "nothing left after the resumed run");
}
