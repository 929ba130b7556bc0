//! The learner's packed layouts against its plain padded path (the oracle):
//! sequences packed end to end, and a group's shared prompt forwarded once,
//! give the same per-token log-probs and values, the same losses and the same
//! parameters after several optimizer steps, on a Qwen2-shaped and a
//! SmolLM2-shaped model, single- and multi-turn, with a reference model, with
//! StepTool's value head and GAE; and they compute fewer tokens.
mod learner_common;

use learner_common::*;
use rlmesh_actors::learner::*;
use std::path::Path;
use tch::{Device, Tensor};

/// (name, pack, shared_prefix): the oracle first.
const LAYOUTS: [(&str, bool, bool); 3] = [("padded", false, false), ("packed", true, false), ("shared", true, true)];

fn with_layout(mut c: LearnerConfig, pack: bool, shared: bool) -> LearnerConfig {
    c.pack = pack;
    c.shared_prefix = shared;
    c
}

// Adam turns float-level differences of tiny gradient components into steps of up to lr:
// a small lr keeps the comparison of parameters sharp (as in learner_parallel).
fn grpo_with_reference() -> LearnerConfig {
    LearnerConfig {
        optim: AdamWConfig { lr: 1e-4, ..Default::default() },
        micro_batch_size: 3,
        micro_batch_tokens: 96,
        entropy_coef: 0.01,
        kl: Some(KlConfig { estimator: KlEstimator::K3, coef: KlCoef::Fixed { beta: 0.04 }, placement: KlPlacement::Loss }),
        ..Default::default()
    }
}

fn steptool() -> LearnerConfig {
    LearnerConfig {
        optim: AdamWConfig { lr: 1e-4, ..Default::default() },
        micro_batch_size: 4,
        micro_batch_tokens: 128,
        kl: Some(KlConfig { estimator: KlEstimator::K1, coef: KlCoef::Adaptive { init: 0.3, target: 6.0, horizon: 10000.0 }, placement: KlPlacement::Reward }),
        value: Some(ValueConfig::default()),
        gae: Some(GaeConfig { gamma: 0.99, lam: 0.95 }),
        ..Default::default()
    }
}

fn learner(model: &Path, config: LearnerConfig) -> Learner {
    let m = Transformer::load(model, Device::Cpu, None).unwrap();
    let mut l = Learner::new(m, config.clone(), None).unwrap();
    // The reference is the policy as loaded (KL in the loss, or in StepTool's reward).
    l.reconfigure(config).unwrap();
    l
}

use rlmesh_model::Transformer;

fn params(l: &Learner) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = l.model().vs.variables().into_iter().map(|(n, t)| (n, t.copy())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The largest relative difference of a parameter tensor (max |a − b| / max |b|). The key
/// projections' biases are left out: attention's softmax ignores a constant added to all of a
/// query's logits, so their gradient is zero in exact arithmetic, and Adam turns the float noise
/// of any two summation orders into steps of up to lr on parameters that start at 0.
fn worst_relative(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    a.iter()
        .zip(b)
        .filter(|((n, _), _)| !n.ends_with("k_proj.bias"))
        .map(|((n, x), (m, y))| {
            assert_eq!(n, m);
            max_diff(x, y) / y.abs().max().double_value(&[]).max(1e-6)
        })
        .fold(0.0, f64::max)
}

fn worst_ragged(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).flat_map(|(x, y)| {
        assert_eq!(x.len(), y.len());
        x.iter().zip(y).map(|(p, q)| (p - q).abs() as f64)
    }).fold(0.0, f64::max)
}

/// What a layout gave: per-token log-probs, losses, parameters, computed tokens per step.
type Run = (Vec<Vec<f32>>, Vec<f64>, Vec<(String, Tensor)>, Vec<usize>);

/// Three steps of each layout from the same weights: log-probs (of the reference, which is
/// the policy as loaded) and, with a value head, values per token; losses; parameters.
fn compare(model: &Path, config: LearnerConfig, batches: &[TrainBatch]) {
    let mut oracle: Option<Run> = None;
    for (name, pack, shared) in LAYOUTS {
        let mut l = learner(model, with_layout(config.clone(), pack, shared));
        let logprobs = l.reference_logprobs(&batches[0]).unwrap();
        let (mut losses, mut computed) = (vec![], vec![]);
        for b in batches {
            let mut b = b.clone();
            if config.gae.is_some() {
                // Values from this layout, then GAE: every field the step reads comes through it.
                for s in &mut b.sequences {
                    (s.values, s.returns) = (None, None);
                }
                l.prepare(&mut b).unwrap();
            }
            let stats = l.train_step(&b).unwrap();
            assert!(stats.loss.is_finite() && stats.trained_tokens > 0);
            losses.push(stats.loss);
            computed.push(stats.computed_tokens);
        }
        let p = params(&l);
        match &oracle {
            None => oracle = Some((logprobs, losses, p, computed)),
            Some((lp, ls, op, oc)) => {
                let d = worst_ragged(&logprobs, lp);
                assert!(d < 1e-5, "{name}: per-token log-probs differ from the padded path by {d}");
                for (i, (a, b)) in losses.iter().zip(ls).enumerate() {
                    let rel = (a - b).abs() / b.abs().max(1e-12);
                    assert!(rel < 1e-5, "{name} step {i}: loss {a} vs padded {b} (relative {rel:e})");
                }
                let rel = worst_relative(&p, op);
                assert!(rel < 1e-4, "{name}: parameters after {} steps differ from the padded path's by {rel:e} (relative)", batches.len());
                for (c, o) in computed.iter().zip(oc) {
                    assert!(c < o, "{name} computes {c} tokens, padded {o}");
                }
                eprintln!("{name}: parameters within {rel:e}, log-probs within {d:e}; computed tokens {computed:?} vs padded {oc:?}");
            }
        }
    }
}

