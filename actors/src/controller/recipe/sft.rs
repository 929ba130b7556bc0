//! `[sft]`: the supervised warm-up on noisy expert trajectories.
use super::checks::{at_least, at_most, positive, unit};
use super::source::Invalid;
use super::bounds;
use serde::{Deserialize, Serialize};
pub use crate::warmup::SftMix;

/// Supervised warm-up on noisy expert trajectories.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sft {
    /// Optimizer steps (default 0: no warm-up).
    #[serde(default)]
    pub steps: u64,
    /// Conversations to imitate instead of the expert's (JSONL, OpenAI
    /// messages with `tool_calls` and tool messages, TRL's SFT format; relative
    /// to the recipe); trained on the assistant tokens only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Learning rate (default 1e-3).
    #[serde(default = "default_sft_lr")]
    pub lr: f64,
    /// AdamW's decoupled weight decay on the weight matrices and embeddings,
    /// not on norms (default 0, PyTorch's; nanoGPT-style training uses 0.1).
    #[serde(default)]
    pub weight_decay: f64,
    /// AdamW's β₂ (default 0.999, PyTorch's; 0.95 is the usual choice for transformers).
    #[serde(default = "default_sft_beta2")]
    pub beta2: f64,
    /// Steps of linear learning-rate warm-up before the cosine decay (default
    /// 10; more than `steps` leaves the rate rising to the end, as transformers' schedule does).
    #[serde(default = "default_sft_lr_warmup")]
    pub lr_warmup: u64,
    /// Trajectories per step (default 16).
    #[serde(default = "default_sft_batch")]
    pub batch_size: usize,
    /// Rows per forward pass (default 16). A step's conversations are packed
    /// end to end into rows as long as its longest one (first fit, longest
    /// first; each attends only to itself), and the rows are cut into
    /// micro-batches of this many: the gradient is the step's whole batch
    /// either way. Packing leaves 1.20 tokens per real token where sorting into
    /// padded micro-batches left 1.45 (the warm-up's own batches, measured).
    #[serde(default = "default_sft_micro")]
    pub micro_batch_size: usize,
    /// Size of the warm-up's own task pool (default 16384): drawn from the same
    /// mix with another seed, never holding a held-out task, so the warm-up
    /// teaches the skills (copying operands and results) rather than the
    /// answers of a few hundred tasks.
    #[serde(default = "default_sft_tasks")]
    pub tasks: usize,
    /// Half the words the pool's no-tool tasks copy come from a second list
    /// that no RL or held-out task uses (default false). With the seed's 30
    /// words, "Repeat this word back to me and nothing else: W" has 30
    /// prompts; the pool holds the 20 the held-out set lacks, and a policy
    /// learns their answers rather than copying.
    #[serde(default, skip_serializing_if = "is_false")]
    pub drill_words: bool,
    /// Shares of the expert strategies the trajectories are written with.
    #[serde(default)]
    pub mix: SftMix,
    /// Share the warm-up with other runs next to this one whose model, tools,
    /// tasks, `[sft]`, seed, learner threads and learner ranks are the same:
    /// the first stores its result in `<parent of the run directory>/.warmups/`,
    /// the others start from it (default false).
    #[serde(default)]
    pub share: bool,
}

fn default_sft_lr() -> f64 {
    1e-3
}
fn default_sft_beta2() -> f64 {
    0.999
}
fn default_sft_lr_warmup() -> u64 {
    10
}
fn is_false(b: &bool) -> bool {
    !b
}
fn default_sft_micro() -> usize {
    16
}
fn default_sft_batch() -> usize {
    16
}
fn default_sft_tasks() -> usize {
    16384
}

impl Default for Sft {
    fn default() -> Self {
        Sft {
            steps: 0,
            file: None,
            lr: default_sft_lr(),
            weight_decay: 0.0,
            beta2: default_sft_beta2(),
            lr_warmup: default_sft_lr_warmup(),
            batch_size: default_sft_batch(),
            micro_batch_size: default_sft_micro(),
            tasks: default_sft_tasks(),
            drill_words: false,
            mix: SftMix::default(),
            share: false,
        }
    }
}

impl Sft {
    /// Checks ranges and that the mix's shares sum to 1; the error names the offending field.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        let held = "tasks are generated and held in memory";
        let s = self;
        positive("sft.lr", s.lr)?;
        unit("sft.weight_decay", s.weight_decay)?;
        if !(s.beta2 > 0.0 && s.beta2 < 1.0) {
            return Err(Invalid::new("sft.beta2", format!("must lie in (0, 1), got {}", s.beta2)));
        }
        at_least("sft.batch_size", s.batch_size as f64, 1.0)?;
        at_least("sft.micro_batch_size", s.micro_batch_size as f64, 1.0)?;
        at_least("sft.tasks", s.tasks as f64, 1.0)?;
        at_most("sft.tasks", s.tasks as f64, bounds::TASKS as f64, held)?;
        let packed = "a step's conversations are packed in memory together";
        at_most("sft.batch_size", s.batch_size as f64, bounds::SFT_BATCH as f64, packed)?;
        at_most("sft.micro_batch_size", s.micro_batch_size as f64, bounds::SFT_BATCH as f64, packed)?;
        at_most("sft.steps", s.steps as f64, bounds::STEPS as f64, "past a year of steps")?;
        at_most("sft.lr_warmup", s.lr_warmup as f64, bounds::STEPS as f64, "past a year of steps")?;
        let m = s.mix;
        let shares = [
            ("correct", m.correct),
            ("no_tool", m.no_tool),
            ("wrong_arguments", m.wrong_arguments),
            ("repeated_call", m.repeated_call),
            ("unnecessary_tool", m.unnecessary_tool),
        ];
        for (k, v) in shares {
            unit(&format!("sft.mix.{k}"), v)?;
        }
        let sum: f64 = shares.iter().map(|(_, v)| v).sum();
        if (sum - 1.0).abs() > 1e-9 {
            return Err(Invalid::new("sft.mix", format!("shares must sum to 1, they sum to {}", (sum * 1e9).round() / 1e9)));
        }
        Ok(())
    }
}
