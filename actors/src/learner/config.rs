//! The learner's hyper-parameters (serde: a recipe's `[learner]` table).
use super::error::{LearnerError, Result};
use super::loss::{Aggregation, ClipParams, KlEstimator};
use serde::{Deserialize, Serialize};

/// How the learning rate evolves after warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum LrSchedule {
    /// Constant after warm-up.
    Constant,
    /// Cosine decay to 0 at `total_steps` optimizer steps (transformers' `get_cosine_schedule_with_warmup`).
    Cosine {
        /// Total optimizer steps of the run.
        total_steps: u64,
    },
}

/// The KL coefficient β: fixed, or TRL's adaptive controller.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum KlCoef {
    /// A fixed β.
    Fixed {
        /// β.
        beta: f64,
    },
    /// β adapted after every train step toward a target KL (StepTool: init 0.3, target 6).
    Adaptive {
        /// Initial β.
        init: f64,
        /// Target KL per sequence.
        target: f64,
        /// Horizon in sequences (TRL default 10000).
        horizon: f64,
    },
}

/// Where the KL to the reference enters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlPlacement {
    /// `+ β·KL` per token in the loss (GRPO).
    Loss,
    /// In the reward, before GAE (StepTool): the learner only measures it and adapts β.
    Reward,
}

/// The KL-to-reference term.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KlConfig {
    /// Estimator of the per-token KL.
    pub estimator: KlEstimator,
    /// The coefficient β.
    pub coef: KlCoef,
    /// Loss or reward.
    pub placement: KlPlacement,
}

/// The value head and clipped value loss (StepTool).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValueConfig {
    /// Value clip range around the rollout-time values.
    pub clip: f64,
    /// Coefficient of the value loss.
    pub coef: f64,
}

impl Default for ValueConfig {
    fn default() -> Self {
        ValueConfig { clip: 0.2, coef: 0.1 }
    }
}

/// Advantages computed by the learner: GAE over the value head from per-token
/// rewards (StepTool). The batch then carries `rewards` instead of advantages.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GaeConfig {
    /// Discount γ.
    pub gamma: f64,
    /// GAE λ.
    pub lam: f64,
}

/// AdamW hyper-parameters (torch.optim.AdamW semantics; no decay on biases and norms).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// β₁.
    pub beta1: f64,
    /// β₂.
    pub beta2: f64,
    /// ε.
    pub eps: f64,
    /// Decoupled weight decay (matrices only).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { lr: 1e-6, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 }
    }
}

/// How the learner's state is split across its data-parallel ranks (ZeRO stages).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shard {
    /// Every rank holds everything: parameters, gradients, AdamW's moments.
    #[default]
    None,
    /// ZeRO-1: AdamW's moments and float32 master weights split across ranks.
    Optimizer,
    /// ZeRO-2: as `optimizer`, and gradients reduce-scattered instead of all-reduced.
    Gradients,
    /// ZeRO-3 / FSDP: parameters split too, each layer gathered for its use.
    Full,
}

impl Shard {
    /// The name a recipe spells.
    pub fn name(self) -> &'static str {
        match self {
            Shard::None => "none",
            Shard::Optimizer => "optimizer",
            Shard::Gradients => "gradients",
            Shard::Full => "full",
        }
    }

    /// Whether AdamW's state is split across ranks.
    pub fn splits_optimizer(self) -> bool {
        self != Shard::None
    }
}

/// The dtype the learner keeps its parameters and computes in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Precision {
    /// float32 everywhere.
    #[default]
    #[serde(rename = "float32")]
    Float32,
    /// bfloat16 parameters and compute; float32 gradients, master weights and moments.
    #[serde(rename = "bf16")]
    Bf16,
}

