//! Checkpoints: a run killed between steps resumes with bit-identical losses;
//! a corrupt newest checkpoint falls back to the previous one with a warning;
//! only the newest k are kept and `latest` points at the newest.
mod learner_common;

use learner_common::*;
use rlmesh_actors::learner::rank::{JobBatches, RankJob, RankStep};
use rlmesh_actors::learner::*;
use rlmesh_model::Transformer;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use tch::Device;

fn config() -> LearnerConfig {
    LearnerConfig {
        optim: AdamWConfig { lr: 1e-3, weight_decay: 0.1, ..Default::default() },
        warmup_steps: 2,
        schedule: LrSchedule::Cosine { total_steps: 10 },
        micro_batch_size: 2,
        mini_batches: 2,
        ppo_epochs: 2,
        entropy_coef: 0.01,
        kl: Some(KlConfig { estimator: KlEstimator::K1, coef: KlCoef::Adaptive { init: 0.3, target: 6.0, horizon: 10000.0 }, placement: KlPlacement::Loss }),
        value: Some(ValueConfig::default()),
        keep_checkpoints: 2,
        ..Default::default()
    }
}

fn rank_job(model: &Path, ckpt: &Path, resume: bool) -> RankJob {
    RankJob {
        model: model.to_path_buf(),
        config: config(),
        batches: JobBatches::Train((0..3).map(|i| policy_batch(5, 30 + i)).collect()),
        steps: 5,
        checkpoint_dir: Some(ckpt.to_path_buf()),
        resume,
        out_dir: None,
        threads: 1,
    }
}

/// Runs a rank-0 process; with `kill_after`, SIGKILLs it as soon as it reports that step.
fn run_rank(dir: &Path, name: &str, job: &RankJob, kill_after: Option<u64>) -> Vec<RankStep> {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec(job).unwrap()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rlmesh-learner-rank"))
        .args([path.to_str().unwrap(), "--rank", "0", "--world", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut steps = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let s: RankStep = serde_json::from_str(&line.unwrap()).unwrap();
        let stop = Some(s.step) == kill_after;
        steps.push(s);
        if stop {
            child.kill().unwrap();
            break;
        }
    }
    let status = child.wait().unwrap();
    assert!(kill_after.is_some() || status.success(), "{name} failed: {status}");
    steps
}

#[test]
fn a_run_killed_between_steps_resumes_with_identical_losses() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "m", 7);
    let full = run_rank(dir.path(), "full", &rank_job(&model, &dir.path().join("a"), false), None);
    assert_eq!(full.len(), 5);
    let ckpt = dir.path().join("b");
    let before = run_rank(dir.path(), "killed", &rank_job(&model, &ckpt, false), Some(2));
    assert_eq!(before.len(), 2);
    let after = run_rank(dir.path(), "resumed", &rank_job(&model, &ckpt, true), None);
    // The kill lands after step 2's checkpoint, possibly during step 3: resume from whichever is newest.
    let first = after[0].step;
    assert!((3..=4).contains(&first), "resumed at step {first}");
    for s in &after {
        let u = &full[s.step as usize - 1];
        assert_eq!(s.loss.to_bits(), u.loss.to_bits(), "step {}: loss {} after resuming, {} uninterrupted", s.step, s.loss, u.loss);
        assert_eq!(s.digest, u.digest, "step {}: parameters differ from the uninterrupted run", s.step);
    }
    assert_eq!(after.last().unwrap().step, 5);
}

#[test]
fn a_corrupt_latest_checkpoint_falls_back_to_the_previous_one_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let model = Transformer::load(&tiny_model(dir.path(), "m", 8), Device::Cpu, None).unwrap();
    let root = dir.path().join("ckpt");
    let mut learner = Learner::new(model, config(), None).unwrap();
    let batches: Vec<TrainBatch> = (0..3).map(|i| policy_batch(5, 50 + i)).collect();
    let mut losses = Vec::new();
    for (k, b) in batches.iter().enumerate() {
        losses.push(learner.train_step(b).unwrap().loss);
        let meta = CheckpointMeta { policy_version: k as u64 + 1, data_cursor: serde_json::json!({"next": k + 1}) };
        learner.save_checkpoint(&root, &meta).unwrap();
    }
    // keep_checkpoints = 2: step 1 is gone, latest → step 3, no temporary directories left.
    let mut names: Vec<String> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["latest", "step-00000002", "step-00000003"]);
    assert_eq!(std::fs::read_link(root.join("latest")).unwrap(), Path::new("step-00000003"));
    // Flip one byte in the middle of the newest weights.
    let weights = root.join("step-00000003/model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&weights, bytes).unwrap();

    let r = Learner::resume(&root, config(), Device::Cpu, None, None).unwrap();
    assert_eq!(r.path, root.join("step-00000002"));
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(r.warnings[0].contains("step-00000003") && r.warnings[0].contains("model.safetensors"), "{}", r.warnings[0]);
    assert_eq!(r.meta.policy_version, 2);
    assert_eq!(r.meta.data_cursor["next"], 2);
    let mut resumed = r.learner;
    assert_eq!(resumed.train_steps(), 2);
    // Continuing from step 2 repeats step 3 exactly.
    assert_eq!(resumed.train_step(&batches[2]).unwrap().loss.to_bits(), losses[2].to_bits());
    assert_eq!(resumed.parameter_digest().unwrap(), learner.parameter_digest().unwrap());

    // With every checkpoint corrupt the error lists each one.
    std::fs::write(root.join("step-00000002/state.json"), b"{").unwrap();
    let err = Learner::resume(&root, config(), Device::Cpu, None, None).err().expect("no usable checkpoint");
    let msg = err.to_string();
    assert!(msg.contains("no usable checkpoint") && msg.contains("step-00000002") && msg.contains("step-00000003"), "{msg}");
}

