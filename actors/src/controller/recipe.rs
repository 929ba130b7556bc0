//! Recipes (`configs/*.toml`): *what* a run trains.
//!
//! A recipe names the model, the task mix and tools, the reward, the
//! advantage estimator, the SFT warm-up and the RL loop's hyper-parameters:
//!
//! ```toml
//! reward = "process"            # "process" | "final_only" | "hierr"
//! tools = ["calculator"]
//!
//! [model]
//! path = "tiny"                 # "tiny": create a tiny model and tokenizer; else an HF directory
//!
//! [tasks]
//! size = 1024                   # training tasks
//! held_out = 200                # held-out tasks (≥ 100), same mix, never trained on
//! tool_fraction = 0.5
//! multi_step_fraction = 0.0
//! seed = 0
//!
//! [estimator]
//! name = "grpo"                 # "grpo" | "dr_grpo" | "rloo" | "slca" | "steptool" | "steptool_critic_free"
//!
//! [sft]
//! steps = 60
//! lr = 1e-3
//!
//! [rl]
//! steps = 40
//! lr = 1e-4
//! group_size = 8
//! groups_per_step = 8
//! mode = "one_step_off"         # "sync" | "one_step_off" | "async" (+ max_staleness)
//! dynamic_sampling = false      # true: drop groups whose advantages are all zero, draw others (max_draws)
//! ```
//!
//! Sizes have upper bounds, each with its reason ([`bounds`]).
//! Every field but `reward` and `tasks.size` has a default (`name`: the file's stem) (see each
//! field). Unknown fields are errors; [`Recipe::load`] names the file, line
//! and field of any problem.
use super::source::{self, ConfigError, Invalid};
use super::staleness::Mode;
use rlmesh_core::advantage::grpo::ScaleRewards;
use rlmesh_core::dataset::{self, DatasetError, MixConfig};
use rlmesh_core::tools::{calculator, inventory, registry};
use rlmesh_core::Task;
pub use crate::warmup::SftMix;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Upper bounds of the recipe's sizes, each with the reason it holds; a
/// larger value is refused naming its field, the bound and the reason.
pub mod bounds {
    /// `model.vocab_size` ≤ 2^20: past the largest LLM vocabularies (256k); the task tokenizer learns every merge.
    pub const VOCAB_SIZE: usize = 1 << 20;
    /// `model.hidden` ≤ 16384: the width of the largest open models (Llama 3.1 405B); the tiny model is created in memory.
    pub const HIDDEN: i64 = 16384;
    /// `model.layers` ≤ 256: past the deepest open models (126 layers).
    pub const LAYERS: i64 = 256;
    /// `model.heads` (and `kv_heads`) ≤ 1024: past any published model (128).
    pub const HEADS: i64 = 1024;
    /// `tasks.size`, `tasks.held_out`, `sft.tasks` ≤ 10^7: tasks are generated and held in memory (about 1 KiB each).
    pub const TASKS: usize = 10_000_000;
    /// `rl.group_size` ≤ 1024: a group's rollouts are generated as one batch and scored together (papers use 4–64).
    pub const GROUP_SIZE: usize = 1024;
    /// `rl.groups_per_step` ≤ 4096: a step's groups are held in memory until the learner takes them.
    pub const GROUPS_PER_STEP: usize = 4096;
    /// `rl.max_draws` ≤ 64: past that, dynamic sampling generates 63 groups for nothing per group it trains.
    pub const MAX_DRAWS: usize = 64;
    /// `rl.max_turns` ≤ 1024: each turn is a generation call and a tool call; tool-use benchmarks need under 50.
    pub const MAX_TURNS: usize = 1024;
    /// `rl.max_new_tokens` ≤ 131072: a turn cannot outgrow the longest context of the models rlmesh loads (128k).
    pub const MAX_NEW_TOKENS: usize = 131_072;
    /// `sft.batch_size` and `sft.micro_batch_size` ≤ 65536: a step's conversations are packed in memory together.
    pub const SFT_BATCH: usize = 65_536;
    /// `rl.max_staleness` ≤ 1024: the controller keeps every policy version a buffered group may come from.
    pub const MAX_STALENESS: u64 = 1024;
    /// `rl.steps` and `sft.steps` ≤ 10^9: past a year of 30 ms steps; step counters and ETAs stay exact.
    pub const STEPS: u64 = 1_000_000_000;
    /// The tiny model's parameters ≤ 2^30: it is created and trained in f32 on
    /// the CPU, so 4 GiB of weights and 16 GiB with gradients and Adam's state.
    pub const TINY_PARAMETERS: f64 = (1u64 << 30) as f64;
}

