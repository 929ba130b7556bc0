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
