//! Upper bounds of the recipe's sizes, each with the reason it holds; a
//! larger value is refused naming its field, the bound and the reason.
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
