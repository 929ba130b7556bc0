//! ZeRO-1 and ZeRO-2 (`shard = "optimizer"`, `"gradients"`) across 2 and 4 learner
//! ranks in separate processes on the CPU ring: losses and parameters after every
//! step equal the unsharded run's within float tolerance, each rank holds about
//! 1/N of the optimizer state (the bytes of the tensors it holds, as it reports
//! them), and a sharded checkpoint — one transformers model plus one optimizer
//! file per rank — resumes on the same and on another number of ranks.
mod learner_common;

use learner_common::*;
use rlmesh_actors::learner::rank::{JobBatches, RankJob, RankStep};
use rlmesh_actors::learner::*;
use rlmesh_comm::testing::{run_ranks_on_free_port, RankOutput, WorkerCommand};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tch::Tensor;

/// Steps of every run; the checkpointed runs stop and resume halfway.
const STEPS: u64 = 4;

fn job(model: &Path, shard: Shard, out: &Path) -> RankJob {
    RankJob {
        model: model.to_path_buf(),
        config: LearnerConfig {
            optim: AdamWConfig { lr: 1e-4, weight_decay: 0.1, ..Default::default() },
            micro_batch_size: 2,
            entropy_coef: 0.01,
            kl: Some(KlConfig { estimator: KlEstimator::K3, coef: KlCoef::Fixed { beta: 0.04 }, placement: KlPlacement::Loss }),
            shard,
            // Small buckets: many of them, parameters straddling their chunks, a padded last one.
            bucket_bytes: 8 << 10,
            ..Default::default()
        },
        batches: JobBatches::Train((0..STEPS).map(|i| policy_batch(8, 40 + i)).collect()),
        steps: STEPS,
        checkpoint_dir: None,
        resume: false,
        out_dir: Some(out.to_path_buf()),
        threads: 1,
    }
}

fn run(dir: &Path, world: usize, job: &RankJob, tag: &str) -> Vec<Vec<RankStep>> {
    let path = dir.join(format!("job-{tag}.json"));
    std::fs::write(&path, serde_json::to_vec(job).unwrap()).unwrap();
    let cmd = WorkerCommand::new(env!("CARGO_BIN_EXE_rlmesh-learner-rank"));
    let outputs = run_ranks_on_free_port(&cmd, world, Duration::from_secs(120), |addr, r| {
        let args = vec![path.display().to_string(), "--rank".into(), r.to_string(), "--world".into(), world.to_string(), "--addr".into(), addr.to_string()];
        (args, vec![])
    })
    .unwrap();
    outputs.iter().map(|o| steps(o, tag)).collect()
}

fn steps(o: &RankOutput, tag: &str) -> Vec<RankStep> {
    assert!(o.success(), "{tag}: rank {} failed: {}", o.rank, o.stderr);
    o.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn params(out: &Path, rank: usize) -> Vec<(String, Tensor)> {
    let mut v = Tensor::read_safetensors(out.join(format!("rank{rank}.safetensors"))).unwrap();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn worst(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    a.iter().zip(b).map(|((n, p), (m, q))| {
        assert_eq!(n, m);
        max_diff(p, q)
    })
    .fold(0.0, f64::max)
}

/// Every rank's steps (digests) agree, and rank 0's losses match the reference's.
fn assert_matches(tag: &str, per_rank: &[Vec<RankStep>], reference: &[RankStep]) {
    for (r, s) in per_rank.iter().enumerate() {
        let digests = |v: &[RankStep]| v.iter().map(|x| x.digest.clone()).collect::<Vec<_>>();
        assert_eq!(digests(s), digests(&per_rank[0]), "{tag}: rank {r}'s parameter digests differ from rank 0's");
    }
    assert_eq!(per_rank[0].len(), reference.len(), "{tag}");
    for (a, b) in per_rank[0].iter().zip(reference) {
        assert_eq!(a.step, b.step);
        assert!((a.loss - b.loss).abs() < 1e-5, "{tag} step {}: loss {} vs unsharded {}", a.step, a.loss, b.loss);
    }
}

#[test]
fn sharded_ranks_train_like_unsharded_ones_with_a_share_of_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "m", 31);
    for world in [2usize, 4] {
        let base_out = dir.path().join(format!("none-{world}"));
        let base = run(dir.path(), world, &job(&model, Shard::None, &base_out), &format!("none-{world}"));
        let whole = base[0][0].optimizer_bytes;
        assert!(base.iter().all(|s| s[0].optimizer_bytes == whole), "unsharded ranks hold the whole state");
        for shard in [Shard::Optimizer, Shard::Gradients] {
            let tag = format!("{}-{world}", shard.name());
            let out = dir.path().join(&tag);
            let per_rank = run(dir.path(), world, &job(&model, shard, &out), &tag);
            assert_matches(&tag, &per_rank, &base[0]);
            let p0 = params(&out, 0);
            for r in 1..world {
                assert_eq!(worst(&params(&out, r), &p0), 0.0, "{tag}: rank {r}'s parameters are not rank 0's");
            }
            let diff = worst(&p0, &params(&base_out, 0));
            eprintln!("{tag}: max |Δ parameter| vs unsharded after {STEPS} steps = {diff:e}");
            assert!(diff < 5e-6, "{tag}: parameters differ from the unsharded run's by {diff}");
            // Measured: the bytes of the optimizer tensors each rank holds.
            let held: Vec<u64> = per_rank.iter().map(|s| s[0].optimizer_bytes).collect();
            eprintln!("{tag}: optimizer bytes per rank {held:?}, unsharded {whole}");
            assert_eq!(held.iter().sum::<u64>(), whole, "{tag}: the shards hold the state once");
            for (r, &h) in held.iter().enumerate() {
                let share = h as f64 / whole as f64;
                assert!((share - 1.0 / world as f64).abs() < 0.02, "{tag}: rank {r} holds {share:.4} of the state, not 1/{world}");
            }
        }
    }
}

