//! Activation checkpointing (`checkpoint_activations = true`): each decoder layer
//! is recomputed in the backward from its saved input, and the gradients, losses
//! and statistics equal the plain step's within float tolerance — on a Qwen2- and
//! a SmolLM2-shaped model, in every layout (shared prompt, packed, padded), over
//! several micro-batches, with KL, entropy and a value head. (That it lowers a
//! step's peak memory is measured in `learner_memory.rs`.)
mod learner_common;

use learner_common::*;
use rlmesh_actors::learner::*;
use rlmesh_model::Transformer;
use tch::Device;

fn config(pack: bool, shared_prefix: bool, checkpoint: bool) -> LearnerConfig {
    LearnerConfig {
        optim: AdamWConfig { lr: 1e-3, ..Default::default() },
        pack,
        shared_prefix,
        // Several micro-batches a step.
        micro_batch_tokens: 64,
        micro_batch_size: 3,
        entropy_coef: 0.01,
        kl: Some(KlConfig { estimator: KlEstimator::K3, coef: KlCoef::Fixed { beta: 0.04 }, placement: KlPlacement::Loss }),
        value: Some(ValueConfig::default()),
        checkpoint_activations: checkpoint,
        ..Default::default()
    }
}

#[test]
fn checkpointed_steps_give_the_plain_steps_gradients() {
    let dir = tempfile::tempdir().unwrap();
    for (name, make) in TWO_SHAPES {
        let model = make(dir.path(), name, 5);
        for (pack, shared) in [(true, true), (true, false), (false, false)] {
            let tag = format!("{name} pack={pack} shared_prefix={shared}");
            let batch = grouped_batch(3, 4, 10, true, 17);
            let run = |checkpoint: bool| {
                let mut l = Learner::new(Transformer::load(&model, Device::Cpu, None).unwrap(), config(pack, shared, checkpoint), None).unwrap();
                let stats: Vec<StepStats> = (0..2).map(|_| l.train_step(&batch).unwrap()).collect();
                (stats, l.gradients())
            };
            let (plain, plain_grads) = run(false);
            let (kept, kept_grads) = run(true);
            for (a, b) in plain.iter().zip(&kept) {
                assert!((a.loss - b.loss).abs() <= 1e-6 * a.loss.abs().max(1.0), "{tag}: loss {} plain vs {} checkpointed", a.loss, b.loss);
                assert_eq!(a.computed_tokens, b.computed_tokens, "{tag}");
            }
            let mut worst = 0.0f64;
            for ((n, g), (m, h)) in plain_grads.iter().zip(&kept_grads) {
                assert_eq!(n, m);
                let scale = g.abs().max().double_value(&[]).max(1e-6);
                worst = worst.max(max_diff(g, h) / scale);
            }
            eprintln!("{tag}: largest gradient difference, relative to each parameter's largest gradient: {worst:e}");
            assert!(worst < 1e-5, "{tag}: checkpointed gradients differ from the plain ones by {worst} (relative)");
        }
    }
}