/// StepTool's learner: GAE from per-token rewards over the value head, KL in the
/// reward against the reference taken at `reconfigure` (the policy after the warm-up).
fn steptool_config() -> LearnerConfig {
    LearnerConfig {
        optim: AdamWConfig { lr: 1e-2, ..Default::default() },
        micro_batch_size: 2,
        kl: Some(KlConfig { estimator: KlEstimator::K1, coef: KlCoef::Adaptive { init: 0.3, target: 6.0, horizon: 10000.0 }, placement: KlPlacement::Reward }),
        value: Some(ValueConfig::default()),
        gae: Some(GaeConfig { gamma: 0.99, lam: 0.95 }),
        keep_checkpoints: 5,
        ..Default::default()
    }
}

/// `policy_batch` with per-token rewards on the last token of each run of the mask and no advantages, values or reference log-probs.
fn reward_batch(n: usize, seed: u64) -> TrainBatch {
    let mut b = policy_batch(n, seed);
    for (i, s) in b.sequences.iter_mut().enumerate() {
        let mut r = vec![0.0f32; s.loss_mask.len()];
        for (t, rt) in r.iter_mut().enumerate() {
            if s.loss_mask[t] == 1 && s.loss_mask.get(t + 1).copied().unwrap_or(0) == 0 {
                *rt = 0.25 * (1 + (i + t) % 3) as f32;
            }
        }
        s.rewards = Some(r);
        s.advantages = vec![0.0; s.loss_mask.len()];
        (s.values, s.returns, s.ref_logprobs) = (None, None, None);
    }
    b
}

#[test]
fn the_value_head_reference_and_kl_controller_resume_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = Transformer::load(&tiny_model(dir.path(), "m", 9), Device::Cpu, None).unwrap();
    let root = dir.path().join("ckpt");
    let mut learner = Learner::new(model, steptool_config(), None).unwrap();
    // The RL settings take the reference: the policy as it is now.
    learner.reconfigure(steptool_config()).unwrap();
    let step = |l: &mut Learner, seed: u64| {
        let mut b = reward_batch(4, seed);
        l.prepare(&mut b).unwrap();
        // GAE filled what the batch lacked; advantages are whitened over the masked tokens.
        let masked: Vec<f32> = b.sequences.iter().flat_map(|s| s.advantages.iter().zip(&s.loss_mask).filter(|(_, m)| **m == 1).map(|(a, _)| *a)).collect();
        let mean = masked.iter().sum::<f32>() / masked.len() as f32;
        assert!(mean.abs() < 1e-4 && b.sequences.iter().all(|s| s.returns.is_some() && s.values.is_some()));
        l.train_step(&b).unwrap()
    };
    let mut seen = vec![];
    for k in 0..3u64 {
        seen.push(step(&mut learner, 70 + k));
        let meta = CheckpointMeta { policy_version: k + 1, data_cursor: serde_json::json!({"next": k + 1}) };
        learner.save_checkpoint(&root, &meta).unwrap();
    }
    let later = step(&mut learner, 73);
    // The policy moved away from the reference: KL is measured and β adapted.
    assert!(seen[2].kl.unwrap() != 0.0 && seen[2].kl_coef.unwrap() != 0.3, "{:?}", seen[2]);
    assert!(root.join("step-00000003/reference.safetensors").exists() && root.join("step-00000003/value_head.safetensors").exists());
    let mut resumed = Learner::resume(&root, steptool_config(), Device::Cpu, None, None).unwrap().learner;
    let again = step(&mut resumed, 73);
    for (what, a, b) in [("loss", again.loss, later.loss), ("value loss", again.value_loss.unwrap(), later.value_loss.unwrap()), ("kl", again.kl.unwrap(), later.kl.unwrap()), ("β", again.kl_coef.unwrap(), later.kl_coef.unwrap())] {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}: {a} after resuming, {b} uninterrupted");
    }
    assert_eq!(resumed.parameter_digest().unwrap(), learner.parameter_digest().unwrap());
    // Without rewards, a GAE learner refuses the batch, naming the field.
    let err = resumed.prepare(&mut policy_batch(2, 1)).unwrap_err().to_string();
    assert!(err.contains("rewards"), "{err}");
}
