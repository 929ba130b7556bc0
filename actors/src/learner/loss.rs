//! The losses, per token, as plain functions on tch tensors (ALGORITHMS.md §4, §6).
//!
//! Every function takes tensors aligned token by token (float32: `[B, T]` rows,
//! or the learner's flat `[K]` targets) and returns per-token values;
//! [`token_weights`] and [`target_weights`] give the weights of one aggregation mode, so that a loss is `Σ w·l` — a sum that
//! splits over micro-batches and data-parallel ranks without changing its value.
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

/// How per-token losses are reduced to one number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    /// Mean over sequences of each sequence's token mean (TRL `grpo`).
    Grpo,
    /// Token mean over the whole batch (TRL `bnpo`, normalised over the batch rather than the micro-batch).
    Bnpo,
    /// Token mean over the whole batch (TRL `dapo`).
    Dapo,
    /// `Σ l·m / (B · max_completion_length)` (TRL `dr_grpo`).
    DrGrpo,
}

/// The KL estimator between the policy and the frozen reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `logp − ref`.
    K1,
    /// `½ (logp − ref)²`.
    K2,
    /// `exp(ref − logp) − (ref − logp) − 1` (TRL's GRPO estimator).
    K3,
}

/// PPO-clip parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClipParams {
    /// Lower clip: the ratio is clipped below at `1 − eps_low`.
    pub eps_low: f64,
    /// Upper clip: the ratio is clipped above at `1 + eps_high`.
    pub eps_high: f64,
    /// Dual clip `c` (> 1): for A < 0 the loss is at most `−c·A`.
    pub dual_clip: Option<f64>,
    /// Truncated importance sampling: the unclipped ratio is capped at this value (TRL's `delta`).
    pub tis_cap: Option<f64>,
}

impl Default for ClipParams {
    fn default() -> Self {
        ClipParams { eps_low: 0.2, eps_high: 0.2, dual_clip: None, tis_cap: None }
    }
}

/// Per-token outputs of [`ppo_clip`].
pub struct PolicyTerms {
    /// Per-token policy loss `[B, T]`.
    pub loss: Tensor,
    /// Importance ratio `exp(logp − behaviour)` `[B, T]` (differentiable).
    pub ratio: Tensor,
    /// Where the clip is active (the gradient of the token is cut), bool `[B, T]`.
    pub clipped: Tensor,
}

/// PPO-clip loss per token: `−min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A)`, with the
/// optional truncated-IS cap on the unclipped `ρ` and the optional dual clip.
pub fn ppo_clip(logp: &Tensor, behaviour: &Tensor, adv: &Tensor, p: &ClipParams) -> PolicyTerms {
    let ratio = (logp - behaviour).exp();
    let unclipped = match p.tis_cap {
        Some(cap) => ratio.clamp_max(cap),
        None => ratio.shallow_clone(),
    };
    let clipped_ratio = ratio.clamp(1.0 - p.eps_low, 1.0 + p.eps_high);
    let l1 = -(&unclipped * adv);
    let l2 = -(&clipped_ratio * adv);
    let mut loss = l1.maximum(&l2);
    if let Some(c) = p.dual_clip {
        let bound = adv * (-c);
        loss = loss.minimum(&bound).where_self(&adv.lt(0.0), &loss);
    }
    let low = ratio.lt(1.0 - p.eps_low).logical_and(&adv.lt(0.0));
    let high = ratio.gt(1.0 + p.eps_high).logical_and(&adv.gt(0.0));
    PolicyTerms { loss, clipped: low.logical_or(&high), ratio }
}

/// Per-token KL estimate between the policy (`logp`) and the reference (`ref_logp`).
pub fn kl_penalty(logp: &Tensor, ref_logp: &Tensor, estimator: KlEstimator) -> Tensor {
    match estimator {
        KlEstimator::K1 => logp - ref_logp,
        KlEstimator::K2 => (logp - ref_logp).square() * 0.5,
        KlEstimator::K3 => {
            let d = ref_logp - logp;
            d.exp() - &d - 1.0
        }
    }
}

/// Per-position entropy `−Σ_v p log p` of log-probabilities over the last dimension.
pub fn entropy(log_probs: &Tensor) -> Tensor {
    -(log_probs.exp() * log_probs).sum_dim_intlist(-1, false, Kind::Float)
}

/// Clipped value loss per token (TRL PPO / StepTool):
/// `½ max((v − R)², (old + clip(v − old, ±c) − R)²)`; also where the clipped branch is larger.
pub fn clipped_value_loss(values: &Tensor, old_values: &Tensor, returns: &Tensor, clip: f64) -> (Tensor, Tensor) {
    let clipped = old_values + (values - old_values).clamp(-clip, clip);
    let l1 = (values - returns).square();
    let l2 = (clipped - returns).square();
    let active = l2.gt_tensor(&l1);
    (l1.maximum(&l2) * 0.5, active)
}

/// Counts over the whole (global) batch that fix the aggregation weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchTotals {
    /// Sequences in the batch, over all ranks.
    pub sequences: f64,
    /// Tokens under the loss mask, over all ranks.
    pub tokens: f64,
    /// `max_completion_length` for `dr_grpo`.
    pub max_completion_length: f64,
}

/// Per-token weights `w` (zero off the mask) such that the aggregated loss is `Σ w·l`,
/// for `[B, T]` masks (one sequence per row).
pub fn token_weights(mask: &Tensor, mode: Aggregation, totals: &BatchTotals) -> Tensor {
    let m = mask.to_kind(Kind::Float);
    let per_seq = m.sum_dim_intlist(-1, true, Kind::Float).expand_as(&m);
    &m * target_weights(&per_seq, mode, totals)
}

/// The weight of each trained token, from the masked tokens of its sequence
/// (`counts`, any shape): [`token_weights`] for a learner's flat targets.
pub fn target_weights(counts: &Tensor, mode: Aggregation, totals: &BatchTotals) -> Tensor {
    match mode {
        Aggregation::Grpo => (counts.to_kind(Kind::Float).clamp_min(1.0) * totals.sequences.max(1.0)).reciprocal(),
        Aggregation::Bnpo | Aggregation::Dapo => counts.ones_like().to_kind(Kind::Float) / totals.tokens.max(1.0),
        Aggregation::DrGrpo => counts.ones_like().to_kind(Kind::Float) / (totals.sequences.max(1.0) * totals.max_completion_length.max(1.0)),
    }
}

/// TRL's `AdaptiveKLController`: `β ← β·(1 + clip(KL/target − 1, ±0.2)·n/horizon)`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveKl {
    /// The current coefficient β.
    pub value: f64,
    /// The target KL (per sequence, summed over tokens).
    pub target: f64,
    /// The horizon, in sequences.
    pub horizon: f64,
}

impl AdaptiveKl {
    /// Updates β from the measured KL over `n_steps` sequences.
    pub fn update(&mut self, current: f64, n_steps: f64) {
        let error = (current / self.target - 1.0).clamp(-0.2, 0.2);
        self.value *= 1.0 + error * n_steps / self.horizon;
    }
}