impl Precision {
    /// The name a recipe spells.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Float32 => "float32",
            Precision::Bf16 => "bf16",
        }
    }

    /// Bytes per parameter (and per activation element).
    pub fn bytes(self) -> u64 {
        match self {
            Precision::Float32 => 4,
            Precision::Bf16 => 2,
        }
    }

    /// What a learner computes in where `[learner] dtype` is not set: bf16 on a
    /// GPU, float32 on the CPU (where bf16 matmuls are slower than float32).
    pub fn default_on(cuda: bool) -> Precision {
        if cuda {
            Precision::Bf16
        } else {
            Precision::Float32
        }
    }

    /// The libtorch kind.
    pub fn kind(self) -> tch::Kind {
        match self {
            Precision::Float32 => tch::Kind::Float,
            Precision::Bf16 => tch::Kind::BFloat16,
        }
    }
}

/// Which values of `shard` this build implements (every `dtype` and
/// `checkpoint_activations` is): `Err((field, why))` names the first field asking for more.
/// A recipe and a learner both refuse the rest, so nothing is silently ignored.
pub fn check_implemented(shard: Shard) -> std::result::Result<(), (&'static str, String)> {
    if shard == Shard::Full {
        return Err(("shard", "\"full\" (ZeRO-3: parameters split too) is not implemented yet (implemented: \"none\", \"optimizer\", \"gradients\")".into()));
    }
    Ok(())
}

/// Everything the learner needs to know.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LearnerConfig {
    /// Optimiser.
    pub optim: AdamWConfig,
    /// Warm-up optimizer steps (linear from 0).
    pub warmup_steps: u64,
    /// Schedule after warm-up.
    pub schedule: LrSchedule,
    /// Gradient-norm clip (None: no clipping).
    pub max_grad_norm: Option<f64>,
    /// Rows per micro-batch (per rank) where rows are padded: gradients are accumulated
    /// over micro-batches. A padded policy row (`pack = false`) is one sequence; an SFT row
    /// packs sequences up to the longest one's length when `pack_sft` is on, else holds one.
    pub micro_batch_size: usize,
    /// Policy steps lay sequences end to end with no padding, in micro-batches of at most
    /// `micro_batch_tokens` computed tokens (default on); off: one right-padded sequence
    /// per row, `micro_batch_size` rows (the plain path, kept as the oracle).
    pub pack: bool,
    /// With `pack`, a group's common prompt (its token prefix before the first trained
    /// token) is forwarded once for all its rollouts (default on).
    pub shared_prefix: bool,
    /// Computed tokens per packed micro-batch (per rank); a sequence or a shared prompt
    /// with one continuation longer than this gets a micro-batch of its own.
    pub micro_batch_tokens: usize,
    /// Pack several SFT sequences into each row (a block-diagonal attention mask keeps
    /// them apart) instead of padding each to its micro-batch's longest (default on).
    pub pack_sft: bool,
    /// Optimizer steps per epoch over a batch (the batch is split into this many mini-batches).
    pub mini_batches: usize,
    /// Passes over each batch (PPO epochs).
    pub ppo_epochs: usize,
    /// PPO clip.
    pub clip: ClipParams,
    /// Loss aggregation mode.
    pub aggregation: Aggregation,
    /// `max_completion_length` for `dr_grpo`.
    pub max_completion_length: usize,
    /// Entropy bonus coefficient (the loss gets `− coef · H`).
    pub entropy_coef: f64,
    /// KL to the frozen reference (None: no KL).
    pub kl: Option<KlConfig>,
    /// Value head and clipped value loss (None: critic-free).
    pub value: Option<ValueConfig>,
    /// GAE advantages from per-token rewards, computed by the learner before each step (needs `value`).
    pub gae: Option<GaeConfig>,
    /// Seed of the learner's generator (mini-batch shuffling; the value head's initialisation).
    pub seed: u64,
    /// Gradient all-reduce bucket size in bytes.
    pub bucket_bytes: usize,
    /// Checkpoints kept on disk.
    pub keep_checkpoints: usize,
    /// How state is split across data-parallel ranks.
    pub shard: Shard,
    /// Parameter and compute dtype: the dtype the model is loaded in by the learner's
    /// actor and rank processes (a [`super::Learner`] trains in its model's dtype; with bf16,
    /// AdamW keeps float32 master weights and the gradients are reduced in float32).
    /// None: [`Precision::default_on`] the learner's device ([`LearnerConfig::precision_on`]).
    pub dtype: Option<Precision>,
    /// Recompute each decoder layer's activations in the backward instead of keeping them.
    pub checkpoint_activations: bool,
}

