//! A full learner step on a tiny model against the same step in PyTorch
//! (transformers model, TRL's formulas, torch.optim.AdamW): loss, statistics,
//! every gradient and every updated parameter. The policy step starts from a
//! checkpoint written by the learner, so it also proves the checkpoint loads
//! in transformers and that its optimizer state means what torch means.
mod learner_common;

use learner_common::*;
use rlmesh_actors::learner::bench::{peer_config, run_peer};
use rlmesh_actors::learner::*;
use rlmesh_model::Transformer;
use serde_json::{json, Value};
use tch::{Device, Tensor};

fn compare(learner: &Learner, stats: &StepStats, peer: &Value, out: &std::path::Path) {
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-3);
    assert!(rel(stats.loss, peer["loss"].as_f64().unwrap()) < 1e-5, "loss {} vs {}", stats.loss, peer["loss"]);
    assert!(rel(stats.grad_norm, peer["grad_norm"].as_f64().unwrap()) < 1e-5, "grad norm {} vs {}", stats.grad_norm, peer["grad_norm"]);
    assert!(rel(stats.entropy, peer["entropy"].as_f64().unwrap()) < 1e-5, "entropy");
    let theirs: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(out).unwrap().into_iter().collect();
    let grads = learner.gradients();
    let params: std::collections::HashMap<String, Tensor> =
        learner.model().vs.variables().into_iter().collect();
    let (mut compared, mut total) = (0i64, 0i64);
    for (name, g) in &grads {
        let tg = &theirs[&format!("grad.{name}")];
        let scale = tg.abs().max().double_value(&[]).max(1e-4);
        assert!(max_diff(g, tg) / scale < 1e-4, "gradient of {name}: max diff {} at scale {scale}", max_diff(g, tg));
        if let Some(p) = params.get(name) {
            // AdamW's first update is lr·g/(|g| + ε) ≈ lr·sign(g): where |g| is inside the
            // gradient tolerance its sign is float noise (another summation order flips it,
            // and the parameter moves 2·lr the other way), so parameters are compared where
            // the gradient is clearly determined; the gradient check above covers the rest.
            let determined = tg.abs().gt(2e-4 * scale);
            let diff = (p - &theirs[&format!("param.{name}")]).abs().masked_select(&determined);
            let worst = if diff.numel() > 0 { diff.max().double_value(&[]) } else { 0.0 };
            assert!(worst < 2e-6, "parameter {name} after the step: max diff {worst} where its gradient is determined");
            compared += diff.numel() as i64;
            total += p.numel() as i64;
        }
    }
    assert!(compared * 2 > total, "only {compared} of {total} parameters compared: the check would be vacuous");
}

#[test]
fn policy_step_from_a_checkpoint_matches_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = tiny_model(dir.path(), "m", 3);
    let config = LearnerConfig {
        optim: AdamWConfig { lr: 1e-3, weight_decay: 0.1, ..Default::default() },
        max_grad_norm: Some(0.5),
        micro_batch_size: 2,
        clip: ClipParams { eps_low: 0.2, eps_high: 0.28, dual_clip: Some(3.0), tis_cap: Some(2.0) },
        aggregation: Aggregation::Grpo,
        entropy_coef: 0.01,
        kl: Some(KlConfig { estimator: KlEstimator::K3, coef: KlCoef::Fixed { beta: 0.04 }, placement: KlPlacement::Loss }),
        value: Some(ValueConfig::default()),
        ..Default::default()
    };
    let mut learner = Learner::new(Transformer::load(&model_dir, Device::Cpu, None).unwrap(), config.clone(), None).unwrap();
    learner.train_step(&policy_batch(5, 1)).unwrap();
    let ckpt = learner.save_checkpoint(&dir.path().join("ckpt"), &CheckpointMeta::default()).unwrap();
    let batch = policy_batch(5, 2);
    let stats = learner.train_step(&batch).unwrap();
    assert!(stats.clip_fraction.unwrap() > 0.0 && stats.ratio.unwrap().max > 1.28, "the batch exercises the clip: {stats:?}");
    let out = dir.path().join("torch.safetensors");
    let peer = run_peer(
        &python(),
        &oracle_script(),
        "step",
        &json!({"model": ckpt, "batch": batch, "objective": "policy", "config": peer_config(&config), "out": out}),
    )
    .unwrap();
    for (ours, key) in [(stats.kl.unwrap(), "kl"), (stats.clip_fraction.unwrap(), "clip_fraction"), (stats.ratio.unwrap().mean, "ratio_mean"), (stats.value_loss.unwrap(), "value_loss")] {
        let theirs = peer[key].as_f64().unwrap();
        assert!((ours - theirs).abs() <= 1e-5 * theirs.abs().max(1.0), "{key}: {ours} vs {theirs}");
    }
    compare(&learner, &stats, &peer, &out);
}

#[test]
fn sft_step_matches_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = tiny_model(dir.path(), "m", 4);
    let config = LearnerConfig { optim: AdamWConfig { lr: 1e-3, ..Default::default() }, micro_batch_size: 3, ..Default::default() };
    let mut learner = Learner::new(Transformer::load(&model_dir, Device::Cpu, None).unwrap(), config.clone(), None).unwrap();
    // Ragged rows: the learner sorts them by length into micro-batches of 3 and runs
    // right-padded rows without an attention mask; the peer pads all 7 to one length.
    let mut batch = sft_batch(7, 12);
    for (i, s) in batch.sequences.iter_mut().enumerate() {
        let len = 12 - (i * 5) % 9;
        s.token_ids.truncate(len);
        s.loss_mask.truncate(len);
    }
    let stats = learner.sft_step(&batch).unwrap();
    let out = dir.path().join("torch.safetensors");
    let peer = run_peer(
        &python(),
        &oracle_script(),
        "step",
        &json!({"model": model_dir, "batch": batch, "objective": "sft", "config": peer_config(&config), "out": out}),
    )
    .unwrap();
    compare(&learner, &stats, &peer, &out);
}
