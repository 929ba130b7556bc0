//! `launcher up` across three hosts: network namespaces the test creates,
//! each with its own OpenSSH server (mesh::testing::TestHosts). The
//! controller, the learner and the reward actor run on h0, where `up` is
//! started; one rollout process runs on each of h1 and h2, started over real
//! ssh. Where namespaces cannot be created the test prints SKIPPED and passes.
mod common;

use common::*;
use rlmesh_mesh::testing::TestHosts;
use serde_json::Value;

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
    let nodes: String = (0..3).map(|i| format!("[[nodes]]\nname = \"h{i}\"\nhost = \"{}\"\n", hosts.address(i))).collect();
    let topo = tmp.path().join("three-hosts.toml");
    std::fs::write(
        &topo,
        format!(
            "name = \"three-hosts\"\n{nodes}\n[ports]\ncontrol = 29500\ndata = 29600\nmetrics = 9100\nmaster = 29400\n\
             [ssh]\nconfig_file = \"{}\"\n\
             [controller]\nnode = \"h0\"\nprocess = \"main\"\n[weight_sync]\nnode = \"h0\"\nprocess = \"main\"\n\
             [rollout]\nplacement = [{{ node = \"h1\", actors = 1 }}, {{ node = \"h2\", actors = 1 }}]\n\
             [reward]\nplacement = [{{ node = \"h0\", actors = 1, process = \"main\" }}]\n\
             [learner]\nranks = 1\nplacement = [{{ node = \"h0\", actors = 1, process = \"main\" }}]\n",
            hosts.ssh_config_path().display()
        ),
    )
    .unwrap();
    let run = tmp.path().join("run");
    // `up` runs inside h0, so h0's address is this machine's and h1, h2 are reached over ssh.
    let out = hosts
        .exec_in(0)
        .arg(env!("CARGO_BIN_EXE_launcher"))
        .current_dir(repo())
        .args(["up", topo.to_str().unwrap(), "--recipe", recipe.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--eval-limit", "8"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    let status: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    let placed: Vec<(String, String)> = status["processes"].as_array().unwrap().iter().map(|p| (p["name"].as_str().unwrap().into(), p["host"].as_str().unwrap().into())).collect();
    let addr = |i: usize| hosts.address(i).to_string();
    assert_eq!(placed, [("h0/main".to_string(), addr(0)), ("h1/rollout-0".to_string(), addr(1)), ("h2/rollout-1".to_string(), addr(2))]);

    // Every group trained exactly once, and both remote rollout processes generated some.
    let (trained, dispatched) = ledger_counts(&run);
    let summary: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(summary["steps"], 4);
    assert_eq!(trained.len() as u64, summary["groups"]["trained"].as_u64().unwrap());
    assert!(trained.values().all(|&n| n == 1), "a group trained twice: {trained:?}");
    assert!(dispatched >= trained.len());
    for i in [1, 2] {
        let log = std::fs::read_to_string(run.join(format!("logs/h{i}_rollout-{}.log", i - 1))).unwrap();
        assert!(log.contains("joined the controller"), "h{i}'s log: {log}");
        // The remote process left with the run: nothing of ours is still running on that host.
        let pid = status["processes"][i]["pid"].as_u64().unwrap() as u32;
        assert!(!hosts.pids(i).contains(&pid), "h{i}: rollout process {pid} outlived the run");
    }
}
