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