#[test]
fn packed_and_shared_prefix_steps_equal_the_padded_path() {
    let dir = tempfile::tempdir().unwrap();
    for (model, multi_turn) in [(tiny_model(dir.path(), "qwen2", 3), false), (smollm2_shaped_model(dir.path(), "llama", 4), true)] {
        let batches: Vec<TrainBatch> = (0..3).map(|i| grouped_batch(3, 4, 12, multi_turn, 40 + i)).collect();
        let without_ref: Vec<TrainBatch> = batches
            .iter()
            .map(|b| {
                let mut b = b.clone();
                b.sequences.iter_mut().for_each(|s| s.ref_logprobs = None);
                b
            })
            .collect();
        compare(&model, grpo_with_reference(), &without_ref);
    }
}

#[test]
fn steptool_values_and_gae_are_the_same_in_every_layout() {
    let dir = tempfile::tempdir().unwrap();
    let model = smollm2_shaped_model(dir.path(), "llama", 6);
    let batches: Vec<TrainBatch> = (0..3).map(|i| {
        let mut b = grouped_batch(2, 4, 10, true, 60 + i);
        b.sequences.iter_mut().for_each(|s| s.ref_logprobs = None);
        b
    }).collect();
    compare(&model, steptool(), &batches);
    // The values themselves, token by token.
    let mut values = vec![];
    for (_, pack, shared) in LAYOUTS {
        let l = learner(&model, with_layout(steptool(), pack, shared));
        values.push(l.values(&batches[0]).unwrap());
    }
    for v in &values[1..] {
        let d = worst_ragged(v, &values[0]);
        assert!(d < 1e-5, "values differ from the padded path's by {d}");
    }
}

/// Rollouts that differ from their first token, a group of one, a prompt longer than a
/// micro-batch's token budget, and a group whose first rollout trains from its second token:
/// each trains as on the padded path.
#[test]
fn groups_with_nothing_to_share_and_prompts_over_the_budget_train_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "qwen2", 8);
    let mut b = grouped_batch(4, 3, 40, true, 80);
    // Group 0: no common prefix (the first token differs).
    for (k, s) in b.sequences[0..3].iter_mut().enumerate() {
        s.token_ids[0] = 3 + k as u32;
    }
    // Group 1: trains from token 1 of its first rollout, so nothing is shared.
    b.sequences[3].loss_mask[1] = 1;
    // Group 3 becomes a group of one.
    b.group_sizes = vec![3, 3, 3, 1, 1, 1];
    for s in &mut b.sequences {
        s.ref_logprobs = None;
    }
    // Budgets of 32 tokens (under one 40-token prompt: every rollout its own micro-batch) and
    // 72 (a prompt and two continuations: a group split into pieces that each repeat the prompt).
    for budget in [32, 72] {
        let config = LearnerConfig { micro_batch_tokens: budget, ..grpo_with_reference() };
        compare(&model, config, &[b.clone(), b.clone(), b.clone()]);
    }
    let computed = |shared: bool| {
        let mut l = learner(&model, with_layout(LearnerConfig { micro_batch_tokens: 72, ..grpo_with_reference() }, true, shared));
        l.train_step(&b).unwrap().computed_tokens
    };
    assert!(computed(true) < computed(false), "pieces of a group still share their prompt");
}

/// The grouped benchmark's workload: the shared prompt costs once per group.
#[test]
fn a_shared_prompt_is_computed_once_per_group() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "qwen2", 9);
    let b = grouped_batch(2, 8, 50, false, 90);
    let sequences: usize = b.sequences.iter().map(|s| s.token_ids.len()).sum();
    let trained: usize = b.sequences.iter().map(|s| s.loss_mask.iter().map(|&m| m as usize).sum::<usize>()).sum();
    let mut l = learner(&model, with_layout(LearnerConfig { micro_batch_tokens: 4096, ..Default::default() }, true, true));
    let stats = l.train_step(&b).unwrap();
    assert_eq!(stats.trained_tokens, trained);
    assert_eq!(stats.computed_tokens, sequences - 2 * 7 * 50, "each group's 50-token prompt once instead of 8 times");
    let mut l = learner(&model, with_layout(LearnerConfig { micro_batch_tokens: 4096, ..Default::default() }, true, false));
    assert_eq!(l.train_step(&b).unwrap().computed_tokens, sequences, "packed: every token of every sequence, no padding");
}
