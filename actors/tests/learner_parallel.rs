//! Data-parallel learner ranks in separate processes (CPU ring over loopback):
//! 2 and 3 ranks on shares of each batch end with the same parameters as one
//! rank on the whole batch, their digests agree after every step, and ranks
//! whose parameters differ stop with a digest-mismatch error.
mod learner_common;

use learner_common::*;
use rlmesh_actors::learner::rank::{JobBatches, RankJob, RankStep};
use rlmesh_actors::learner::*;
use rlmesh_comm::testing::{run_ranks_on_free_port, RankOutput, WorkerCommand};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tch::Tensor;

fn job(model: &Path, out: Option<PathBuf>) -> RankJob {
    RankJob {
        model: model.to_path_buf(),
        config: LearnerConfig {
            // Adam turns float-level differences of tiny gradient components into
            // differences of up to lr per step: a small lr keeps the comparison sharp.
            optim: AdamWConfig { lr: 1e-4, ..Default::default() },
            micro_batch_size: 2,
            entropy_coef: 0.01,
            kl: Some(KlConfig { estimator: KlEstimator::K3, coef: KlCoef::Fixed { beta: 0.04 }, placement: KlPlacement::Loss }),
            ..Default::default()
        },
        batches: JobBatches::Train((0..3).map(|i| policy_batch(6, 10 + i)).collect()),
        steps: 3,
        checkpoint_dir: None,
        resume: false,
        out_dir: out,
        threads: 1,
    }
}

fn run(dir: &Path, world: usize, jobs: &[RankJob]) -> Vec<RankOutput> {
    let paths: Vec<PathBuf> = jobs
        .iter()
        .enumerate()
        .map(|(r, j)| {
            let p = dir.join(format!("job-w{world}-r{r}.json"));
            std::fs::write(&p, serde_json::to_vec(j).unwrap()).unwrap();
            p
        })
        .collect();
    let cmd = WorkerCommand::new(env!("CARGO_BIN_EXE_rlmesh-learner-rank"));
    run_ranks_on_free_port(&cmd, world, Duration::from_secs(90), |addr, r| {
        let args = vec![paths[r.min(paths.len() - 1)].display().to_string(), "--rank".into(), r.to_string(), "--world".into(), world.to_string(), "--addr".into(), addr.to_string()];
        (args, vec![])
    })
    .unwrap()
}

/// Named parameter tensors.
type Params = Vec<(String, Tensor)>;

fn steps(o: &RankOutput) -> Vec<RankStep> {
    assert!(o.success(), "rank {} failed: {}", o.rank, o.stderr);
    o.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn two_and_three_ranks_match_one_rank_on_the_combined_batch() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "m", 21);
    let mut reference: Option<(Vec<RankStep>, Params)> = None;
    for world in [1usize, 2, 3] {
        let out = dir.path().join(format!("out{world}"));
        let outputs = run(dir.path(), world, &[job(&model, Some(out.clone()))]);
        // Wall seconds differ between ranks; everything else a rank reports must not.
        let per_rank: Vec<Vec<RankStep>> = outputs.iter().map(steps).map(|v| v.into_iter().map(|s| RankStep { seconds: 0.0, ..s }).collect()).collect();
        for r in 1..world {
            assert_eq!(per_rank[r], per_rank[0], "world {world}: rank {r}'s steps (digests) differ from rank 0's");
        }
        let read = |r: usize| {
            let mut v = Tensor::read_safetensors(out.join(format!("rank{r}.safetensors"))).unwrap();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let params = read(0);
        for r in 1..world {
            let other = read(r);
            for ((n, a), (m, b)) in params.iter().zip(&other) {
                assert_eq!(n, m);
                assert!(a.equal(b), "world {world}: rank {r} parameter {n} is not bit-identical to rank 0's");
            }
        }
        match &reference {
            None => reference = Some((per_rank[0].clone(), params)),
            Some((ref_steps, ref_params)) => {
                for (a, b) in per_rank[0].iter().zip(ref_steps) {
                    assert!((a.loss - b.loss).abs() < 1e-5, "world {world} step {}: loss {} vs one rank {}", a.step, a.loss, b.loss);
                }
                let mut worst = 0.0f64;
                for (n, p) in &params {
                    let q = &ref_params.iter().find(|(m, _)| m == n).unwrap().1;
                    worst = worst.max(max_diff(p, q));
                }
                eprintln!("world {world}: max |Δ parameter| vs one rank = {worst:e}");
                assert!(worst < 5e-6, "world {world}: parameters differ from one rank's by {worst}");
            }
        }
    }
}