/// A checkpoint written by 2 sharded ranks: one HF safetensors model that loads,
/// one optimizer file per rank; resumed on 2 ranks it continues exactly as the
/// run that never stopped, on 4 ranks (and on 1, unsharded) within float tolerance.
#[test]
fn a_sharded_checkpoint_resumes_on_the_same_and_on_another_number_of_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "m", 37);
    let full_out = dir.path().join("full");
    let full = run(dir.path(), 2, &job(&model, Shard::Gradients, &full_out), "full");

    let ckpt = dir.path().join("ckpt");
    let mut first = job(&model, Shard::Gradients, &dir.path().join("first"));
    first.steps = STEPS / 2;
    first.checkpoint_dir = Some(ckpt.clone());
    run(dir.path(), 2, &first, "first");
    let step = ckpt.join(format!("step-{:08}", STEPS / 2));
    let mut files: Vec<String> = std::fs::read_dir(&step).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert!(files.contains(&"model.safetensors".to_string()) && files.contains(&"config.json".to_string()), "{files:?}");
    assert!(files.contains(&"optimizer-rank00000.safetensors".to_string()) && files.contains(&"optimizer-rank00001.safetensors".to_string()), "{files:?}");
    assert!(!files.contains(&"optimizer.safetensors".to_string()), "{files:?}");
    assert!(!std::fs::read_dir(&ckpt).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().starts_with(".tmp")), "no temporary directory left");
    // The model is a plain transformers directory: it loads alone.
    rlmesh_model::Transformer::load(&step, tch::Device::Cpu, None).unwrap();

    for (world, shard, exact) in [(2usize, Shard::Gradients, true), (4, Shard::Optimizer, false), (1, Shard::None, false)] {
        let tag = format!("resume-{world}-{}", shard.name());
        let copy = dir.path().join(format!("ckpt-{tag}"));
        copy_dir(&ckpt, &copy);
        let out = dir.path().join(&tag);
        let mut again = job(&model, shard, &out);
        again.checkpoint_dir = Some(copy);
        again.resume = true;
        let per_rank = run(dir.path(), world, &again, &tag);
        assert_eq!(per_rank[0].first().map(|s| s.step), Some(STEPS / 2 + 1), "{tag}: continues after the checkpoint");
        assert_matches(&tag, &per_rank, &full[0][(STEPS / 2) as usize..]);
        let diff = worst(&params(&out, 0), &params(&full_out, 0));
        eprintln!("{tag}: max |Δ parameter| vs the uninterrupted run = {diff:e}");
        if exact {
            assert_eq!(diff, 0.0, "{tag}: the same ranks resume bit for bit");
        } else {
            assert!(diff < 5e-6, "{tag}: parameters differ from the uninterrupted run's by {diff}");
        }
    }
}

/// Sharding composes with bf16, activation checkpointing and the packed
/// shared-prompt layout: 2 ranks with `shard = "gradients"`, bf16 and
/// checkpointing train as 2 unsharded bf16 ranks without checkpointing do, up
/// to bf16 rounding (a tied weight's two gradient contributions are summed in
/// another order when the layers are recomputed).
#[test]
fn sharded_bf16_checkpointed_ranks_train_like_unsharded_bf16_ones() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "m", 41);
    let job = |shard: Shard, checkpoint: bool, tag: &str| {
        let mut j = job(&model, shard, &dir.path().join(tag));
        j.config.dtype = Some(Precision::Bf16);
        j.config.checkpoint_activations = checkpoint;
        (j.config.pack, j.config.shared_prefix, j.config.micro_batch_tokens) = (true, true, 64);
        j.batches = JobBatches::Train((0..STEPS).map(|i| grouped_batch(2, 4, 10, false, 80 + i)).collect());
        j
    };
    let base = run(dir.path(), 2, &job(Shard::None, false, "base"), "base");
    let sharded = run(dir.path(), 2, &job(Shard::Gradients, true, "sharded"), "sharded");
    for (r, s) in sharded.iter().enumerate() {
        assert_eq!(s.iter().map(|x| &x.digest).collect::<Vec<_>>(), sharded[0].iter().map(|x| &x.digest).collect::<Vec<_>>(), "rank {r}'s digests differ");
    }
    let scale = base[0].iter().fold(1.0f64, |m, s| m.max(s.loss.abs()));
    let loss_diff = base[0].iter().zip(&sharded[0]).map(|(a, b)| (a.loss - b.loss).abs()).fold(0.0, f64::max) / scale;
    let (p, q) = (params(&dir.path().join("sharded"), 0), params(&dir.path().join("base"), 0));
    let norm = q.iter().map(|(_, t)| t.abs().max().double_value(&[])).fold(0.0, f64::max);
    let param_diff = worst(&p, &q) / norm;
    eprintln!("bf16 + gradients + checkpointing vs bf16 unsharded, {STEPS} steps: loss {:.2e} of the largest loss, parameters {:.2e} of the largest", loss_diff, param_diff);
    assert!(loss_diff < 2e-3, "losses differ by {loss_diff} of the largest loss");
    assert!(param_diff < 1e-2, "parameters differ by {param_diff} of the largest");
    assert!(sharded[0][0].optimizer_bytes * 2 <= base[0][0].optimizer_bytes + 64, "each of 2 ranks holds half the float32 master weights and moments");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest: PathBuf = to.join(e.file_name());
        let ty = e.file_type().unwrap();
        if ty.is_dir() {
            copy_dir(&e.path(), &dest);
        } else if ty.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path()).unwrap(), &dest).unwrap();
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}
