//! What a learner step reports ([`StepStats`]) and the per-optimizer-step
//! sums behind it, reduced across the data-parallel ranks ([`Sums`]).
use serde::{Deserialize, Serialize};

/// Importance-ratio statistics over the masked tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RatioStats {
    /// Mean ratio.
    pub mean: f64,
    /// Smallest ratio.
    pub min: f64,
    /// Largest ratio.
    pub max: f64,
}

/// What one [`super::Learner::train_step`] or [`super::Learner::sft_step`] did, over all ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    /// The objective (all terms), averaged over the optimizer steps of the call.
    pub loss: f64,
    /// The policy-gradient (or SFT cross-entropy) term alone, averaged likewise.
    pub policy_loss: f64,
    /// The value loss (before its coefficient), when a value head is trained.
    pub value_loss: Option<f64>,
    /// Mean per-token KL to the reference, when configured.
    pub kl: Option<f64>,
    /// β used in this step (before the adaptive update), when KL is configured.
    pub kl_coef: Option<f64>,
    /// Mean per-token entropy of the policy on masked tokens.
    pub entropy: f64,
    /// Share of masked tokens where the PPO clip cut the gradient (policy steps only).
    pub clip_fraction: Option<f64>,
    /// Importance-ratio statistics (policy steps only).
    pub ratio: Option<RatioStats>,
    /// Gradient norm before clipping, averaged over the optimizer steps.
    pub grad_norm: f64,
    /// Learning rate of the last optimizer step.
    pub lr: f64,
    /// Optimizer steps taken by this call.
    pub optimizer_steps: u64,
    /// Sequences in the batch, over all ranks.
    pub sequences: usize,
    /// Tokens processed (forward and backward, all epochs, all ranks).
    pub tokens: usize,
    /// Tokens the loss reads (under the loss mask; all epochs, all ranks).
    #[serde(default)]
    pub trained_tokens: usize,
    /// Positions the forward passes computed (padding included, a shared prompt
    /// once; all epochs, all ranks): `computed_tokens / trained_tokens` is what
    /// each trained token cost.
    #[serde(default)]
    pub computed_tokens: usize,
    /// `tokens` per second of wall time.
    pub tokens_per_s: f64,
    /// Wall time of the call in seconds.
    pub seconds: f64,
    /// Of `seconds`, the time in collectives with the other data-parallel
    /// ranks (gradient all-reduce, counts, the parameter-digest check); 0 with one rank.
    #[serde(default)]
    pub allreduce_seconds: f64,
}

/// Per-optimizer-step sums, reduced across ranks (sums, then min, max).
#[derive(Clone, Copy, Default)]
pub(crate) struct Sums {
    pub(crate) loss: f64,
    pub(crate) policy: f64,
    pub(crate) value: f64,
    pub(crate) kl: f64,
    pub(crate) entropy: f64,
    pub(crate) clipped: f64,
    pub(crate) ratio: f64,
    pub(crate) masked: f64,
    pub(crate) tokens: f64,
    pub(crate) computed: f64,
    pub(crate) ratio_min: f64,
    pub(crate) ratio_max: f64,
}

impl Sums {
    pub(crate) const LEN: usize = 12;
    pub(crate) fn new() -> Sums {
        Sums { ratio_min: f64::INFINITY, ratio_max: f64::NEG_INFINITY, ..Default::default() }
    }
    pub(crate) fn to_vec(self) -> Vec<f64> {
        vec![self.loss, self.policy, self.value, self.kl, self.entropy, self.clipped, self.ratio, self.masked, self.tokens, self.computed, self.ratio_min, self.ratio_max]
    }
    pub(crate) fn from_slice(v: &[f64]) -> Sums {
        Sums {
            loss: v[0],
            policy: v[1],
            value: v[2],
            kl: v[3],
            entropy: v[4],
            clipped: v[5],
            ratio: v[6],
            masked: v[7],
            tokens: v[8],
            computed: v[9],
            ratio_min: v[10],
            ratio_max: v[11],
        }
    }
    pub(crate) fn merge(&mut self, o: &Sums) {
        self.loss += o.loss;
        self.policy += o.policy;
        self.value += o.value;
        self.kl += o.kl;
        self.entropy += o.entropy;
        self.clipped += o.clipped;
        self.ratio += o.ratio;
        self.masked += o.masked;
        self.tokens += o.tokens;
        self.computed += o.computed;
        self.ratio_min = self.ratio_min.min(o.ratio_min);
        self.ratio_max = self.ratio_max.max(o.ratio_max);
    }
}

