//! `launcher up` on topologies of several local processes: real `launcher
//! node` children over loopback (the control plane on ractor_cluster, the
//! data plane on ZeroMQ), against the same job in one process.
//!
//! - placement does not change the math: a `sync` run gives byte-identical
//!   rollouts, rewards and learner losses in one process and across two
//!   rollout processes;
//! - two data-parallel learner ranks train like one, within float tolerance;
//! - bad input on a live run's control and data ports is refused, counted in
//!   `/metrics`, named in the log, and the run finishes.
mod common;

use common::*;
use rlmesh_mesh::control::{ControlConfig, ControlNode};
use rlmesh_mesh::cookie::Cookie;
use rlmesh_mesh::frame::FrameCodec;
use rlmesh_actors::node::wire::{ControlMsg, DataMsg, Json};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A `sync` recipe whose rewards vary within groups after a short warm-up (so losses are not all zero).
fn recipe(dir: &Path) -> String {
    let text = r#"
reward = "process"
[tasks]
size = 64
held_out = 100
[sft]
steps = 150
batch_size = 16
tasks = 1024
[rl]
steps = 3
group_size = 4
groups_per_step = 3
max_turns = 2
max_new_tokens = 24
mode = "sync"
"#;
    let path = dir.join("sync-test.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// A one-node topology on 127.0.0.1 with free ports: `rollout` and `learner` are the placement tables' bodies.
fn topology(dir: &Path, name: &str, rollout: &str, ranks: u32, learner: &str) -> String {
    let text = format!(
        "name = \"{name}\"\n[[nodes]]\nname = \"local\"\nhost = \"127.0.0.1\"\n{}\n\
         [controller]\nnode = \"local\"\nprocess = \"main\"\n[weight_sync]\nnode = \"local\"\nprocess = \"main\"\n\
         [rollout]\nplacement = [{rollout}]\n[reward]\nplacement = [{{ node = \"local\", actors = 1, process = \"main\" }}]\n\
         [learner]\nranks = {ranks}\nplacement = [{learner}]\n",
        free_ports_table(8)
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn up(topology: &str, recipe: &str, run: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_launcher"));
    c.current_dir(repo()).args(["up", topology, "--recipe", recipe, "--run-dir", run.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0", "--eval-limit", "8"]);
    c
}

fn run_ok(topology: &str, recipe: &str, run: &Path) {
    let out = up(topology, recipe, run).output().unwrap();
    assert_eq!(code(&out), 0, "{topology}: {}", stderr(&out));
    assert_trained_once(run);
}

fn lines(path: &Path) -> Vec<Value> {
    jsonl(path)
}

/// The run in one process (`one`) and across rollout processes (`two`) gave the same rollouts and losses, bit for bit.
fn assert_same_run(one: &Path, two: &Path) {
    for f in ["rollouts.jsonl", "eval_rollouts.jsonl"] {
        let (x, y) = (std::fs::read(one.join(f)).unwrap(), std::fs::read(two.join(f)).unwrap());
        assert!(!x.is_empty());
        assert!(x == y, "{f} differs between one process and two rollout processes");
    }
    for k in ["loss", "grad_norm", "reward_mean", "entropy"] {
        assert_eq!(column(one, k), column(two, k), "{k}: bit-identical");
    }
}

fn column(run: &Path, key: &str) -> Vec<f64> {
    lines(&run.join("metrics.jsonl")).iter().map(|m| m[key].as_f64().unwrap()).collect()
}

#[test]
fn dev_2gpu_runs_on_the_cpu_with_device_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let topo = shipped_on_free_ports("dev-2gpu", tmp.path());
    let recipe = recipe(tmp.path());
    let run = tmp.path().join("run");
    let out = up(topo.to_str().unwrap(), &recipe, &run).args(["--device", "cpu"]).output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_trained_once(&run);
    // The GPU topology's processes, on the CPU: the rollout process and the learner apart from the controller.
    let status: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    let names: Vec<&str> = status["processes"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["dev/main", "dev/rollout-0", "dev/learner-0"]);
    assert_no_nodes_left(&run);
    // Without --device cpu the same file is refused on a machine where libtorch sees no GPU.
    let out = up(topo.to_str().unwrap(), &recipe, &tmp.path().join("run2")).output().unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

#[test]
fn a_sync_run_is_identical_in_one_process_and_across_two_rollout_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = recipe(tmp.path());
    let here = r#"{ node = "local", actors = 1, process = "main" }"#;
    let one = topology(tmp.path(), "one", r#"{ node = "local", actors = 2, process = "main" }"#, 1, here);
    let two = topology(tmp.path(), "two", r#"{ node = "local", actors = 2 }"#, 1, here);
    let (a, b) = (tmp.path().join("one"), tmp.path().join("two"));
    run_ok(&one, &recipe, &a);
    run_ok(&two, &recipe, &b);
    let status: Value = serde_json::from_str(&std::fs::read_to_string(b.join("status.json")).unwrap()).unwrap();
    let names: Vec<&str> = status["processes"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["local/main", "local/rollout-0", "local/rollout-1"]);
    assert!(b.join("logs/local_rollout-0.log").is_file());
    assert_same_run(&a, &b);
    assert!(column(&a, "grad_norm").iter().all(|g| *g > 0.0), "the steps trained on something");
    assert_no_nodes_left(&b);
}

/// `one_step_off` with two rollout processes: a request waits until the
/// version published before it has loaded in its process, so no group is
/// generated two versions behind and dropped as stale. Before that wait a
/// request could overtake the version and be generated with the one before
/// (in `launcher bench pipeline`, 96 of 256 groups were thrown away).
///
/// Steps train their groups in dispatch order, whichever process answers
/// first: the run gives the same rollouts and losses as with both rollout
/// actors in the controller's process.
#[test]
fn one_step_off_across_two_rollout_processes_wastes_no_group_and_matches_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(recipe(tmp.path())).unwrap().replace("mode = \"sync\"", "mode = \"one_step_off\"").replace("steps = 3\n", "steps = 12\n");
    let path = tmp.path().join("off-test.toml");
    std::fs::write(&path, text).unwrap();
    let here = r#"{ node = "local", actors = 1, process = "main" }"#;
    let two = topology(tmp.path(), "two", r#"{ node = "local", actors = 2 }"#, 1, here);
    let run = tmp.path().join("run");
    run_ok(&two, path.to_str().unwrap(), &run);
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let groups = &summary["groups"];
    assert_eq!(groups["trained"], 36, "{summary}");
    assert_eq!(groups["stale"], 0, "no group generated with a version older than its dispatch: {summary}");
    assert_eq!(summary["counters"]["groups_dispatched"], 36, "every group sent out was trained: {summary}");
    assert!(column(&run, "staleness_max").contains(&1.0), "generation overlapped training");
    assert_no_nodes_left(&run);
    let one = topology(tmp.path(), "one", r#"{ node = "local", actors = 2, process = "main" }"#, 1, here);
    let in_one = tmp.path().join("in-one");
    run_ok(&one, path.to_str().unwrap(), &in_one);
    assert_same_run(&in_one, &run);
}

/// Every tensor of `model.safetensors` in two checkpoint directories, as float32 values.
fn tensors(dir: &Path) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32);
            (name, view.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
        })
        .collect()
}

fn warmup_checkpoint(run: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(run.join("checkpoints")).unwrap().flatten().map(|e| e.path()).filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("step-")).collect();
    dirs.sort();
    dirs.into_iter().next().expect("a checkpoint after the warm-up")
}

#[test]
fn two_learner_ranks_in_their_own_processes_train_like_one() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = recipe(tmp.path());
    // The rollout actor in a process of its own: its weights come from learner rank 0 through the weight-sync group.
    let own = r#"{ node = "local", actors = 1 }"#;
    let r1 = topology(tmp.path(), "ranks1", own, 1, r#"{ node = "local", actors = 1 }"#);
    let r2 = topology(tmp.path(), "ranks2", own, 2, r#"{ node = "local", actors = 2 }"#);
    let (a, b) = (tmp.path().join("r1"), tmp.path().join("r2"));
    run_ok(&r1, &recipe, &a);
    run_ok(&r2, &recipe, &b);
    // After the warm-up (no sampling yet): the same weights within float tolerance.
    let (x, y) = (tensors(&warmup_checkpoint(&a)), tensors(&warmup_checkpoint(&b)));
    assert_eq!(x.len(), y.len());
    let mut worst = 0f32;
    for (name, v) in &x {
        let w = &y[name];
        assert_eq!(v.len(), w.len(), "{name}");
        for (p, q) in v.iter().zip(w) {
            worst = worst.max((p - q).abs());
        }
    }
    assert!(worst < 1e-4, "largest weight difference after the warm-up, 1 vs 2 ranks: {worst}");
    // The RL steps too, as long as they sampled the same rollouts: a weight
    // difference of ~1e-6 may flip one sampled token (seen once in step 3 of 3),
    // after which the two runs train on different data. The first step must match.
    let (ga, gb) = (column(&a, "grad_norm"), column(&b, "grad_norm"));
    let per_step = 3 * 4; // groups_per_step × group_size
    let (ra, rb) = (lines(&a.join("rollouts.jsonl")), lines(&b.join("rollouts.jsonl")));
    let same: Vec<bool> = ra.chunks(per_step).zip(rb.chunks(per_step)).map(|(x, y)| x.iter().zip(y).all(|(p, q)| p["completion"] == q["completion"])).collect();
    let matching = same.iter().take_while(|s| **s).count();
    assert!(matching >= 1, "the first RL step sampled different rollouts with 1 and 2 ranks (worst weight difference after the warm-up {worst})");
    for (step, (p, q)) in ga.iter().zip(&gb).take(matching).enumerate() {
        assert!((p - q).abs() <= 1e-3 * p.abs().max(1.0), "step {}: grad norm {p} (1 rank) vs {q} (2 ranks); all: {ga:?} vs {gb:?}", step + 1);
    }
    // Every rollout process holds the last version, received from learner rank 0.
    let status: Value = serde_json::from_str(&std::fs::read_to_string(b.join("status.json")).unwrap()).unwrap();
    let rollout = status["processes"].as_array().unwrap().iter().find(|p| p["roles"][0] == "rollout").unwrap();
    assert_eq!(rollout["version"], status["version"], "{status}");
    // On one host the group shares a segment instead of relaying along the ring.
    let log = std::fs::read_to_string(b.join("logs/local_rollout-0.log")).unwrap();
    assert!(log.contains("receives versions through shared memory"), "{log}");
    assert_no_nodes_left(&b);
}

#[test]
fn bad_input_to_a_live_run_is_refused_counted_and_named_and_the_run_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut t = Target::start(tmp.path(), "intruded", 40);
    let (run, log, metrics, cookie) = (t.run.clone(), t.log.clone(), t.metrics.clone(), t.cookie.clone());
    let (control, data) = (t.base("control"), t.base("data"));

    // The data plane: garbage, a wrong cookie, another rlmesh version, a truncated frame, a
    // frame declaring more than the cap, another message kind, and a valid message the
    // controller does not take.
    let ctx = zmq::Context::new();
    let push = ctx.socket(zmq::PUSH).unwrap();
    push.connect(&format!("tcp://127.0.0.1:{data}")).unwrap();
    push.send(&b"garbage, not an rlmesh frame, long enough for a header................"[..], 0).unwrap();
    let stranger = Cookie::generate().unwrap();
    push.send(FrameCodec::new(stranger.as_bytes(), 1 << 20).seal(0x0201, b"payload").unwrap(), 0).unwrap();
    push.send(FrameCodec::for_version(cookie.as_bytes(), 1 << 20, "0.0.9").seal(0x0201, b"payload").unwrap(), 0).unwrap();
    let ours = FrameCodec::new(cookie.as_bytes(), 1 << 20);
    let good = ours.encode(&DataMsg::Learner { id: 7, call: Json::of(&"x") }).unwrap();
    push.send(&good[..good.len() - 3], 0).unwrap();
    let mut huge = good.clone();
    huge[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    push.send(huge, 0).unwrap();
    push.send(ours.encode(&ControlMsg::Stop).unwrap(), 0).unwrap();
    push.send(good, 0).unwrap();

    // The control plane: a session with a wrong cookie; with the right one, garbage, an oversized frame, another version.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let cfg = ControlConfig::default();
        // A probed free port can be taken (another test's outgoing connection) before the node binds it: try a few.
        async fn start_on_a_free_port(name: &str, cookie: &Cookie, cfg: &ControlConfig) -> ControlNode<ControlMsg> {
            let mut last = None;
            for _ in 0..5 {
                match ControlNode::start(name, free_port_base(1), cookie, cfg.clone()).await {
                    Ok(n) => return n,
                    Err(e) => last = Some(e),
                }
            }
            panic!("{name}: no free port in 5 tries: {last:?}")
        }
        let wrong = start_on_a_free_port("intruder-wrong-cookie", &stranger, &cfg).await;
        let _ = wrong.connect(&format!("127.0.0.1:{control}")).await;
        let node = start_on_a_free_port("intruder", &cookie, &cfg).await;
        node.connect(&format!("127.0.0.1:{control}")).await.unwrap();
        node.wait_for_peer("local/main", Duration::from_secs(10)).await.unwrap();
        // Each kind of bad input waits until the controller has counted the one before, so
        // the last (a duplicate claim, which closes the intruder's session) cannot overtake them.
        let counted = |reason: &str| series(&scrape(&metrics), &format!("rlmesh_peer_rejected_total{{plane=\"control\",reason=\"{reason}\"}}")) >= 1.0;
        async fn until(what: &str, done: impl Fn() -> bool) {
            let t0 = Instant::now();
            while !done() {
                assert!(t0.elapsed() < Duration::from_secs(30), "the controller never counted {what}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        node.send_raw("local/main", b"garbage on the control plane, long enough for a header......".to_vec()).unwrap();
        until("garbage", || counted("malformed")).await;
        node.send_raw("local/main", FrameCodec::new(cookie.as_bytes(), 1 << 30).seal(0x0100, &vec![0u8; 5 << 20]).unwrap()).unwrap();
        until("a 5 MiB frame", || counted("too_large")).await;
        node.send_raw("local/main", FrameCodec::for_version(cookie.as_bytes(), 1 << 20, "0.0.9").seal(0x0100, b"x").unwrap()).unwrap();
        until("another version", || counted("version")).await;
        // Valid messages from a name not in the plan.
        node.send("local/main", &ControlMsg::Receive { id: 1 }).unwrap();
        node.send("local/main", &ControlMsg::Stop).unwrap();
        until("an unknown name", || counted("unknown_peer")).await;
        // A valid message of the wrong type: a data-plane message on the control plane.
        node.send_raw("local/main", node.frame("local/main", &DataMsg::Learner { id: 1, call: Json::of(&"x") }).unwrap()).unwrap();
        until("a data message on the control plane", || counted("kind")).await;
        // A claim of a live process's name.
        node.send_as_name("local/reward", "local/main", &ControlMsg::Ready(Ok(()))).unwrap();
        until("a duplicate claim", || counted("duplicate")).await;
    });
    // Random bytes straight at the control port's TCP listener: a session that never authenticates.
    {
        use std::io::Write;
        let mut raw = std::net::TcpStream::connect(format!("127.0.0.1:{control}")).unwrap();
        let _ = raw.write_all(&(0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect::<Vec<u8>>());
    }
    std::thread::sleep(Duration::from_secs(2));

    // Every process listens on its host's address only (here 127.0.0.1), never on every interface.
    let status: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    for p in status["processes"].as_array().unwrap() {
        assert_listens_only_on(p["pid"].as_u64().unwrap() as u32, "127.0.0.1");
    }
    let main_pid = status["processes"][0]["pid"].as_u64().unwrap() as u32;
    for port in [control, data] {
        assert!(listening_addresses(main_pid).contains(&format!("127.0.0.1:{port}").parse().unwrap()), "{:?}", listening_addresses(main_pid));
    }

    // Every other process serves /metrics on its planned port (the i-th process of the host: base + i).
    for i in [1, 2] {
        let node = scrape(&format!("127.0.0.1:{}", t.base("metrics") + i));
        assert!(node.contains("rlmesh_peer_rejected_total{plane=\"control\",reason=\"handshake\"} 0"), "process {i}'s /metrics:\n{node}");
    }
    let text = scrape(&metrics);
    let expected = [
        ("data", "malformed"), ("data", "unauthenticated"), ("data", "version"), ("data", "too_large"), ("data", "kind"), ("data", "unexpected"),
        ("control", "malformed"), ("control", "too_large"), ("control", "version"), ("control", "handshake"), ("control", "kind"), ("control", "unknown_peer"), ("control", "duplicate"),
    ];
    for (plane, reason) in expected {
        let n = series(&text, &format!("rlmesh_peer_rejected_total{{plane=\"{plane}\",reason=\"{reason}\"}}"));
        assert!(n >= 1.0, "{plane}/{reason} not counted:\n{}\n{}", text.lines().filter(|l| l.contains("rejected")).collect::<Vec<_>>().join("\n"), std::fs::read_to_string(&log).unwrap_or_default().lines().filter(|l| l.contains("[control]") || l.contains("[fleet]")).collect::<Vec<_>>().join("\n"));
    }
    let status = t.child.wait().unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "the run survives bad input: {logged}");
    for (_, reason) in expected {
        assert!(logged.contains(&format!("({reason})")), "the log names {reason}:\n{logged}");
    }
    // The duplicate claim and the handshake name the peer's address.
    assert!(logged.lines().any(|l| l.contains("(duplicate)") && l.contains("127.0.0.1")), "{logged}");
    assert!(logged.lines().any(|l| l.contains("(handshake)") && l.contains("127.0.0.1")), "{logged}");
    assert!(run.join("summary.json").is_file());
    assert_trained_once(&run);
    assert_no_nodes_left(&run);
}