/// What a run trains.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// The recipe's name, recorded in `summary.json` (default: the file's stem).
    #[serde(default)]
    pub name: String,
    /// Seed of model creation, SFT data and sampling (the task mix has its own).
    #[serde(default)]
    pub seed: u64,
    /// The reward that scores rollouts.
    pub reward: RewardKind,
    /// The judge of the final replies (SLCA's summary reward, HierR's total): `"rule"`
    /// (default: states the result, concise, grounded) or `"model"` (a frozen model).
    #[serde(default)]
    pub judge: JudgeName,
    /// The model judge's HF directory (default: SmolLM2-135M from the set-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_model: Option<String>,
    /// Tools and environments the agent may call (default `["calculator"]`).
    #[serde(default = "default_tools")]
    pub tools: Vec<String>,
    /// The policy model.
    #[serde(default)]
    pub model: ModelSpec,
    /// The training and held-out tasks.
    pub tasks: TaskMix,
    /// The advantage estimator and its loss parameters.
    #[serde(default)]
    pub estimator: Estimator,
    /// Supervised warm-up on noisy expert trajectories.
    #[serde(default)]
    pub sft: Sft,
    /// The RL loop.
    #[serde(default)]
    pub rl: Rl,
}

/// The reward that scores rollouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardKind {
    /// The seed's process-aware reward (tool choice, arguments, execution, answer, repeats).
    Process,
    /// Only format and final answer: the reward-hacking baseline.
    FinalOnly,
    /// SLCA-GRPO's HierR total: process reward of the calls plus the judged
    /// summary, −0.5 for a tool task answered without a call.
    Hierr,
}

/// The judge of the final replies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JudgeName {
    /// The rule rubric.
    #[default]
    Rule,
    /// A frozen model on the reward actor's own thread.
    Model,
}

/// The policy model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// An HF model directory, or `"tiny"` to create a tiny model and tokenizer (default).
    #[serde(default = "default_model_path")]
    pub path: String,
    /// The tiny model's tokenizer: `"task"` (default) learns a byte-level BPE
    /// from the task mix's expert conversations (numbers as chunks of up to three digits);
    /// `"smollm2"` uses SmolLM2's 49k-token tokenizer from the set-up.
    #[serde(default = "default_tokenizer")]
    pub tokenizer: String,
    /// Vocabulary size of the `"task"` tokenizer (default 1024).
    #[serde(default = "default_vocab")]
    pub vocab_size: usize,
    /// Digits per number token of the `"task"` tokenizer, 1–3 (default 3):
    /// numbers split into chunks of this many digits from the left, and every
    /// string of 1 to this many digits is a token.
    #[serde(default = "default_number_chunk")]
    pub number_chunk: u32,
    /// The tiny model's residual width (default 128).
    #[serde(default = "default_hidden")]
    pub hidden: i64,
    /// The tiny model's decoder layers (default 4).
    #[serde(default = "default_layers")]
    pub layers: i64,
    /// The tiny model's query heads (default 4).
    #[serde(default = "default_heads")]
    pub heads: i64,
    /// The tiny model's key/value heads (default 2; `heads` must be a multiple).
    #[serde(default = "default_kv_heads")]
    pub kv_heads: i64,
}

fn default_tokenizer() -> String {
    "task".to_string()
}
fn default_vocab() -> usize {
    1024
}
fn default_number_chunk() -> u32 {
    3
}
fn default_hidden() -> i64 {
    128
}
fn default_layers() -> i64 {
    4
}
fn default_heads() -> i64 {
    4
}
fn default_kv_heads() -> i64 {
    2
}

