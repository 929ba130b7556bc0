//! Processes as Slurm job steps on a real Slurm (mesh::testing::slurm::TestSlurm):
//! three slurmds in three network namespaces, fake GPUs as gres. Where the
//! machine cannot run one (not root, packages missing) the test prints SKIPPED.
use rlmesh_mesh::launch::{Exit, Host, Launcher, ProcessSpec, Signal};
use rlmesh_mesh::slurm::SrunConfig;
use rlmesh_mesh::testing::slurm::TestSlurm;
use std::time::{Duration, Instant};

/// Submit a job that holds `nodes` nodes (and their GPUs) until cancelled; its id.
fn hold(cluster: &TestSlurm, nodes: usize) -> String {
    let out = cluster
        .command("sbatch")
        .args(["--parsable", "-N", &nodes.to_string(), &format!("--gpus-per-node={}", cluster.gpus()), "-o", "/dev/null", "--wrap", "sleep 300"])
        .output()
        .unwrap();
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let t0 = Instant::now();
    while cluster.job_state(&id).as_deref() != Some("RUNNING") {
        assert!(t0.elapsed() < Duration::from_secs(30), "job {id} did not start: {:?}\n{}", cluster.job_state(&id), cluster.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    id
}

#[test]
fn a_step_gets_its_secret_on_stdin_runs_on_its_node_and_ends_on_a_signal() {
    let Some(cluster) = TestSlurm::start_or_skip(3, 4, 2) else { return };
    println!("test cluster up in {:.1} s", cluster.setup_time().as_secs_f64());
    let job = hold(&cluster, 3);
    std::env::set_var("SLURM_CONF", cluster.conf());
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("step.log");
    let mut spec = ProcessSpec::new("sh", ["-c", "echo \"secret=$RL_SECRET host=$(hostname) gpus=$CUDA_VISIBLE_DEVICES plain=$RL_PLAIN\"; exec sleep 60"]);
    spec.secret_env.insert("RL_SECRET".into(), "s3cr3t".into());
    spec.env.insert("RL_PLAIN".into(), "p".into());
    spec.log = Some(log.clone());
    let srun = SrunConfig { program: "srun".into(), job_id: job.clone(), node: "h1".into(), step_name: "rlmesh-test".into(), gpus: 1, extra: vec![] };
    let mut p = Launcher::new(Host::Slurm { srun }).spawn(&spec).unwrap();

    // The step id came back with the pid, and the pid lives in h1's namespace.
    let step = p.slurm_step().expect("a step id").to_string();
    assert!(step.starts_with(&format!("{job}.")), "{step}");
    assert!(cluster.hosts().pids(1).contains(&p.pid()), "pid {} not in h1: {:?}", p.pid(), cluster.hosts().pids(1));
    let t0 = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("secret=") {
        assert!(t0.elapsed() < Duration::from_secs(10), "no output: {:?}", std::fs::read_to_string(&log));
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    // Its own GPU count: one GPU of the node, not every GPU of the job.
    assert!(text.contains("secret=s3cr3t host=h1 gpus=0 plain=p") || text.contains("secret=s3cr3t host=h1 gpus=1 plain=p"), "{text}");
    // The secret never reached a command line Slurm records.
    let steps = cluster.client("squeue", &["-h", "-s", "-j", &job, "-o", "%i %j %o"]).unwrap();
    assert!(steps.contains(&step) && steps.contains("rlmesh-test") && !steps.contains("s3cr3t"), "{steps}");

    // TERM reaches the task through srun; the step ends and leaves nothing on h1.
    p.signal(Signal::Term).unwrap();
    let exit = p.wait_timeout(Duration::from_secs(15)).unwrap().expect("the step ended");
    assert_ne!(exit, Exit::Code(0));
    let t0 = Instant::now();
    while cluster.hosts().pids(1).contains(&p.pid()) || cluster.client("squeue", &["-h", "-s", "-j", &job]).is_some_and(|o| o.contains(&step)) {
        assert!(t0.elapsed() < Duration::from_secs(10), "step {step} outlived TERM");
        std::thread::sleep(Duration::from_millis(100));
    }

    // A step asking for more GPUs than a node has is refused by Slurm, and the start says so.
    let srun = SrunConfig { program: "srun".into(), job_id: job.clone(), node: "h2".into(), step_name: "rlmesh-test".into(), gpus: 3, extra: vec![] };
    let err = Launcher::new(Host::Slurm { srun }).start_timeout(Duration::from_secs(20)).spawn(&ProcessSpec::new("true", Vec::<String>::new())).unwrap_err();
    assert!(err.to_string().contains("h2"), "{err}");

    // A stop of a live step: TERM, then Slurm ends it.
    let srun = SrunConfig { program: "srun".into(), job_id: job.clone(), node: "h2".into(), step_name: "rlmesh-test".into(), gpus: 0, extra: vec![] };
    let mut p = Launcher::new(Host::Slurm { srun }).spawn(&ProcessSpec::new("sh", ["-c", "trap '' TERM; exec sleep 60"])).unwrap();
    let pid = p.pid();
    p.stop(Duration::from_millis(500)).unwrap();
    let t0 = Instant::now();
    while cluster.hosts().pids(2).contains(&pid) {
        assert!(t0.elapsed() < Duration::from_secs(15), "a step ignoring TERM outlived stop()");
        std::thread::sleep(Duration::from_millis(100));
    }
}
