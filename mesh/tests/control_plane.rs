//! The control plane between real processes over loopback (ractor_cluster
//! underneath): messages both ways, bad peers refused and counted, a silent
//! peer declared lost while its TCP connection stays open, bounded windows.
//!
//! A custom harness: started with `RLMESH_CP_ROLE` set, this binary plays a
//! peer process instead of running the tests. The cookie reaches peers in the
//! environment, never in argv.
mod common;

use rlmesh_mesh::control::{ControlConfig, ControlError, ControlNode, PeerEvent};
use rlmesh_mesh::cookie::{Cookie, COOKIE_ENV};
use rlmesh_mesh::frame::{FrameCodec, WireMessage};
use serde::{Deserialize, Serialize};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Ctl {
    Ping(u64),
    Pong(u64),
}

impl WireMessage for Ctl {
    const KIND: u16 = 0xfff2;
    const NAME: &'static str = "Ctl";
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn cfg() -> ControlConfig {
    ControlConfig { heartbeat: Duration::from_millis(100), deadline: Duration::from_millis(1500), window: 16, queue: 4, cap: 64 << 10, ..ControlConfig::default() }
}

/// peer NAME HUB_PORT MODE (echo | impostor | fuzz | sink | raw | version)
async fn peer(args: Vec<String>) {
    let (name, hub_port, mode) = (&args[0], &args[1], args[2].as_str());
    let cookie = Cookie::from_env().unwrap();
    let node: ControlNode<Ctl> = if mode == "version" {
        ControlNode::start_with_codec(name, free_port(), &cookie, FrameCodec::for_version(cookie.as_bytes(), cfg().cap, "0.0.9"), cfg()).await.unwrap()
    } else {
        ControlNode::start(name, free_port(), &cookie, cfg()).await.unwrap()
    };
    let mut node = node;
    node.connect(&format!("127.0.0.1:{hub_port}")).await.unwrap();
    if node.wait_for_peer("hub", Duration::from_secs(10)).await.is_err() {
        eprintln!("peer {name}: the hub never appeared");
        tokio::time::sleep(Duration::from_secs(2)).await;
        return;
    }
    match mode {
        // An impostor answers like echo, plus a million, so the hub can tell who answered.
        "echo" | "impostor" => {
            let plus = if mode == "impostor" { 1_000_000 } else { 0 };
            while let Some((from, m)) = node.recv().await {
                if let Ctl::Ping(n) = m {
                    while let Err(ControlError::Full { .. }) = node.send(&from, &Ctl::Pong(n + plus)) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        }
        "raw" => {
            let codec = FrameCodec::new(cookie.as_bytes(), cfg().cap);
            node.send_raw("hub", vec![1, 2, 3]).unwrap();
            node.send_raw("hub", b"not a frame at all, though long enough to hold a header".to_vec()).unwrap();
            node.send_raw("hub", FrameCodec::new(cookie.as_bytes(), 1 << 30).seal(0x0100, &vec![0u8; cfg().cap as usize + 1]).unwrap()).unwrap();
            node.send_raw("hub", codec.seal(0x0100, &[0xff; 7]).unwrap()).unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        "fuzz" => {
            let codec = FrameCodec::new(cookie.as_bytes(), cfg().cap);
            let good = node.frame("hub", &Ctl::Ping(5)).unwrap();
            let mut x: u64 = 0x9E3779B97F4A7C15;
            for _ in 0..400 {
                x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
                let r = x.wrapping_mul(0x2545F4914F6CDD1D);
                let mut f = good.clone();
                match r % 3 {
                    0 => { let k = (r >> 8) as usize % f.len(); f[k] ^= 1 + ((r >> 20) as u8 % 255); }
                    1 => f.truncate((r >> 8) as usize % f.len()),
                    _ => f.extend_from_slice(&codec.seal(7, &[1]).unwrap()[..((r >> 8) % 40) as usize + 1]),
                }
                node.send_raw("hub", f).unwrap();
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        // sink: never reads; version: every frame it sends claims 0.0.9.
        _ => {
            let _ = node.send("hub", &Ctl::Pong(0));
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    }
}

fn spawn_peer(name: &str, hub_port: u16, mode: &str, cookie: &Cookie) -> Child {
    Command::new(std::env::current_exe().unwrap()).env("RLMESH_CP_ROLE", "peer").env(COOKIE_ENV, cookie.to_hex()).args([name, &hub_port.to_string(), mode]).spawn().unwrap()
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn hub(cookie: &Cookie) -> (ControlNode<Ctl>, u16) {
    let port = free_port();
    (ControlNode::start("hub", port, cookie, cfg()).await.unwrap(), port)
}

async fn messages_cross_processes_both_ways() {
    let cookie = Cookie::generate().unwrap();
    let (mut hub, port) = hub(&cookie).await;
    let _p = Killed(spawn_peer("echo-1", port, "echo", &cookie));
    hub.wait_for_peer("echo-1", Duration::from_secs(10)).await.unwrap();
    let mut next = 0u64;
    for n in 0..200u64 {
        loop {
            match hub.send("echo-1", &Ctl::Ping(n)) {
                Ok(()) => break,
                Err(ControlError::Full { .. }) => {
                    let (from, m) = tokio::time::timeout(Duration::from_secs(10), hub.recv()).await.unwrap().unwrap();
                    assert_eq!((from.as_str(), m), ("echo-1", Ctl::Pong(next)));
                    next += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    while next < 200 {
        let (_, m) = tokio::time::timeout(Duration::from_secs(10), hub.recv()).await.expect("every pong within 10 s").unwrap();
        assert_eq!(m, Ctl::Pong(next), "in order");
        next += 1;
    }
    assert_eq!(hub.stats().delivered(), 200);
    assert!(hub.stats().refusals().iter().all(|(_, c)| *c == 0), "{:?}", hub.stats().refusals());
}

async fn bad_peers_are_refused_and_counted_and_the_hub_keeps_serving() {
    let cookie = Cookie::generate().unwrap();
    let (mut hub, port) = hub(&cookie).await;
    let wrong = Killed(spawn_peer("stranger", port, "sink", &Cookie::generate().unwrap()));
    let old = Killed(spawn_peer("old-build", port, "version", &cookie));
    let raw = Killed(spawn_peer("raw", port, "raw", &cookie));
    let t0 = Instant::now();
    let done = |h: &ControlNode<Ctl>| h.stats().refused("handshake") >= 1 && h.stats().refused("version") >= 1 && h.stats().refused("malformed") >= 2 && h.stats().refused("too_large") >= 1 && h.stats().refused("payload") >= 1;
    while !done(&hub) && t0.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(done(&hub), "refusals {:?}", hub.stats().refusals());
    drop((wrong, old, raw));
    // A good peer after all of them is served.
    let _p = Killed(spawn_peer("echo-2", port, "echo", &cookie));
    hub.wait_for_peer("echo-2", Duration::from_secs(10)).await.unwrap();
    hub.send("echo-2", &Ctl::Ping(7)).unwrap();
    let (from, m) = tokio::time::timeout(Duration::from_secs(10), hub.recv()).await.unwrap().unwrap();
    assert_eq!((from.as_str(), m), ("echo-2", Ctl::Pong(7)));
    // The old build's frames never reached the consumer, nor did the stranger's.
    assert_eq!(hub.stats().delivered(), 1);
}

async fn a_silent_peer_is_lost_while_its_connection_stays_open() {
    let cookie = Cookie::generate().unwrap();
    let (mut hub, port) = hub(&cookie).await;
    let p = Killed(spawn_peer("sleeper", port, "echo", &cookie));
    hub.wait_for_peer("sleeper", Duration::from_secs(10)).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(10), hub.next_event()).await.unwrap().unwrap();
    assert_eq!(ev, PeerEvent::Joined("sleeper".into()));
    let pid = p.0.id() as i32;
    // SIGSTOP: the process is frozen, the kernel keeps its TCP connection open.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let t0 = Instant::now();
    let ev = tokio::time::timeout(Duration::from_secs(10), hub.next_event()).await.unwrap().unwrap();
    let waited = t0.elapsed();
    assert_eq!(ev, PeerEvent::Lost("sleeper".into()));
    assert!(waited >= Duration::from_millis(1000) && waited < Duration::from_millis(4000), "declared lost after {waited:?} (deadline 1.5 s)");
    assert!(matches!(hub.send("sleeper", &Ctl::Ping(1)), Err(ControlError::Lost(_))));
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let ev = tokio::time::timeout(Duration::from_secs(10), hub.next_event()).await.unwrap().unwrap();
    assert_eq!(ev, PeerEvent::Back("sleeper".into()));
    hub.send("sleeper", &Ctl::Ping(2)).unwrap();
    let (_, m) = tokio::time::timeout(Duration::from_secs(10), hub.recv()).await.unwrap().unwrap();
    assert_eq!(m, Ctl::Pong(2));
}

/// Pings `peer` and returns its answer.
async fn ping(hub: &mut ControlNode<Ctl>, peer: &str, n: u64) -> Ctl {
    hub.send(peer, &Ctl::Ping(n)).unwrap();
    let (from, m) = tokio::time::timeout(Duration::from_secs(10), hub.recv()).await.expect("an answer within 10 s").unwrap();
    assert_eq!(from, peer);
    m
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(15), "{what}: not within 15 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_second_process_claiming_a_name_is_refused_and_the_first_keeps_it() {
    let cookie = Cookie::generate().unwrap();
    let (mut hub, port) = hub(&cookie).await;
    let first = Killed(spawn_peer("rank-1", port, "echo", &cookie));
    hub.wait_for_peer("rank-1", Duration::from_secs(10)).await.unwrap();
    assert_eq!(ping(&mut hub, "rank-1", 1).await, Ctl::Pong(1));
    // A second process under the same name (a stale start, a double launch): its
    // first heartbeat is refused, counted, and its session closed.
    let _impostor = Killed(spawn_peer("rank-1", port, "impostor", &cookie));
    wait_for("the duplicate claim refused", || hub.stats().refused("duplicate") >= 1).await;
    for n in 2..22 {
        assert_eq!(ping(&mut hub, "rank-1", n).await, Ctl::Pong(n), "the name stays with the first process");
    }
    // The run replaces the first process (it was lost): its incarnation is
    // retired, and a new start under the name is served.
    hub.sender().forget("rank-1");
    wait_for("the retired incarnation refused", || hub.stats().refused("superseded") >= 1).await;
    drop(first);
    let _second = Killed(spawn_peer("rank-1", port, "echo", &cookie));
    let t0 = Instant::now();
    loop {
        // Until the new start has joined, the retired incarnation is the only member and is not used.
        match hub.send("rank-1", &Ctl::Ping(99)) {
            Ok(()) => break,
            Err(ControlError::NoPeer(_)) if t0.elapsed() < Duration::from_secs(15) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{e}"),
        }
    }
    let (from, m) = tokio::time::timeout(Duration::from_secs(10), hub.recv()).await.unwrap().unwrap();
    assert_eq!((from.as_str(), m), ("rank-1", Ctl::Pong(99)));
    assert_eq!(ping(&mut hub, "rank-1", 100).await, Ctl::Pong(100));
}

/// A hub with two peers (ractor_cluster then re-announces each peer's group
/// to the other under foreign pids): 400 mutated frames from one peer are each
/// refused exactly once, and the other peer is still served.
async fn fuzzed_messages_are_each_refused_once_and_the_hub_keeps_serving() {
    let cookie = Cookie::generate().unwrap();
    let (mut hub, port) = hub(&cookie).await;
    let _echo = Killed(spawn_peer("echo-3", port, "echo", &cookie));
    hub.wait_for_peer("echo-3", Duration::from_secs(10)).await.unwrap();
    let _fuzz = Killed(spawn_peer("fuzz", port, "fuzz", &cookie));
    let total = |h: &ControlNode<Ctl>| h.stats().refusals().iter().map(|(_, n)| n).sum::<u64>();
    wait_for("400 refusals", || total(&hub) >= 400).await;
    for n in 0..10 {
        assert_eq!(ping(&mut hub, "echo-3", n).await, Ctl::Pong(n));
    }
    assert_eq!(total(&hub), 400, "{:?}", hub.stats().refusals());
}

async fn a_peer_that_does_not_read_fills_its_window() {
    let cookie = Cookie::generate().unwrap();
    let (hub, port) = hub(&cookie).await;
    let _p = Killed(spawn_peer("sink", port, "sink", &cookie));
    hub.wait_for_peer("sink", Duration::from_secs(10)).await.unwrap();
    let mut sent = 0u64;
    let t0 = Instant::now();
    loop {
        match hub.send("sink", &Ctl::Ping(sent)) {
            Ok(()) => sent += 1,
            Err(ControlError::Full { window: 16, .. }) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(sent < 1000 && t0.elapsed() < Duration::from_secs(20), "never full after {sent}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The sink's queue (4) plus acknowledged batches: far from unbounded.
    assert!((16..=64).contains(&sent), "{sent} sent before the window closed");
    println!("    (the window closed after {sent} messages)");
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    if std::env::var("RLMESH_CP_ROLE").is_ok() {
        rt.block_on(peer(std::env::args().skip(1).collect()));
        return;
    }
    common::run(&[
        ("messages_cross_processes_both_ways", || block(messages_cross_processes_both_ways())),
        ("bad_peers_are_refused_and_counted_and_the_hub_keeps_serving", || block(bad_peers_are_refused_and_counted_and_the_hub_keeps_serving())),
        ("a_silent_peer_is_lost_while_its_connection_stays_open", || block(a_silent_peer_is_lost_while_its_connection_stays_open())),
        ("a_second_process_claiming_a_name_is_refused_and_the_first_keeps_it", || block(a_second_process_claiming_a_name_is_refused_and_the_first_keeps_it())),
        ("fuzzed_messages_are_each_refused_once_and_the_hub_keeps_serving", || block(fuzzed_messages_are_each_refused_once_and_the_hub_keeps_serving())),
        ("a_peer_that_does_not_read_fills_its_window", || block(a_peer_that_does_not_read_fills_its_window())),
    ]);
}

/// Each test on a fresh runtime, so a failed test's tasks do not leak into the next.
fn block<F: std::future::Future<Output = ()>>(f: F) {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap().block_on(f)
}
