//! `launcher submit` and `launcher up --slurm` on a real Slurm: slurmds in
//! network-namespace hosts (mesh::testing::slurm::TestSlurm), with fake GPUs
//! as gres, and a cluster whose node names resolve nowhere. Where the machine
//! cannot run one (not root, no packages) each test prints SKIPPED and passes.
mod common;

use common::*;
use rlmesh_mesh::testing::slurm::{NodeNames, TestSlurm};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

const RECIPE: &str = "reward = \"process\"\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 40\nbatch_size = 8\ntasks = 512\n\
     [rl]\nsteps = STEPS\ngroup_size = 4\ngroups_per_step = 2\nmax_turns = 2\nmax_new_tokens = 24\nmode = \"one_step_off\"\n";

/// The recipe (`steps` RL steps) and the shipped three-node topology, deploy/slurm-cpu3.toml.
fn files(dir: &Path, steps: u32) -> (std::path::PathBuf, std::path::PathBuf) {
    let recipe = dir.join("slurm-test.toml");
    std::fs::write(&recipe, RECIPE.replace("STEPS", &steps.to_string())).unwrap();
    (recipe, repo().join("deploy/slurm-cpu3.toml"))
}

fn submit(cluster: &TestSlurm, topo: &Path, recipe: &Path, run: &Path) -> String {
    let out = cluster
        .command(env!("CARGO_BIN_EXE_launcher"))
        .current_dir(repo())
        .args(["submit", topo.to_str().unwrap(), "--recipe", recipe.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--eval-limit", "8", "--time", "30"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    v["job_id"].as_str().unwrap().to_string()
}

/// Submits a run too long to finish in a test; its run directory and job id.
fn submit_long(cluster: &TestSlurm, dir: &Path) -> (std::path::PathBuf, String) {
    let (recipe, topo) = files(dir, 400);
    let run = dir.join("run");
    let job = submit(cluster, &topo, &recipe, &run);
    (run, job)
}

fn slurm_output(run: &Path, job: &str) -> String {
    std::fs::read_to_string(run.join(format!("slurm/slurm-{job}.out"))).unwrap_or_default()
}

/// No `launcher` process is left on any host of the cluster.
fn assert_nothing_left(cluster: &TestSlurm) {
    let t0 = Instant::now();
    loop {
        let left: Vec<String> = (0..cluster.hosts().len()).flat_map(|i| launcher_processes(&cluster.hosts().pids(i))).collect();
        if left.is_empty() {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "left running: {left:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_submitted_three_node_job_trains_every_group_once() {
    let Some(cluster) = TestSlurm::start_or_skip(3, 4, 0) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (recipe, topo) = files(tmp.path(), 4);
    let run = tmp.path().join("run");

    // --dry-run prints the script and submits nothing.
    let dry = cluster.command(env!("CARGO_BIN_EXE_launcher")).current_dir(repo()).args(["submit", topo.to_str().unwrap(), "--recipe", recipe.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--partition", "debug", "--dry-run"]).output().unwrap();
    assert_eq!(code(&dry), 0, "{}", stderr(&dry));
    let script = stdout(&dry);
    for want in ["#SBATCH --nodes=3", "#SBATCH --partition=debug", "#SBATCH --exclusive", " up ", " --slurm "] {
        assert!(script.contains(want), "{want:?} missing from:\n{script}");
    }
    assert!(!run.exists() && cluster.client("squeue", &["-h"]).unwrap().trim().is_empty());

    let job = submit(&cluster, &topo, &recipe, &run);
    let state = cluster.wait_job(&job, Duration::from_secs(600));
    let output = slurm_output(&run, &job);
    assert_eq!(state.as_deref(), Some("COMPLETED"), "job {job}: {state:?}\n{output}\n{}", cluster.logs());

    // The run went through Slurm: the controller on the first node, each other process a step of the job.
    let status: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    assert_eq!(status["slurm"]["job_id"], job.as_str());
    assert_eq!(status["slurm"]["submitted"], true);
    let procs = status["processes"].as_array().unwrap();
    // Each process on its node's address (`NodeAddr`), which Slurm knows, not its name.
    let placed: Vec<(&str, String)> = procs.iter().map(|p| (p["name"].as_str().unwrap(), p["host"].as_str().unwrap().to_string())).collect();
    let at = |i: usize| cluster.hosts().address(i).to_string();
    assert_eq!(placed, [("a/main", at(0)), ("b/rollout-0", at(1)), ("c/rollout-1", at(2))]);
    for p in &procs[1..] {
        assert!(p["slurm_step"].as_str().unwrap().starts_with(&format!("{job}.")), "{p}");
    }
    // Progress lines reach Slurm's output file.
    assert!(output.contains("started b/rollout-0 on h1") && output.contains("Slurm step"), "{output}");
    let (trained, dispatched) = ledger_counts(&run);
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 4);
    assert!(!trained.is_empty() && trained.values().all(|&n| n == 1), "a group trained twice: {trained:?}");
    assert!(dispatched >= trained.len());
    assert_nothing_left(&cluster);
}

#[test]
fn launcher_down_of_a_submitted_run_ends_every_step() {
    let Some(cluster) = TestSlurm::start_or_skip(3, 4, 0) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (run, job) = submit_long(&cluster, tmp.path());
    // Wait until the run trains, with its steps running.
    let t0 = Instant::now();
    loop {
        let phase = std::fs::read_to_string(run.join("status.json")).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok()).map(|v| v["phase"].as_str().unwrap_or("").to_string());
        if phase.as_deref() == Some("rl") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "no RL step: {phase:?}\n{}", slurm_output(&run, &job));
        std::thread::sleep(Duration::from_millis(300));
    }
    let steps = cluster.client("squeue", &["-h", "-s", "-j", &job, "-o", "%i %j"]).unwrap();
    assert_eq!(steps.lines().filter(|l| l.contains("rlmesh-")).count(), 2, "{steps}");

    let status = cluster.command(env!("CARGO_BIN_EXE_launcher")).args(["status", "--run-dir", run.to_str().unwrap()]).output().unwrap();
    assert_eq!(code(&status), 0, "{}{}", stdout(&status), stderr(&status));
    assert!(stdout(&status).contains(&format!("Slurm job {job}")) && stdout(&status).contains(&format!("step={job}.")), "{}", stdout(&status));

    let down = cluster.command(env!("CARGO_BIN_EXE_launcher")).args(["down", "--run-dir", run.to_str().unwrap()]).output().unwrap();
    assert_eq!(code(&down), 0, "{}{}", stdout(&down), stderr(&down));
    assert!(cluster.wait_job(&job, Duration::from_secs(60)).is_some(), "job {job} still running after down");
    assert!(cluster.client("squeue", &["-h", "-s", "-j", &job]).is_none_or(|o| o.trim().is_empty()), "steps left");
    assert_nothing_left(&cluster);
    // The controller stopped on SIGTERM at a checkpoint that --resume continues.
    let output = slurm_output(&run, &job);
    assert!(output.contains("SIGTERM") || output.contains("stopped"), "{output}");
}

#[test]
fn scancel_mid_run_leaves_no_process_on_any_host() {
    let Some(cluster) = TestSlurm::start_or_skip(3, 4, 0) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (run, job) = submit_long(&cluster, tmp.path());
    let t0 = Instant::now();
    while cluster.client("squeue", &["-h", "-s", "-j", &job, "-o", "%j"]).map_or(0, |o| o.lines().filter(|l| l.starts_with("rlmesh-")).count()) < 2 {
        assert!(t0.elapsed() < Duration::from_secs(120), "the steps did not start\n{}", slurm_output(&run, &job));
        std::thread::sleep(Duration::from_millis(200));
    }
    let o = cluster.command("scancel").arg(&job).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(cluster.wait_job(&job, Duration::from_secs(60)).is_some(), "job {job} outlived scancel");
    assert_nothing_left(&cluster);
}

#[test]
fn h100x32_inside_a_four_node_allocation_maps_nodes_and_binds_gpus() {
    let Some(cluster) = TestSlurm::start_or_skip(4, 4, 8) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("plan.json");
    let dry = tmp.path().join("dry.txt");
    let bin = env!("CARGO_BIN_EXE_launcher");
    let wrap = format!(
        "{bin} plan deploy/h100x32.toml --json > {}; {bin} up deploy/h100x32.toml --dry-run --recipe configs/calculator-process.toml --run-dir {} > {} 2>&1; echo exit=$? >> {}",
        out.display(),
        tmp.path().join("run").display(),
        dry.display(),
        dry.display()
    );
    let o = cluster.command("sbatch").current_dir(repo()).args(["--wait", "-N", "4", "--gpus-per-node=8", "-o", tmp.path().join("job.out").to_str().unwrap(), "--wrap", &wrap]).output().unwrap();
    assert!(o.status.success(), "{}\n{}", stderr(&o), std::fs::read_to_string(tmp.path().join("job.out")).unwrap_or_default());

    let plan: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let procs = plan["processes"].as_array().unwrap();
    let with = |role: &str| procs.iter().filter(|p| p["roles"].as_array().unwrap().iter().any(|r| r == role)).collect::<Vec<_>>();
    assert_eq!(with("rollout").len(), 16);
    assert_eq!(with("learner").len(), 16);
    assert_eq!(with("controller").len(), 1);
    // Topology nodes onto the allocation's hosts, the controller's on the first; each
    // process at its node's address, its step on the node by name.
    let addresses: Vec<String> = (0..4).map(|i| cluster.hosts().address(i).to_string()).collect();
    let mut hosts: Vec<&str> = procs.iter().map(|p| p["host"].as_str().unwrap()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let mut want = addresses.clone();
    want.sort_unstable();
    assert_eq!(hosts, want);
    assert_eq!(with("controller")[0]["host"], addresses[0].as_str());
    for p in with("rollout").iter().chain(&with("learner")) {
        let cmd: Vec<&str> = p["command"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
        assert_eq!(cmd[0], "srun", "{cmd:?}");
        let node = cluster.node(addresses.iter().position(|a| p["host"] == a.as_str()).unwrap());
        assert!(cmd.contains(&"--gpus-per-node=1") && cmd.contains(&format!("--nodelist={node}").as_str()), "{cmd:?}");
        assert!(cmd.ends_with(&[bin, "node"]), "{cmd:?}");
        let cuda = p["env"]["CUDA_VISIBLE_DEVICES"].as_str().unwrap();
        assert!(cuda.len() == 1 && cuda.parse::<u32>().unwrap() < 8, "{p}");
    }
    // Per host, every GPU bound once.
    for h in &addresses {
        let mut g: Vec<&str> = procs.iter().filter(|p| p["host"] == h.as_str()).filter_map(|p| p["env"]["CUDA_VISIBLE_DEVICES"].as_str()).filter(|c| !c.is_empty()).collect();
        g.sort_unstable();
        assert_eq!(g, ["0", "1", "2", "3", "4", "5", "6", "7"], "{h}");
    }

    // `up --dry-run` prints the same processes with their commands, then refuses the topology:
    // its first node is this machine, whose GPUs (gres entries) libtorch cannot see.
    let text = std::fs::read_to_string(&dry).unwrap();
    assert_eq!(text.lines().filter(|l| l.contains("srun ") && l.contains(" node")).count(), 34, "{text}");
    assert!(text.contains("CUDA_VISIBLE_DEVICES=") && text.contains(&format!("RLMESH_CONTROLLER_ADDR={}:", addresses[0])), "{text}");
    assert!(text.contains("error: deploy/h100x32.toml: field \"rollout.placement[0]\": GPU 0 on this machine, but libtorch sees 0 CUDA device(s) here") && text.contains("exit=2"), "{text}");

    // An `salloc` shell on a host outside the allocation cannot be the controller's;
    // a one-process run there needs no steps and starts as usual.
    let up_here = |topo: &str| {
        cluster
            .command(bin)
            .current_dir(repo())
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_JOB_NODELIST", "h[0-3]")
            .env_remove("SLURMD_NODENAME")
            .args(["up", topo, "--dry-run", "--metrics-addr", "127.0.0.1:0", "--run-dir", tmp.path().join("r").to_str().unwrap()])
            .output()
            .unwrap()
    };
    let o = up_here("deploy/slurm-cpu3.toml");
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("is not one of the allocation's nodes (h0,h1,h2,h3)") && stderr(&o).contains("launcher submit"), "{}", stderr(&o));
    let o = up_here("deploy/local.toml");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// A cluster whose node names resolve nowhere (`NodeName=n1 NodeAddr=<host's
/// address>` …, as cloud and dynamic clusters have): every process listens and
/// is dialled at the address Slurm knows for its node, and `srun -w` still
/// takes the name. Before, `up` stopped at once ("the host \"n1\" does not
/// resolve to an address to listen on").
#[test]
fn node_names_that_do_not_resolve_are_reached_at_their_node_addr() {
    let Some(cluster) = TestSlurm::start_named_or_skip(3, 4, 0, NodeNames::Unresolvable) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (recipe, three_nodes) = files(tmp.path(), 4);
    let run = tmp.path().join("run");
    let job = submit(&cluster, &repo().join("deploy/local-procs.toml"), &recipe, &run);
    let state = cluster.wait_job(&job, Duration::from_secs(600));
    let output = slurm_output(&run, &job);
    assert_eq!(state.as_deref(), Some("COMPLETED"), "job {job}: {state:?}\n{output}\n{}", cluster.logs());
    let status: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    let procs = status["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 6);
    let n1 = cluster.hosts().address(0).to_string();
    assert!(procs.iter().all(|p| p["host"] == n1.as_str()), "every process at n1's NodeAddr {n1}: {procs:?}");
    assert!(output.contains("started local/rollout-0 on n1") && output.contains("Slurm step"), "{output}");
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 4);
    assert_trained_once(&run);
    assert_nothing_left(&cluster);

    // Three topology nodes on the three Slurm nodes: each at its own NodeAddr, its steps on it by name.
    let plan_file = tmp.path().join("plan.json");
    let wrap = format!("{} plan {} --json > {}", env!("CARGO_BIN_EXE_launcher"), three_nodes.display(), plan_file.display());
    let o = cluster.command("sbatch").current_dir(repo()).args(["--wait", "-N", "3", "-o", tmp.path().join("plan.out").to_str().unwrap(), "--wrap", &wrap]).output().unwrap();
    assert!(o.status.success(), "{}\n{}", stderr(&o), std::fs::read_to_string(tmp.path().join("plan.out")).unwrap_or_default());
    let plan: Value = serde_json::from_str(&std::fs::read_to_string(&plan_file).unwrap()).unwrap();
    for (i, p) in plan["processes"].as_array().unwrap().iter().enumerate() {
        let address = cluster.hosts().address(i).to_string();
        assert_eq!(p["host"], address.as_str(), "{p}");
        assert!(p["env"]["RLMESH_CONTROLLER_ADDR"].as_str().unwrap().starts_with(&format!("{n1}:")), "{p}");
        if i > 0 {
            let cmd: Vec<&str> = p["command"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
            assert!(cmd.contains(&format!("--nodelist={}", cluster.node(i)).as_str()), "{cmd:?}");
        }
    }
}