impl Default for LearnerConfig {
    fn default() -> Self {
        LearnerConfig {
            optim: AdamWConfig::default(),
            warmup_steps: 0,
            schedule: LrSchedule::Constant,
            max_grad_norm: Some(1.0),
            micro_batch_size: 4,
            pack: true,
            shared_prefix: true,
            micro_batch_tokens: 4096,
            pack_sft: true,
            mini_batches: 1,
            ppo_epochs: 1,
            clip: ClipParams::default(),
            aggregation: Aggregation::Grpo,
            max_completion_length: 0,
            entropy_coef: 0.0,
            kl: None,
            value: None,
            gae: None,
            seed: 0,
            bucket_bytes: rlmesh_comm::DEFAULT_BUCKET_BYTES,
            keep_checkpoints: 3,
            shard: Shard::None,
            dtype: None,
            checkpoint_activations: false,
        }
    }
}

impl LearnerConfig {
    /// The dtype a learner on `device` computes in: `dtype`, else bf16 on a GPU and float32 on the CPU.
    pub fn precision_on(&self, device: tch::Device) -> Precision {
        self.dtype.unwrap_or(Precision::default_on(device.is_cuda()))
    }

    /// How policy micro-batches are laid out.
    pub(crate) fn packing(&self) -> super::micro::Packing {
        use super::micro::Packing;
        match (self.pack, self.shared_prefix) {
            (false, _) => Packing::Padded,
            (true, false) => Packing::Packed,
            (true, true) => Packing::SharedPrefix,
        }
    }

    /// Checks the fields that can be wrong on their own.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, message: &str| Err(LearnerError::Config { field, message: message.to_string() });
        if self.micro_batch_size == 0 {
            return bad("micro_batch_size", "must be at least 1");
        }
        if self.micro_batch_tokens < 2 {
            return bad("micro_batch_tokens", "must be at least 2");
        }
        if self.mini_batches == 0 {
            return bad("mini_batches", "must be at least 1");
        }
        if self.ppo_epochs == 0 {
            return bad("ppo_epochs", "must be at least 1");
        }
        if self.aggregation == Aggregation::DrGrpo && self.max_completion_length == 0 {
            return bad("max_completion_length", "dr_grpo needs max_completion_length > 0");
        }
        if !(self.clip.eps_low >= 0.0 && self.clip.eps_low < 1.0 && self.clip.eps_high >= 0.0) {
            return bad("clip", "needs 0 ≤ eps_low < 1 and eps_high ≥ 0");
        }
        if self.clip.dual_clip.is_some_and(|c| c <= 1.0) {
            return bad("clip.dual_clip", "must be > 1");
        }
        if let Err((field, message)) = check_implemented(self.shard) {
            return Err(LearnerError::Config { field, message });
        }
        if self.bucket_bytes < 4 {
            return bad("bucket_bytes", "must hold at least one float");
        }
        if let Some(g) = self.gae {
            if self.value.is_none() {
                return bad("gae", "GAE needs a value head (value)");
            }
            if !((0.0..=1.0).contains(&g.gamma) && (0.0..=1.0).contains(&g.lam)) {
                return bad("gae", "gamma and lam must be in [0, 1]");
            }
        }
        if let Some(KlConfig { coef: KlCoef::Adaptive { target, horizon, .. }, .. }) = self.kl {
            if target <= 0.0 || horizon <= 0.0 {
                return bad("kl.coef", "adaptive target and horizon must be > 0");
            }
        }
        Ok(())
    }
}