/// The task mix: the seed's generator, split into training and held-out tasks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskMix {
    /// Number of training tasks.
    pub size: usize,
    /// Number of held-out evaluation tasks (at least 100; default 200).
    #[serde(default = "default_held_out")]
    pub held_out: usize,
    /// Share of tasks that need a tool, in `[0, 1]` (default 0.5).
    #[serde(default = "half")]
    pub tool_fraction: f64,
    /// Share of tool tasks needing two or more steps, in `[0, 1]` (default 0).
    #[serde(default)]
    pub multi_step_fraction: f64,
    /// Whether multi-step tasks include inventory tasks (needs the `inventory` tool; default false).
    #[serde(default)]
    pub inventory: bool,
    /// Share of the multi-step calculator tasks that need three dependent calls
    /// (`((a + b) * c) - d`) rather than two, in `[0, 1]` (default 0).
    #[serde(default)]
    pub three_step_fraction: f64,
    /// Seed of the generator (default 0).
    #[serde(default)]
    pub seed: u64,
}

/// Advantage estimators of the RL loop: scalar (GRPO family), per segment (SLCA), per step (StepTool).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EstimatorKind {
    /// GRPO (TRL semantics).
    Grpo,
    /// Dr.GRPO: GRPO without the σ division.
    DrGrpo,
    /// REINFORCE leave-one-out.
    Rloo,
    /// SLCA-GRPO: the process advantage on tool-call turns, the summary advantage on the final reply.
    Slca,
    /// StepTool: step rewards on each turn's last token, KL in the reward, GAE over a value head.
    Steptool,
    /// StepTool without a critic: step returns normalised within the group.
    SteptoolCriticFree,
}

impl EstimatorKind {
    /// The name a recipe spells.
    pub fn as_str(self) -> &'static str {
        match self {
            EstimatorKind::Grpo => "grpo",
            EstimatorKind::DrGrpo => "dr_grpo",
            EstimatorKind::Rloo => "rloo",
            EstimatorKind::Slca => "slca",
            EstimatorKind::Steptool => "steptool",
            EstimatorKind::SteptoolCriticFree => "steptool_critic_free",
        }
    }
}

/// Which σ divides GRPO's centred rewards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleRewardsName {
    /// σ of the group.
    Group,
    /// σ of the batch.
    Batch,
    /// No division.
    None,
}

/// The advantage estimator and the policy-loss parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Estimator {
    /// The estimator (default `grpo`).
    #[serde(default = "default_estimator")]
    pub name: EstimatorKind,
    /// GRPO's σ (default `group`; Dr.GRPO: `none`, the only value it takes; RLOO: not used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_rewards: Option<ScaleRewardsName>,
    /// PPO clip ε of the importance ratio (default 0.2).
    #[serde(default = "default_clip_eps")]
    pub clip_eps: f64,
    /// β of the KL penalty to the reference policy, the policy after the warm-up
    /// (default 0: no reference). GRPO family and SLCA: `+ β·KL` (k3) in the loss;
    /// `steptool`: `−β·(logp − ref)` in each token's reward, β the initial value of
    /// the adaptive controller.
    #[serde(default)]
    pub kl_coef: f64,
    /// `slca`: weight of the normalised process advantage (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_process: Option<f64>,
    /// `slca`: weight of the normalised summary advantage (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_summary: Option<f64>,
    /// `slca`: divide by the standard deviation after centring (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_by_std: Option<bool>,
    /// `steptool`, `steptool_critic_free`: discount γ (default 0.99).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gamma: Option<f64>,
    /// `steptool`: GAE λ (default 0.95).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lam: Option<f64>,
    /// `steptool`, `steptool_critic_free`: multiply step i's reward by `K − 1 − i` as
    /// the upstream code does (zeroes the final IsSolved reward; default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_weighting: Option<bool>,
    /// `steptool`: the adaptive KL controller's target KL per sequence (default 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_target: Option<f64>,
}

