//! Supervised fine-tuning through the learner drives the loss on a fixed dataset down.
mod learner_common;

use learner_common::*;
use rlmesh_actors::learner::*;
use rlmesh_model::Transformer;
use tch::Device;

#[test]
fn three_hundred_sft_steps_bring_the_loss_below_0_05() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let model = Transformer::load(&tiny_model(dir.path(), "m", 9), Device::Cpu, None).unwrap();
    let config = LearnerConfig {
        optim: AdamWConfig { lr: 3e-3, weight_decay: 0.01, ..Default::default() },
        warmup_steps: 20,
        schedule: LrSchedule::Cosine { total_steps: 300 },
        micro_batch_size: 4,
        ..Default::default()
    };
    let mut learner = Learner::new(model, config, None).unwrap();
    let data = sft_batch(8, 16);
    let first = learner.sft_step(&data).unwrap();
    // Uniform over 96 tokens would be ln 96 = 4.56; the random model starts near it.
    assert!(first.loss > 3.0, "initial loss {}", first.loss);
    let mut last = first.clone();
    for _ in 1..300 {
        last = learner.sft_step(&data).unwrap();
    }
    assert!(last.loss < 0.05, "loss after 300 steps: {} (from {})", last.loss, first.loss);
    assert_eq!(learner.optimizer_steps(), 300);
    assert!(last.tokens_per_s > 0.0 && last.grad_norm.is_finite());
}

#[test]
fn micro_batch_size_does_not_change_the_step() {
    // A step's sequences are sorted by length, packed into rows (or not) and cut
    // into micro-batches; the update is the whole batch's gradient whatever the cut.
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let model_dir = tiny_model(dir.path(), "m", 5);
    let mut batch = sft_batch(9, 14);
    for (i, s) in batch.sequences.iter_mut().enumerate() {
        let len = 14 - (i * 4) % 11;
        s.token_ids.truncate(len);
        s.loss_mask.truncate(len);
    }
    let step = |micro: usize, pack_sft: bool| {
        let config = LearnerConfig { optim: AdamWConfig { lr: 1e-3, ..Default::default() }, micro_batch_size: micro, pack_sft, ..Default::default() };
        let mut learner = Learner::new(Transformer::load(&model_dir, Device::Cpu, None).unwrap(), config, None).unwrap();
        let stats = learner.sft_step(&batch).unwrap();
        (stats, learner.gradients(), learner.model().vs.trainable_variables())
    };
    // One micro-batch of packed rows, packed rows two at a time, and one padded
    // sequence per row two at a time (no packing).
    let (whole, g_whole, p_whole) = step(16, true);
    for (micro, pack) in [(2, true), (2, false)] {
        let (cut, g_cut, p_cut) = step(micro, pack);
        assert!((whole.loss - cut.loss).abs() < 1e-6, "micro {micro}, packed {pack}: loss {} vs {}", whole.loss, cut.loss);
        assert_eq!(whole.tokens, cut.tokens);
        for ((name, a), (_, b)) in g_whole.iter().zip(&g_cut) {
            let scale = a.abs().max().double_value(&[]).max(1e-3);
            let d = max_diff(a, b);
            assert!(d < 1e-5 * scale, "micro {micro}, packed {pack}: {name}: gradients differ by {d} (largest {scale})");
        }
        // Adam's first step is lr·g/(|g| + eps): for a gradient near eps, float
        // noise in g (MKL's sums depend on buffer alignment, run to run) moves the
        // update by a share of lr. The gradients above are the equivalence check;
        // here 5% of the learning rate is the bound (a 1% bound failed once in CI, at 2.2%).
        let moved = p_whole.iter().zip(&p_cut).map(|(a, b)| max_diff(a, b)).fold(0.0, f64::max);
        assert!(moved < 5e-5, "micro {micro}, packed {pack}: parameters differ by {moved} after one step");
    }
}
