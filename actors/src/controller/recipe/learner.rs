//! `[learner]`: how the learner lays out and computes its batches.
//!
//! ```toml
//! [learner]
//! pack = true                 # sequences end to end, no padding (default)
//! shared_prefix = true        # a group's prompt forwarded once for its G rollouts (default)
//! micro_batch_tokens = 4096   # computed tokens per packed micro-batch
//! shard = "none"              # "none" | "optimizer" | "gradients" | "full": state split across ranks
//! dtype = "bf16"              # "float32" | "bf16": parameters and compute (default: bf16 on a GPU, float32 on the CPU)
//! checkpoint_activations = false  # recompute each decoder layer in the backward
//! ```
//!
//! `launcher plan TOPOLOGY --recipe R` shows what these cost in device memory
//! per process ([`crate::controller::memory`]). Combinations this build does not
//! implement are refused, naming the field ([`check_implemented`]).
use super::checks::at_least;
use super::source::Invalid;
use crate::learner::config::{check_implemented, Precision, Shard};
use serde::{Deserialize, Serialize};

/// The learner's layout of its batches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LearnerSpec {
    /// RL sequences packed end to end under a block-diagonal mask, micro-batches sized by
    /// `micro_batch_tokens` (default true); false: one right-padded sequence per row, 16 rows
    /// a micro-batch (the plain path).
    #[serde(default = "yes")]
    pub pack: bool,
    /// With `pack`, each group's common prompt is forwarded once and its rollouts'
    /// continuations attend to it (default true); the gradient is the same.
    #[serde(default = "yes")]
    pub shared_prefix: bool,
    /// Computed tokens per packed micro-batch (default 4096): larger uses more
    /// activation memory, smaller more passes over the weights.
    #[serde(default = "default_micro_batch_tokens")]
    pub micro_batch_tokens: usize,
    /// What is split across the data-parallel ranks (default `"none"`): `"optimizer"`
    /// (ZeRO-1: AdamW's moments and master weights), `"gradients"` (ZeRO-2: also
    /// reduce-scatter), `"full"` (ZeRO-3: parameters too).
    #[serde(default)]
    pub shard: Shard,
    /// Parameter and compute dtype, `"float32"` or `"bf16"` (float32 master weights
    /// and moments); unset: bf16 on a GPU, float32 on the CPU.
    #[serde(default)]
    pub dtype: Option<Precision>,
    /// Recompute each decoder layer's activations in the backward (default false):
    /// less activation memory for about a third more compute.
    #[serde(default)]
    pub checkpoint_activations: bool,
}

fn yes() -> bool {
    true
}

fn default_micro_batch_tokens() -> usize {
    4096
}

impl Default for LearnerSpec {
    fn default() -> Self {
        LearnerSpec {
            pack: true,
            shared_prefix: true,
            micro_batch_tokens: default_micro_batch_tokens(),
            shard: Shard::None,
            dtype: None,
            checkpoint_activations: false,
        }
    }
}

impl LearnerSpec {
    /// Checks ranges and combinations; the error names the offending field.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        at_least("learner.micro_batch_tokens", self.micro_batch_tokens as f64, 2.0)?;
        if self.shared_prefix && !self.pack {
            return Err(Invalid::new("learner.shared_prefix", "a shared prompt is laid out in packed batches: set pack = true, or shared_prefix = false"));
        }
        if let Err((field, message)) = check_implemented(self.shard) {
            return Err(Invalid::new(format!("learner.{field}"), message));
        }
        Ok(())
    }
}