/// The estimators that use each optional `[estimator]` field.
const ESTIMATOR_FIELDS: &[(&str, &[EstimatorKind])] = &[
    ("w_process", &[EstimatorKind::Slca]),
    ("w_summary", &[EstimatorKind::Slca]),
    ("norm_by_std", &[EstimatorKind::Slca]),
    ("gamma", &[EstimatorKind::Steptool, EstimatorKind::SteptoolCriticFree]),
    ("lam", &[EstimatorKind::Steptool]),
    ("upstream_weighting", &[EstimatorKind::Steptool, EstimatorKind::SteptoolCriticFree]),
    ("kl_target", &[EstimatorKind::Steptool]),
    ("scale_rewards", &[EstimatorKind::Grpo, EstimatorKind::DrGrpo]),
];

/// Supervised warm-up on noisy expert trajectories.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sft {
    /// Optimizer steps (default 0: no warm-up).
    #[serde(default)]
    pub steps: u64,
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

/// The RL loop.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rl {
    /// Optimizer steps (default 40).
    #[serde(default = "default_rl_steps")]
    pub steps: u64,
    /// Learning rate (default 1e-4).
    #[serde(default = "default_rl_lr")]
    pub lr: f64,
    /// Rollouts per prompt, G (at least 2; default 8).
    #[serde(default = "default_group_size")]
    pub group_size: usize,
    /// Prompt groups per optimizer step (default 8).
    #[serde(default = "default_groups_per_step")]
    pub groups_per_step: usize,
    /// Sampling temperature (> 0; default 1).
    #[serde(default = "one")]
    pub temperature: f64,
    /// Assistant turns per rollout, tool turns included (default 4).
    #[serde(default = "default_max_turns")]
    pub max_turns: usize,
    /// Generated tokens per turn (default 64).
    #[serde(default = "default_max_new_tokens")]
    pub max_new_tokens: usize,
    /// Overlap of generation and training (default `one_step_off`).
    #[serde(default = "default_mode")]
    pub mode: ModeName,
    /// Staleness bound k for `async` (default 2); `sync` implies 0, `one_step_off` 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_staleness: Option<u64>,
    /// Write a checkpoint every this many RL steps (default 25; one is also
    /// written after the warm-up and at the end). `launcher up --resume`
    /// restarts from the newest.
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: u64,
    /// DAPO's dynamic sampling (default off): a scored group whose advantages
    /// are all zero (every rollout scored alike) teaches nothing, so it is
    /// dropped (ledger and `rlmesh_groups_dropped_total{reason="uniform"}`)
    /// and another group is drawn in its place.
    #[serde(default)]
    pub dynamic_sampling: bool,
    /// With `dynamic_sampling`, at most this many groups are drawn per group a
    /// step trains (default 4, [`Rl::max_draws`]); past that budget, uniform
    /// groups are trained as they come, so a solved task mix cannot stall the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_draws: Option<usize>,
}

/// The mode as a recipe spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeName {
    /// On-policy.
    Sync,
    /// One step of overlap.
    OneStepOff,
    /// Bounded by `max_staleness`.
    Async,
}

/// The `async` bound when the recipe gives none.
pub const DEFAULT_ASYNC_STALENESS: u64 = 2;

