//! The CPU ring's collectives across 2, 3 and 4 ranks in separate processes:
//! results equal the values computed here, and every rank ends bit-identical.

mod common;

use common::{run_op, run_world, value};
use rlmesh_comm::worker::{WorkerOp, DEFAULT_SLICES};
use rlmesh_comm::{DType, ReduceOp};

fn expected_sum(world: usize, len: usize) -> Vec<f64> {
    (0..len).map(|i| (0..world).map(|r| value(r, i)).sum()).collect()
}

#[test]
fn all_reduce_sum_equals_expected_for_odd_small_and_empty_lengths() {
    for world in 2..=4 {
        for len in [0, 1, world - 1, 7, 1001, 40_003] {
            let run = run_op(world, WorkerOp::AllReduce(ReduceOp::Sum), DType::F32, len);
            run.assert_ok();
            let got = run.identical(DType::F32);
            assert_eq!(got, expected_sum(world, len), "world {world}, len {len}");
        }
    }
}

#[test]
fn all_reduce_mean_equals_expected_in_every_dtype() {
    for world in [2, 3, 4] {
        for dtype in [DType::F32, DType::F64, DType::Bf16] {
            let len = 513;
            let run = run_op(world, WorkerOp::AllReduce(ReduceOp::Mean), dtype, len);
            run.assert_ok();
            let got = run.identical(dtype);
            let want: Vec<f64> = expected_sum(world, len)
                .into_iter()
                .map(|s| match dtype {
                    DType::F32 => (s as f32 / world as f32) as f64,
                    DType::F64 => s / world as f64,
                    DType::Bf16 => rlmesh_comm::Bf16::from_f32(s as f32 / world as f32).to_f32() as f64,
                })
                .collect();
            assert_eq!(got, want, "world {world}, {dtype:?}");
        }
    }
}

#[test]
fn all_reduce_of_rounding_data_is_bit_identical_on_every_rank() {
    for world in [3, 4] {
        for dtype in [DType::F32, DType::Bf16] {
            let run = run_world(world, |_, a| {
                a.op = WorkerOp::AllReduce(ReduceOp::Sum);
                a.dtype = dtype;
                a.len = 20_011;
                a.random = true;
            });
            run.assert_ok();
            let got = run.identical(dtype);
            let want: Vec<f64> = (0..20_011)
                .map(|i| (0..world).map(|r| rlmesh_comm::worker::random_value(r, i)).sum::<f64>())
                .collect();
            let tol = if dtype == DType::F32 { 1e-2 } else { 64.0 };
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= tol, "world {world} {dtype:?} element {i}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn broadcast_from_every_root() {
    for world in 2..=4 {
        for root in 0..world {
            let run = run_world(world, |_, a| {
                a.op = WorkerOp::Broadcast;
                a.root = root;
                a.len = 3001;
            });
            run.assert_ok();
            let got = run.identical(DType::F32);
            let want: Vec<f64> = (0..3001).map(|i| value(root, i)).collect();
            assert_eq!(got, want, "world {world}, root {root}");
        }
    }
}

#[test]
fn reduce_scatter_leaves_each_rank_its_reduced_chunk() {
    for world in 2..=4 {
        for m in [0, 1, 333] {
            let run = run_op(world, WorkerOp::ReduceScatter, DType::F32, world * m);
            run.assert_ok();
            let full = expected_sum(world, world * m);
            for (r, bytes) in run.results.iter().enumerate() {
                let got = common::decode(DType::F32, bytes);
                assert_eq!(got, full[r * m..(r + 1) * m].to_vec(), "world {world}, m {m}, rank {r}");
            }
        }
    }
}

#[test]
fn all_gather_fills_every_chunk_from_its_owner() {
    for world in 2..=4 {
        for m in [0, 1, 333] {
            let run = run_op(world, WorkerOp::AllGather, DType::F32, world * m);
            run.assert_ok();
            let got = run.identical(DType::F32);
            let want: Vec<f64> = (0..world * m).map(|i| value(i / m.max(1), i)).collect();
            assert_eq!(got, want, "world {world}, m {m}");
        }
    }
}

#[test]
fn barrier_completes_repeatedly() {
    for world in 2..=4 {
        let run = run_world(world, |_, a| {
            a.op = WorkerOp::Barrier;
            a.iters = 20;
        });
        run.assert_ok();
    }
}

#[test]
fn bucketed_all_reduce_over_many_odd_slices() {
    let total: usize = DEFAULT_SLICES.iter().sum();
    for world in 2..=4 {
        // Small buckets (slices straddle them) and one bucket larger than everything.
        for bucket_bytes in [4096, 100 << 20] {
            let run = run_world(world, |_, a| {
                a.op = WorkerOp::Bucketed;
                a.bucket_bytes = bucket_bytes;
            });
            run.assert_ok();
            let got = run.identical(DType::F32);
            assert_eq!(got, expected_sum(world, total), "world {world}, bucket {bucket_bytes}");
        }
    }
}

/// ZeRO's collectives: a bucketed reduce-scatter leaves each rank's owned ranges
/// equal to an all-reduce of the same data (checked by the worker), and the
/// bucketed all-gather of those ranges alone rebuilds the all-reduce's whole
/// result, bit-identical on every rank: small buckets (ranges straddle them,
/// the last one padded), one bucket for everything, odd and tiny lengths.
#[test]
fn sharded_reduce_scatter_and_all_gather_equal_all_reduce_on_2_and_4_ranks() {
    for world in [2, 4] {
        for (len, bucket_bytes) in [(40_003, 4096), (40_003, 100 << 20), (7, 4), (1, 64), (12_288, 4096)] {
            for dtype in [DType::F32, DType::Bf16] {
                let run = run_world(world, |_, a| {
                    a.op = WorkerOp::Sharded;
                    a.dtype = dtype;
                    a.len = len;
                    a.bucket_bytes = bucket_bytes;
                });
                run.assert_ok();
                assert_eq!(run.identical(dtype), expected_sum(world, len), "world {world}, len {len}, bucket {bucket_bytes} B, {dtype:?}");
            }
        }
        // Rounding data: the owned ranges match the all-reduce within rounding (other
        // summation order), and every rank still ends bit-identical.
        let run = run_world(world, |_, a| {
            a.op = WorkerOp::Sharded;
            a.len = 20_011;
            a.bucket_bytes = 8192;
            a.random = true;
        });
        run.assert_ok();
        let got = run.identical(DType::F32);
        for (i, g) in got.iter().enumerate() {
            let w: f64 = (0..world).map(|r| rlmesh_comm::worker::random_value(r, i)).sum();
            assert!((g - w).abs() <= 1e-2, "world {world} element {i}: {g} vs {w}");
        }
    }
}

#[test]
fn world_of_one_process_needs_no_sockets() {
    let run = run_op(1, WorkerOp::AllReduce(ReduceOp::Mean), DType::F32, 99);
    run.assert_ok();
    assert_eq!(run.identical(DType::F32), (0..99).map(|i| value(0, i)).collect::<Vec<_>>());
}
