//! The weight-sync collective between real processes: bucketed broadcast from
//! the root, each bucket digested on arrival and checked against the root's.
mod common;

use common::{run_world, value};
use rlmesh_comm::worker::WorkerOp;
use rlmesh_comm::DType;

#[test]
fn weight_sync_delivers_every_bucket_intact_to_every_receiver() {
    for world in [2, 3, 5] {
        let run = run_world(world, |_, a| {
            a.op = WorkerOp::WeightSync;
            a.len = 10_007; // not a multiple of the bucket
            a.bucket_bytes = 4096;
            a.iters = 2;
        });
        run.assert_ok();
        let got = run.identical(DType::F32);
        assert_eq!(got, (0..10_007).map(|i| value(0, i)).collect::<Vec<_>>(), "world {world}");
    }
}

#[test]
fn a_corrupted_bucket_is_refused_by_its_receiver_and_named() {
    let run = run_world(3, |_, a| {
        a.op = WorkerOp::WeightSync;
        a.len = 10_000;
        a.bucket_bytes = 4096;
        a.corrupt_bucket = Some(4);
    });
    let last = &run.outputs[2];
    assert!(!last.success(), "the corrupted receiver must fail");
    assert!(last.stderr.contains("bucket 4 of 10") && last.stderr.contains("refused"), "{}", last.stderr);
    assert!(run.outputs[0].success() && run.outputs[1].success(), "root and the intact receiver finish: {} / {}", run.outputs[0].stderr, run.outputs[1].stderr);
}

/// Ranks on one host broadcast through one shared segment; with
/// `--ring-only` along the TCP ring: the same bytes either way, every bucket
/// checked, and no segment left in /dev/shm by a process that is gone.
#[test]
fn shared_memory_and_the_ring_deliver_the_same_bytes_and_leave_nothing_behind() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        println!("SKIPPED: no /dev/shm here");
        return;
    }
    let mut seen = vec![];
    for ring_only in [false, true] {
        let run = run_world(3, |_, a| {
            a.op = WorkerOp::WeightSync;
            a.len = 300_007;
            a.bucket_bytes = 64 << 10;
            a.iters = 3;
            a.json = true;
            a.ring_only = ring_only;
        });
        run.assert_ok();
        let got = run.identical(DType::F32);
        assert_eq!(got, (0..300_007).map(|i| value(0, i)).collect::<Vec<_>>(), "ring_only {ring_only}");
        let shared: Vec<bool> = run
            .outputs
            .iter()
            .map(|o| {
                let line = o.stdout.lines().rev().find(|l| l.starts_with('{')).expect("a JSON report");
                serde_json::from_str::<serde_json::Value>(line).unwrap()["shared_memory"].as_bool().unwrap()
            })
            .collect();
        assert_eq!(shared, vec![!ring_only; 3], "every rank agrees on the transport");
        seen.push(got);
    }
    assert_eq!(seen[0], seen[1]);
    for e in std::fs::read_dir("/dev/shm").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(pid) = name.strip_prefix("rlmesh-ring-").and_then(|r| r.split('-').next()) {
            assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "{name}: a segment of a process that is gone");
        }
    }
}
