//! The data plane between real processes over loopback.
//!
//! This test binary is its own peer: started with `RLMESH_DP_ROLE` set it plays
//! a sender or a receiver process instead of running the tests (a custom
//! harness, so every peer is a real OS process with its own sockets). The run
//! cookie reaches peers through the environment, never through argv.
mod common;

use rlmesh_mesh::cookie::{Cookie, COOKIE_ENV};
use rlmesh_mesh::data_plane::{DataPlaneConfig, DataPlaneError, Inbox, Outbox};
use rlmesh_mesh::frame::{FrameCodec, WireMessage};
use serde::{Deserialize, Serialize};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CAP: u64 = 1 << 20;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Probe {
    sender: u32,
    seq: u64,
    tokens: Vec<u32>,
    text: String,
}

impl WireMessage for Probe {
    const KIND: u16 = 0xfff1;
    const NAME: &'static str = "Probe";
}

fn probe(sender: u32, seq: u64) -> Probe {
    Probe { sender, seq, tokens: (0..(seq % 97) as u32).map(|i| i * 31 + sender).collect(), text: format!("group {seq} from {sender} ✓") }
}

fn codec_from_env() -> FrameCodec {
    FrameCodec::new(Cookie::from_env().expect("cookie in the environment").as_bytes(), CAP)
}

fn peer(role: &str) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = DataPlaneConfig::default();
    match role {
        // send SENDER N ENDPOINT
        "send" => {
            let (sender, n, endpoint) = (args[0].parse().unwrap(), args[1].parse::<u64>().unwrap(), &args[2]);
            let out = Outbox::<Probe>::connect(endpoint, codec_from_env(), &cfg).unwrap();
            for seq in 0..n {
                out.blocking_send(&probe(sender, seq)).unwrap();
            }
        }
        // recv GOOD ENDPOINT_FILE: bind, publish the endpoint, take GOOD messages, print the counters.
        "recv" => {
            let (good, file) = (args[0].parse::<usize>().unwrap(), &args[1]);
            let mut inbox = Inbox::<Probe>::bind("tcp://127.0.0.1:0", codec_from_env(), &cfg).unwrap();
            std::fs::write(file, inbox.endpoint()).unwrap();
            let mut got = vec![];
            let t0 = Instant::now();
            while got.len() < good && t0.elapsed() < Duration::from_secs(30) {
                if let Some(m) = inbox.recv_timeout(Duration::from_millis(200)) {
                    got.push(m);
                }
            }
            let stats = inbox.stats();
            let refused: serde_json::Map<String, serde_json::Value> = stats.refusals().into_iter().map(|(r, n)| (r.to_string(), n.into())).collect();
            println!("{}", serde_json::json!({"delivered": stats.delivered(), "refused": refused, "ok": got.iter().all(|m| *m == probe(m.sender, m.seq))}));
        }
        other => panic!("unknown role {other}"),
    }
}

fn me() -> Command {
    Command::new(std::env::current_exe().unwrap())
}

/// Two sender processes feed one inbox: every message arrives intact, each sender's in order.
fn two_processes_feed_one_inbox() {
    let cookie = Cookie::generate().unwrap();
    let mut inbox = Inbox::<Probe>::bind("tcp://127.0.0.1:0", FrameCodec::new(cookie.as_bytes(), CAP), &DataPlaneConfig::default()).unwrap();
    let n = 300u64;
    let children: Vec<_> = (1..=2u32)
        .map(|s| me().env("RLMESH_DP_ROLE", "send").env(COOKIE_ENV, cookie.to_hex()).args([s.to_string(), n.to_string(), inbox.endpoint().to_string()]).spawn().unwrap())
        .collect();
    let mut next = [0u64; 3];
    for _ in 0..2 * n {
        let m = inbox.recv_timeout(Duration::from_secs(30)).expect("a message within 30 s");
        assert_eq!(m, probe(m.sender, m.seq));
        assert_eq!(m.seq, next[m.sender as usize], "sender {}'s messages in order", m.sender);
        next[m.sender as usize] += 1;
    }
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(next, [0, n, n]);
    assert_eq!(inbox.stats().delivered(), 2 * n);
    assert!(inbox.stats().refusals().iter().all(|(_, c)| *c == 0));
}

