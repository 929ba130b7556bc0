//! Random and mutated frames thrown at a live node process's data and
//! control ports. A test binary of its own: `ractor_cluster` numbers remote
//! actors per node server, so two tests' control nodes in one process could
//! take each other's actor ids (one control node per process is the rule).
mod common;

use common::*;
use rlmesh_actors::node::wire::{ControlMsg, DataMsg, Json};
use rlmesh_mesh::control::{ControlConfig, ControlNode};
use rlmesh_mesh::frame::FrameCodec;
use std::time::{Duration, Instant};

/// A small seeded generator (xorshift64*), so a failing fuzz run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A bad variant of `good`: random bytes, a flipped byte, a cut, trailing bytes, or a rewritten length.
fn mutate(rng: &mut Rng, good: &[u8]) -> Vec<u8> {
    let mut f = good.to_vec();
    match rng.below(5) {
        0 => {
            let n = rng.below(2000);
            return rng.bytes(n);
        }
        1 => {
            let i = rng.below(f.len());
            f[i] ^= 1 + rng.below(255) as u8;
        }
        2 => f.truncate(rng.below(f.len())),
        3 => {
            let n = 1 + rng.below(64);
            f.extend(rng.bytes(n));
        }
        _ => {
            let len = rng.next() | 1 << 20;
            f[24..32].copy_from_slice(&len.to_le_bytes());
        }
    }
    f
}

/// Random and mutated frames at a live node's data and control ports (not the
/// controller's): every one is refused and counted by that node, which goes on
/// serving, and the run finishes with every group trained once.
#[test]
fn fuzzed_frames_at_a_live_nodes_ports_are_each_refused_and_counted_and_the_run_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut t = Target::start(tmp.path(), "fuzzed", 6);
    let node = "local/rollout-0";
    let (control, data, metrics) = (t.port_of(node, "control"), t.port_of(node, "data"), t.port_of(node, "metrics"));
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("fuzz seed {seed}");
    let mut rng = Rng(seed);
    let codec = FrameCodec::new(t.cookie.as_bytes(), 1 << 20);
    let seeds = [
        codec.encode(&DataMsg::Groups { id: 3, result: Err("x".into()) }).unwrap(),
        codec.encode(&DataMsg::Learner { id: 4, call: Json::of(&"call") }).unwrap(),
        codec.encode(&DataMsg::LearnerDone { id: 5, rank: 0, result: Ok(Json::of(&"done")) }).unwrap(),
    ];
    const N: usize = 400;
    // The data port.
    let ctx = zmq::Context::new();
    let push = ctx.socket(zmq::PUSH).unwrap();
    push.connect(&format!("tcp://127.0.0.1:{data}")).unwrap();
    for _ in 0..N {
        let good = &seeds[rng.below(seeds.len())];
        let mut bad = mutate(&mut rng, good);
        if bad == *good {
            bad.push(0);
        }
        push.send(bad, 0).unwrap();
    }
    // The control port: mutated envelopes inside an authenticated session, then raw bytes on new connections.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    const RAW: usize = 20;
    rt.block_on(async {
        let fuzzer = loop {
            if let Ok(n) = ControlNode::<ControlMsg>::start("fuzzer", free_port_base(1), &t.cookie, ControlConfig::default()).await {
                break n;
            }
        };
        fuzzer.connect(&format!("127.0.0.1:{control}")).await.unwrap();
        fuzzer.wait_for_peer(node, Duration::from_secs(10)).await.unwrap();
        let good = [fuzzer.frame(node, &ControlMsg::Stop).unwrap(), fuzzer.frame(node, &ControlMsg::Receive { id: 9 }).unwrap()];
        for _ in 0..N {
            let g = &good[rng.below(good.len())];
            let mut bad = mutate(&mut rng, g);
            if bad == *g {
                bad.push(0);
            }
            fuzzer.send_raw(node, bad).unwrap();
        }
        for _ in 0..RAW {
            use tokio::io::AsyncWriteExt;
            let mut s = tokio::net::TcpStream::connect(format!("127.0.0.1:{control}")).await.unwrap();
            let n = 1 + rng.below(3000);
            let _ = s.write_all(&rng.bytes(n)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    });
    // Every frame counted by the node, which still serves /metrics.
    let t0 = Instant::now();
    let counted = |plane: &str| series(&scrape(&format!("127.0.0.1:{metrics}")), &format!("rlmesh_peer_rejected_total{{plane=\"{plane}\""));
    while (counted("data") < N as f64 || counted("control") < (N + RAW) as f64) && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = scrape(&format!("127.0.0.1:{metrics}"));
    let rejected: Vec<&str> = text.lines().filter(|l| l.starts_with("rlmesh_peer_rejected_total{") && !l.ends_with(" 0")).collect();
    assert_eq!(counted("data"), N as f64, "seed {seed}: {rejected:?}");
    let node_log = std::fs::read_to_string(t.run.join("logs/local_rollout-0.log")).unwrap_or_default();
    assert_eq!(counted("control"), (N + RAW) as f64, "seed {seed}: {rejected:?}\n{node_log}");
    let status = t.child.wait().unwrap();
    assert!(status.success(), "seed {seed}: the run survives the fuzz: {}", std::fs::read_to_string(&t.log).unwrap());
    assert_trained_once(&t.run);
    assert_no_nodes_left(&t.run);
}