/// Grouped batches with shared prompts: each group stays whole on one rank (balanced by the
/// tokens it computes), and 2 ranks train like one within float tolerance.
#[test]
fn two_ranks_take_whole_groups_and_match_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "m", 23);
    let batches: Vec<TrainBatch> = (0..3).map(|i| grouped_batch(5, 4, 10, true, 30 + i)).collect();
    // The shards: whole groups, every sequence once, the larger share within one group's tokens of the smaller.
    let b = &batches[0];
    let (s0, s1) = (b.shard(0, 2), b.shard(1, 2));
    assert_eq!(s0.sequences.len() + s1.sequences.len(), b.sequences.len());
    assert_eq!(s0.group_sizes.len() + s1.group_sizes.len(), 5);
    for s in [&s0, &s1] {
        for g in s.groups() {
            let first = &s.sequences[g.start].token_ids[..10];
            assert!(s.sequences[g].iter().all(|q| &q.token_ids[..10] == first), "a group's rollouts stay together");
        }
    }
    let mut reference: Option<(Vec<RankStep>, Params)> = None;
    for world in [1usize, 2] {
        let out = dir.path().join(format!("grouped{world}"));
        let mut j = job(&model, Some(out.clone()));
        j.batches = JobBatches::Train(batches.clone());
        let outputs = run(dir.path(), world, &[j]);
        // Wall seconds differ between ranks; everything else a rank reports must not.
        let per_rank: Vec<Vec<RankStep>> = outputs.iter().map(steps).map(|v| v.into_iter().map(|s| RankStep { seconds: 0.0, ..s }).collect()).collect();
        let mut params = Tensor::read_safetensors(out.join("rank0.safetensors")).unwrap();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        match &reference {
            None => reference = Some((per_rank[0].clone(), params)),
            Some((ref_steps, ref_params)) => {
                for (a, b) in per_rank[0].iter().zip(ref_steps) {
                    assert!((a.loss - b.loss).abs() < 1e-5, "step {}: loss {} on 2 ranks vs {} on one", a.step, a.loss, b.loss);
                }
                let worst = params.iter().zip(ref_params).map(|((_, p), (_, q))| max_diff(p, q)).fold(0.0, f64::max);
                assert!(worst < 5e-6, "parameters differ from one rank's by {worst}");
            }
        }
    }
}

#[test]
fn ranks_with_different_parameters_stop_with_a_digest_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let a = tiny_model(dir.path(), "a", 1);
    let b = tiny_model(dir.path(), "b", 2);
    let outputs = run(dir.path(), 2, &[job(&a, None), job(&b, None)]);
    for o in &outputs {
        assert!(!o.success(), "rank {} should have failed", o.rank);
        assert!(o.stderr.contains("parameter digest mismatch") && o.stderr.contains("rank 0") && o.stderr.contains("rank 1"), "rank {}: {}", o.rank, o.stderr);
    }
}

/// GPU learner ranks form their NCCL group over the ring (`nccl_group`). Where
/// NCCL cannot run (no CUDA driver: every CI machine) both ranks must come back
/// with an error, promptly, and name why: rank 0 cannot make the unique id,
/// rank 1 loses the ring while waiting for it. Neither may hang or panic.
#[test]
fn an_nccl_group_that_cannot_form_fails_on_every_rank_with_the_reason() {
    if rlmesh_comm::nccl::nccl_available().is_ok() {
        eprintln!("SKIPPED: NCCL and a CUDA driver are present; scripts/gpu-check.sh's nccl-pair forms a real group");
        return;
    }
    let addr = rlmesh_comm::testing::free_loopback_addr();
    let t = std::time::Instant::now();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let addr = addr.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let cfg = rlmesh_comm::RingConfig::new(rank, 2, addr).cookie("nccl-group-test");
                let ring = rlmesh_comm::RingComm::connect(cfg).map_err(|e| format!("ring: {e}"))?;
                rlmesh_actors::learner::actor::nccl_group(ring, 0).map(|_| ())
            })
        })
        .collect();
    let errors: Vec<String> = ranks.into_iter().map(|h| h.join().expect("no panic").expect_err("no NCCL here")).collect();
    assert!(errors[0].contains("NCCL backend unavailable"), "rank 0: {}", errors[0]);
    assert!(errors[1].starts_with("sending the unique id over the ring: "), "rank 1: {}", errors[1]);
    assert!(t.elapsed() < Duration::from_secs(30), "both ranks returned in {:?}", t.elapsed());
}