/// A receiver process refuses garbage, another version, a wrong cookie and
/// oversized frames — counting each and naming it in its log — and keeps
/// delivering the good messages that come after them.
fn bad_frames_are_refused_counted_and_logged() {
    let cookie = Cookie::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("endpoint");
    let good = 3;
    let child = me()
        .env("RLMESH_DP_ROLE", "recv")
        .env(COOKIE_ENV, cookie.to_hex())
        .args([good.to_string(), file.display().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let endpoint = loop {
        if let Ok(e) = std::fs::read_to_string(&file) {
            if !e.is_empty() {
                break e;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "receiver never bound");
        std::thread::sleep(Duration::from_millis(20));
    };
    let cfg = DataPlaneConfig::default();
    let ours = FrameCodec::new(cookie.as_bytes(), CAP);
    // A raw ZeroMQ peer sends garbage and hand-made frames.
    let ctx = zmq::Context::new();
    let raw = ctx.socket(zmq::PUSH).unwrap();
    raw.set_linger(2000).unwrap();
    raw.connect(&endpoint).unwrap();
    for i in 0..5u8 {
        raw.send(&vec![i; 10 + i as usize * 100][..], 0).unwrap();
    }
    let big = FrameCodec::new(cookie.as_bytes(), 4 * CAP).seal(Probe::KIND, &vec![7u8; CAP as usize + 1]).unwrap();
    for _ in 0..2 {
        raw.send(&big[..], 0).unwrap();
    }
    // Authenticated bytes that are not a Probe.
    raw.send(&ours.seal(Probe::KIND, &[0xff; 9]).unwrap()[..], 0).unwrap();
    {
        let wrong_cookie = Outbox::<Probe>::connect(&endpoint, FrameCodec::new(Cookie::generate().unwrap().as_bytes(), CAP), &cfg).unwrap();
        let old_build = Outbox::<Probe>::connect(&endpoint, FrameCodec::for_version(cookie.as_bytes(), CAP, "0.0.9"), &cfg).unwrap();
        for s in 0..4 {
            wrong_cookie.blocking_send(&probe(9, s)).unwrap();
            old_build.blocking_send(&probe(8, s)).unwrap();
        }
    }
    // Wait until the bad ones are through before the good ones, so the receiver
    // sees them all before it has its three good messages and exits.
    std::thread::sleep(Duration::from_millis(500));
    let out = Outbox::<Probe>::connect(&endpoint, ours.clone(), &cfg).unwrap();
    for s in 0..good as u64 {
        out.blocking_send(&probe(1, s)).unwrap();
    }
    drop(out);
    let o = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "receiver failed: {log}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
    assert_eq!(v["delivered"], good, "{v}\n{log}");
    assert_eq!(v["ok"], true);
    let r = &v["refused"];
    assert_eq!((r["malformed"].as_u64(), r["too_large"].as_u64(), r["payload"].as_u64()), (Some(5), Some(2), Some(1)), "{v}\n{log}");
    assert_eq!((r["unauthenticated"].as_u64(), r["version"].as_u64()), (Some(4), Some(4)), "{v}\n{log}");
    for needle in ["(unauthenticated): frame not authenticated", "(version): peer speaks rlmesh 0.0.9", "(too_large)", "(malformed)", "from 127.0.0.1"] {
        assert!(log.contains(needle), "the receiver's log names {needle:?}:\n{log}");
    }
}

/// Nobody reads: the sender's queue fills and `try_send` says so instead of
/// growing memory; a frame over the cap is refused at the sender.
fn queues_are_bounded() {
    let cookie = Cookie::generate().unwrap();
    let codec = FrameCodec::new(cookie.as_bytes(), CAP);
    let cfg = DataPlaneConfig { high_water_mark: 4, queue: 4, linger: Duration::from_millis(100), ..Default::default() };
    let inbox = Inbox::<Probe>::bind("tcp://127.0.0.1:0", codec.clone(), &cfg).unwrap();
    let out = Outbox::<Probe>::connect(inbox.endpoint(), codec, &cfg).unwrap();
    let heavy = Probe { sender: 1, seq: 0, tokens: vec![5; 60_000], text: String::new() };
    let mut sent = 0;
    let t0 = Instant::now();
    loop {
        match out.try_send(&heavy) {
            Ok(()) => sent += 1,
            Err(DataPlaneError::Full { capacity: 4, .. }) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(sent < 2000, "the queues never filled: {sent} messages of 240 KB accepted");
        assert!(t0.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(2));
    }
    // inbox queue + both high-water marks + the sender queue, plus what the kernel's socket buffers hold.
    assert!(sent >= 4, "{sent}");
    let huge = Probe { sender: 1, seq: 0, tokens: vec![0; CAP as usize / 4 + 1], text: String::new() };
    assert!(matches!(out.try_send(&huge), Err(DataPlaneError::Frame(_))));
    println!("    (the queues filled after {sent} messages of 240 KB)");
}

fn main() {
    if let Ok(role) = std::env::var("RLMESH_DP_ROLE") {
        peer(&role);
        return;
    }
    common::run(&[
        ("two_processes_feed_one_inbox", two_processes_feed_one_inbox),
        ("bad_frames_are_refused_counted_and_logged", bad_frames_are_refused_counted_and_logged),
        ("queues_are_bounded", queues_are_bounded),
    ]);
}