fn default_tools() -> Vec<String> {
    vec![calculator::NAME.to_string()]
}
fn default_model_path() -> String {
    "tiny".to_string()
}
fn default_held_out() -> usize {
    200
}
fn half() -> f64 {
    0.5
}
fn one() -> f64 {
    1.0
}
fn default_estimator() -> EstimatorKind {
    EstimatorKind::Grpo
}
fn default_clip_eps() -> f64 {
    0.2
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
fn default_checkpoint_every() -> u64 {
    25
}
/// `rl.max_draws` when the recipe gives none.
pub const DEFAULT_MAX_DRAWS: usize = 4;

impl Rl {
    /// Groups drawn at most per group a step trains, with dynamic sampling.
    pub fn max_draws(&self) -> usize {
        self.max_draws.unwrap_or(DEFAULT_MAX_DRAWS)
    }
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
fn default_rl_steps() -> u64 {
    40
}
fn default_rl_lr() -> f64 {
    1e-4
}
fn default_group_size() -> usize {
    8
}
fn default_groups_per_step() -> usize {
    8
}
fn default_max_turns() -> usize {
    4
}
fn default_max_new_tokens() -> usize {
    64
}
fn default_mode() -> ModeName {
    ModeName::OneStepOff
}

impl Default for ModelSpec {
    fn default() -> Self {
        ModelSpec {
            path: default_model_path(),
            tokenizer: default_tokenizer(),
            vocab_size: default_vocab(),
            number_chunk: default_number_chunk(),
            hidden: default_hidden(),
            layers: default_layers(),
            heads: default_heads(),
            kv_heads: default_kv_heads(),
        }
    }
}

impl Default for Estimator {
    fn default() -> Self {
        Estimator {
            name: default_estimator(),
            scale_rewards: None,
            clip_eps: default_clip_eps(),
            kl_coef: 0.0,
            w_process: None,
            w_summary: None,
            norm_by_std: None,
            gamma: None,
            lam: None,
            upstream_weighting: None,
            kl_target: None,
        }
    }
}

impl Default for Sft {
    fn default() -> Self {
        Sft {
            steps: 0,
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

impl Default for Rl {
    fn default() -> Self {
        Rl {
            steps: default_rl_steps(),
            lr: default_rl_lr(),
            group_size: default_group_size(),
            groups_per_step: default_groups_per_step(),
            temperature: 1.0,
            max_turns: default_max_turns(),
            max_new_tokens: default_max_new_tokens(),
            mode: default_mode(),
            max_staleness: None,
            checkpoint_every: default_checkpoint_every(),
            dynamic_sampling: false,
            max_draws: None,
        }
    }
}

impl Recipe {
    /// Reads, parses and validates a recipe file; errors name the file, line and field.
    pub fn load(path: &Path) -> Result<Recipe, ConfigError> {
        source::load(path, Recipe::validate).map(|r| r.named_after(path))
    }

    /// Parses and validates recipe text (named `file` in errors; an unnamed recipe takes its stem).
    pub fn parse(file: &str, text: &str) -> Result<Recipe, ConfigError> {
        source::parse(file, text, Recipe::validate).map(|r| r.named_after(Path::new(file)))
    }

    fn named_after(mut self, file: &Path) -> Recipe {
        if self.name.is_empty() {
            self.name = file.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        }
        self
    }

    /// Whether the model is created (`model.path = "tiny"`) rather than loaded.
    pub fn tiny_model(&self) -> bool {
        self.model.path == "tiny"
    }

    /// The tiny model's shape (width, layers and heads from the recipe; MLP 3× wide).
    pub fn tiny_spec(&self) -> super::init::TinySpec {
        let h = self.model.hidden;
        super::init::TinySpec { hidden: h, layers: self.model.layers, heads: self.model.heads, kv_heads: self.model.kv_heads, intermediate: 3 * h }
    }

    /// The staleness mode of the RL loop.
    pub fn mode(&self) -> Mode {
        match self.rl.mode {
            ModeName::Sync => Mode::Sync,
            ModeName::OneStepOff => Mode::OneStepOff,
            ModeName::Async => Mode::Async { max_staleness: self.rl.max_staleness.unwrap_or(DEFAULT_ASYNC_STALENESS) },
        }
    }

    /// GRPO's σ choice for this estimator (`None` for those that do not scale a scalar reward).
    pub fn scale_rewards(&self) -> Option<ScaleRewards> {
        let name = match self.estimator.name {
            EstimatorKind::Grpo => self.estimator.scale_rewards.unwrap_or(ScaleRewardsName::Group),
            EstimatorKind::DrGrpo => ScaleRewardsName::None,
            _ => return None,
        };
        Some(match name {
            ScaleRewardsName::Group => ScaleRewards::Group,
            ScaleRewardsName::Batch => ScaleRewards::Batch,
            ScaleRewardsName::None => ScaleRewards::None,
        })
    }

    /// Generates the task mix: `(training tasks, held-out tasks)`, disjoint.
    pub fn tasks(&self) -> Result<(Vec<Task>, Vec<Task>), DatasetError> {
        let t = &self.tasks;
        let cfg = MixConfig {
            size: t.size + t.held_out,
            tool_fraction: t.tool_fraction,
            multi_step_fraction: t.multi_step_fraction,
            inventory: t.inventory,
            three_step_fraction: t.three_step_fraction,
            seed: t.seed,
            drill_words: false,
        };
        let mut train = dataset::generate(&cfg)?;
        let held_out = train.split_off(t.size);
        Ok((train, held_out))
    }

    /// The warm-up's task pool (`sft.tasks` of the same mix, another seed),
    /// without any task of `held_out`.
    pub fn sft_tasks(&self, held_out: &[Task]) -> Result<Vec<Task>, DatasetError> {
        let t = &self.tasks;
        let cfg = MixConfig {
            size: self.sft.tasks,
            tool_fraction: t.tool_fraction,
            multi_step_fraction: t.multi_step_fraction,
            inventory: t.inventory,
            three_step_fraction: t.three_step_fraction,
            seed: t.seed ^ 0x5f7_5eed,
            drill_words: self.sft.drill_words,
        };
        let held: std::collections::HashSet<String> = held_out.iter().map(dataset::task_key).collect();
        Ok(dataset::generate(&cfg)?.into_iter().filter(|task| !held.contains(&dataset::task_key(task))).collect())
    }

    /// Checks ranges and cross-field rules; the error names the offending field.
    pub fn validate(&self) -> Result<(), Invalid> {
        self.validate_tools()?;
        if self.judge_model.is_some() && self.judge != JudgeName::Model {
            return Err(Invalid::new("judge_model", "only a model judge (judge = \"model\") uses it; remove it"));
        }
        if self.model.path.is_empty() {
            return Err(Invalid::new("model.path", "an HF model directory or \"tiny\""));
        }
        let m = &self.model;
        if !["task", "smollm2"].contains(&m.tokenizer.as_str()) {
            return Err(Invalid::new("model.tokenizer", format!("\"task\" or \"smollm2\", got \"{}\"", m.tokenizer)));
        }
        at_least("model.vocab_size", m.vocab_size as f64, 300.0)?;
        let chunk = super::init::NUMBER_CHUNK_DIGITS;
        if !chunk.contains(&m.number_chunk) {
            let (lo, hi) = (chunk.start(), chunk.end());
            return Err(Invalid::new("model.number_chunk", format!("digits per number token, {lo} to {hi}, got {}", m.number_chunk)));
        }
        at_least("model.layers", m.layers as f64, 1.0)?;
        at_least("model.hidden", m.hidden as f64, 16.0)?;
        at_least("model.heads", m.heads as f64, 1.0)?;
        at_least("model.kv_heads", m.kv_heads as f64, 1.0)?;
        at_most("model.vocab_size", m.vocab_size as f64, bounds::VOCAB_SIZE as f64, "past the largest LLM vocabularies")?;
        at_most("model.hidden", m.hidden as f64, bounds::HIDDEN as f64, "the width of the largest open models")?;
        at_most("model.layers", m.layers as f64, bounds::LAYERS as f64, "past the deepest open models")?;
        at_most("model.heads", m.heads as f64, bounds::HEADS as f64, "past any published model")?;
        at_most("model.kv_heads", m.kv_heads as f64, bounds::HEADS as f64, "past any published model")?;
        if m.hidden % (2 * m.heads) != 0 {
            return Err(Invalid::new("model.hidden", format!("must split into {} heads of even width (a multiple of {}), got {}", m.heads, 2 * m.heads, m.hidden)));
        }
        if m.heads % m.kv_heads != 0 {
            return Err(Invalid::new("model.kv_heads", format!("must divide model.heads ({}), got {}", m.heads, m.kv_heads)));
        }
        if self.tiny_model() {
            // Embedding (task tokenizer only: SmolLM2's is 49152 rows), then per layer q, o, k, v and the 3×-wide MLP.
            let h = m.hidden as f64;
            let vocab = if m.tokenizer == "task" { m.vocab_size as f64 } else { 49_152.0 };
            let params = vocab * h + m.layers as f64 * (2.0 * h * h + 2.0 * h * h * m.kv_heads as f64 / m.heads as f64 + 9.0 * h * h);
            if params > bounds::TINY_PARAMETERS {
                return Err(Invalid::new(
                    "model.hidden",
                    format!("the tiny model would have {params:.3e} parameters, more than 2^30 (it is trained in f32 on the CPU: 16 GiB with Adam's state); lower model.hidden or model.layers"),
                ));
            }
        }
        let t = &self.tasks;
        at_least("tasks.size", t.size as f64, 1.0)?;
        at_least("tasks.held_out", t.held_out as f64, 100.0)?;
        let held = "tasks are generated and held in memory";
        at_most("tasks.size", t.size as f64, bounds::TASKS as f64, held)?;
        at_most("tasks.held_out", t.held_out as f64, bounds::TASKS as f64, held)?;
        unit("tasks.tool_fraction", t.tool_fraction)?;
        unit("tasks.multi_step_fraction", t.multi_step_fraction)?;
        unit("tasks.three_step_fraction", t.three_step_fraction)?;
        self.validate_estimator()?;
        let s = &self.sft;
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
        let r = &self.rl;
        positive("rl.lr", r.lr)?;
        at_least("rl.group_size", r.group_size as f64, 2.0)?;
        at_least("rl.groups_per_step", r.groups_per_step as f64, 1.0)?;
        at_least("rl.checkpoint_every", r.checkpoint_every as f64, 1.0)?;
        if let Some(d) = r.max_draws {
            if !r.dynamic_sampling {
                return Err(Invalid::new("rl.max_draws", "only dynamic_sampling = true uses it; set that or remove this"));
            }
            at_least("rl.max_draws", d as f64, 1.0)?;
            at_most("rl.max_draws", d as f64, bounds::MAX_DRAWS as f64, "uniform groups dropped in one step are generated for nothing")?;
        }
        positive("rl.temperature", r.temperature)?;
        at_least("rl.max_turns", r.max_turns as f64, 1.0)?;
        at_least("rl.max_new_tokens", r.max_new_tokens as f64, 1.0)?;
        at_most("rl.group_size", r.group_size as f64, bounds::GROUP_SIZE as f64, "a group is generated as one batch")?;
        at_most("rl.groups_per_step", r.groups_per_step as f64, bounds::GROUPS_PER_STEP as f64, "a step's groups are held in memory")?;
        at_most("rl.max_turns", r.max_turns as f64, bounds::MAX_TURNS as f64, "each turn is a generation and a tool call")?;
        at_most("rl.max_new_tokens", r.max_new_tokens as f64, bounds::MAX_NEW_TOKENS as f64, "the longest context of the models rlmesh loads")?;
        at_most("rl.steps", r.steps as f64, bounds::STEPS as f64, "past a year of steps")?;
        if let Some(k) = r.max_staleness {
            at_most("rl.max_staleness", k as f64, bounds::MAX_STALENESS as f64, "every policy version a buffered group may come from is kept")?;
        }
        match (r.mode, r.max_staleness) {
            (ModeName::Sync, Some(k)) if k != 0 => Err(Invalid::new("rl.max_staleness", format!("mode \"sync\" means 0, got {k}"))),
            (ModeName::OneStepOff, Some(k)) if k != 1 => {
                Err(Invalid::new("rl.max_staleness", format!("mode \"one_step_off\" means 1, got {k}")))
            }
            (ModeName::Async, Some(0)) => Err(Invalid::new("rl.max_staleness", "mode \"async\" needs at least 1 (0 is \"sync\")")),
            _ => Ok(()),
        }
    }

    fn validate_tools(&self) -> Result<(), Invalid> {
        let known: Vec<&str> = registry::BUILTIN_TOOLS.iter().chain(registry::BUILTIN_ENVIRONMENTS).copied().collect();
        for (i, name) in self.tools.iter().enumerate() {
            if !known.contains(&name.as_str()) {
                return Err(Invalid::new(format!("tools[{i}]"), format!("unknown tool \"{name}\" (known: {})", known.join(", "))));
            }
            if self.tools[..i].contains(name) {
                return Err(Invalid::new(format!("tools[{i}]"), format!("\"{name}\" is listed twice")));
            }
        }
        let has = |n: &str| self.tools.iter().any(|t| t == n);
        if self.tasks.tool_fraction > 0.0 && !has(calculator::NAME) {
            return Err(Invalid::new("tools", "tool tasks (tasks.tool_fraction > 0) need \"calculator\""));
        }
        if self.tasks.inventory && !has(inventory::NAME) {
            return Err(Invalid::new("tasks.inventory", "inventory tasks need \"inventory\" in tools"));
        }
        Ok(())
    }

    fn validate_estimator(&self) -> Result<(), Invalid> {
        let e = &self.estimator;
        let given = [
            ("w_process", e.w_process.is_some()),
            ("w_summary", e.w_summary.is_some()),
            ("norm_by_std", e.norm_by_std.is_some()),
            ("gamma", e.gamma.is_some()),
            ("lam", e.lam.is_some()),
            ("upstream_weighting", e.upstream_weighting.is_some()),
            ("kl_target", e.kl_target.is_some()),
            ("scale_rewards", e.scale_rewards.is_some()),
        ];
        for (field, set) in given {
            let users = ESTIMATOR_FIELDS.iter().find(|(f, _)| *f == field).map_or(&[][..], |(_, u)| *u);
            if set && !users.contains(&e.name) {
                let names: Vec<&str> = users.iter().map(|k| k.as_str()).collect();
                return Err(Invalid::new(
                    format!("estimator.{field}"),
                    format!("only {} {} it, and this recipe's estimator is {}; remove it", names.join(" and "), if names.len() == 1 { "uses" } else { "use" }, e.name.as_str()),
                ));
            }
        }
        if let (EstimatorKind::DrGrpo, Some(s)) = (e.name, e.scale_rewards) {
            if s != ScaleRewardsName::None {
                return Err(Invalid::new("estimator.scale_rewards", "dr_grpo does not scale rewards: only \"none\""));
            }
        }
        for (field, v) in [("w_process", e.w_process), ("w_summary", e.w_summary)] {
            if let Some(v) = v {
                if !(v >= 0.0 && v.is_finite()) {
                    return Err(Invalid::new(format!("estimator.{field}"), format!("must be ≥ 0, got {v}")));
                }
            }
        }
        for (field, v) in [("gamma", e.gamma), ("lam", e.lam)] {
            if let Some(v) = v {
                unit(&format!("estimator.{field}"), v)?;
            }
        }
        if let Some(t) = e.kl_target {
            positive("estimator.kl_target", t)?;
        }
        if !(e.clip_eps > 0.0 && e.clip_eps < 1.0) {
            return Err(Invalid::new("estimator.clip_eps", format!("must be in (0, 1), got {}", e.clip_eps)));
        }
        if !(e.kl_coef >= 0.0 && e.kl_coef.is_finite()) {
            return Err(Invalid::new("estimator.kl_coef", format!("must be ≥ 0, got {}", e.kl_coef)));
        }
        Ok(())
    }
}

fn unit(field: &str, v: f64) -> Result<(), Invalid> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(Invalid::new(field, format!("must be in [0, 1], got {v}")))
    }
}

fn positive(field: &str, v: f64) -> Result<(), Invalid> {
    if v > 0.0 && v.is_finite() {
        Ok(())
    } else {
        Err(Invalid::new(field, format!("must be > 0, got {v}")))
    }
}

fn at_most(field: &str, v: f64, max: f64, why: &str) -> Result<(), Invalid> {
    if v <= max {
        Ok(())
    } else {
        Err(Invalid::new(field, format!("must be at most {max} ({why}), got {v}")))
    }
}

fn at_least(field: &str, v: f64, min: f64) -> Result<(), Invalid> {
    if v >= min {
        Ok(())
    } else {
        Err(Invalid::new(field, format!("must be at least {min}, got {v}")))
    }
}
