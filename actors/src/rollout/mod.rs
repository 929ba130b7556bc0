//! The rollout actor's work: the multi-turn tool loop that turns tasks into
//! [`Group`](rlmesh_core::Group)s of [`Trajectory`](rlmesh_core::Trajectory) records.
//!
//! Per rollout: the prompt is the optional system message plus the task's user
//! prompt (with the environment's `reset` observation appended), rendered by
//! the chat template with `tools = session.schemas()`. Then, turn by turn:
//!
//! 1. **generate** — one batched `generate` call per turn covers every live
//!    rollout of every group (the engine prefills identical prompts once, and
//!    continues each rollout from the keys and values its earlier turns left,
//!    so a turn prefills only its tool result and template glue);
//! 2. **parse** — the turn's text (without its stop token) is split into
//!    content and `<tool_call>` blocks by the rollout's [`ToolSession`](rlmesh_core::tools::ToolSession);
//! 3. **execute** — every block runs in order under the registry's
//!    [`ExecLimits`](rlmesh_core::tools::ExecLimits), one `tool` message per
//!    block; the rollouts of a turn run their tools concurrently, so a hanging
//!    tool costs one time limit per turn, not one per rollout;
//! 4. **append** — the tool messages enter the context as a token *suffix*:
//!    the template glue after the model's stop token (the `"\n"` after
//!    `<|im_end|>`), the tool-response turn and the next generation prompt,
//!    obtained as the difference between two renderings of the conversation
//!    and tokenised alone. Earlier tokens are never re-tokenised; the suffix
//!    gets loss mask 0.
//!
//! A rollout ends when a turn has no `<tool_call>` block ([`StopReason::Answered`](rlmesh_core::StopReason::Answered)),
//! after `max_turns` turns ([`StopReason::MaxTurns`](rlmesh_core::StopReason::MaxTurns)), or when its tokens run
//! out ([`StopReason::TokenBudget`](rlmesh_core::StopReason::TokenBudget)): `max_tokens` bounds everything after the
//! prompt (generated and injected), and a turn cut by a token limit ends the
//! rollout. Calls of a turn that ends the rollout with `MaxTurns`, or whose
//! tool results do not fit the budget, are executed and recorded as steps, but
//! their tool messages are not appended, so that `messages` renders to exactly
//! the trajectory's tokens (unless a turn was cut short, and provided the model
//! wrote its calls in the template's canonical form). Calls of a turn cut short
//! are not executed.
//!
//! ```no_run
//! use rlmesh_actors::rollout::{rollout_groups, RolloutConfig};
//! # fn run(model: &rlmesh_model::Transformer, tokenizer: &rlmesh_model::Tokenizer,
//! #        registry: &rlmesh_core::tools::ToolRegistry, task: rlmesh_core::Task) {
//! let cfg = RolloutConfig { group_size: 4, ..RolloutConfig::default() };
//! let groups = rollout_groups(model, tokenizer, registry, &[(0, task)], &cfg, 1, 42).unwrap();
//! assert_eq!(groups[0].trajectories.len(), 4);
//! # }
//! ```
pub mod agent;
pub mod agent_host;
mod conversation;
mod tool_loop;
pub mod tools;

pub mod actor;
pub use conversation::prompt_messages;
pub use tool_loop::{chat, prompt_text, rollout_groups, rollout_groups_timed, ToolLoopTiming};

use rlmesh_model::{ModelError, SamplingParams};
use serde::{Deserialize, Serialize};

/// How rollouts are sampled: group size, turn and token limits, sampling, system prompt.
///
/// Tool execution limits are the [`ToolRegistry`](rlmesh_core::tools::ToolRegistry)'s.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutConfig {
    /// Trajectories sampled per task (G).
    pub group_size: usize,
    /// Most assistant turns per trajectory.
    pub max_turns: usize,
    /// Most tokens after the prompt per trajectory (generated and injected).
    pub max_tokens: usize,
    /// Sampling; `max_new_tokens` bounds one turn, empty `stop_token_ids` mean the tokenizer's.
    pub sampling: SamplingParams,
    /// System message placed before the user prompt (`None`: the template's default).
    pub system_prompt: Option<String>,
    /// How the model writes tool calls (the recipe's `[model] tool_format`).
    #[serde(default)]
    pub tool_format: rlmesh_core::tools::ToolFormat,
    /// Each turn continues from the keys and values of the rollout's previous
    /// turns, prefilling only the tool result and template glue (default); off,
    /// every turn prefills the whole conversation again (the per-turn path,
    /// kept to measure against).
    pub keep_kv: bool,
    /// `[agent]`: rollouts are runs of this program against the policy's endpoint.
    #[serde(default)]
    pub agent: Option<agent::AgentSpec>,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            group_size: 8,
            max_turns: 4,
            max_tokens: 1024,
            sampling: SamplingParams::default(),
            system_prompt: None,
            tool_format: Default::default(),
            keep_kv: true,
            agent: None,
        }
    }
}

impl RolloutConfig {
    /// Checks that every limit allows at least one rollout, turn and token.
    pub fn validate(&self) -> Result<(), RolloutError> {
        let positive = [
            ("group_size", self.group_size),
            ("max_turns", self.max_turns),
            ("max_tokens", self.max_tokens),
            ("sampling.max_new_tokens", self.sampling.max_new_tokens),
        ];
        match positive.into_iter().find(|(_, v)| *v == 0) {
            Some((field, _)) => Err(RolloutError::Config { field, reason: "must be at least 1, got 0".into() }),
            None => Ok(()),
        }
    }
}

/// Why a batch of rollouts could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// A field of the rollout config is out of range.
    #[error("rollout config: field `{field}` {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// What was expected and found.
        reason: String,
    },
    /// Neither the config nor the tokenizer names a token that ends a turn.
    #[error("no stop token: `sampling.stop_token_ids` is empty and the tokenizer has no eos token, so no turn could end")]
    NoStopToken,
    /// A task cannot run with the registry's tools (unknown environment, failed reset, …).
    #[error("opening the tools of a rollout: {0}")]
    Session(#[from] rlmesh_core::tools::RegistryError),
    /// The generation engine failed.
    #[error("generating turn {turn} of {rollouts} rollouts: {source}")]
    Generate {
        /// Assistant turn (1-based).
        turn: usize,
        /// Rollouts in the batch.
        rollouts: usize,
        /// The engine's error.
        source: ModelError,
    },
    /// Rendering, tokenising or decoding failed.
    #[error("task \"{task}\", turn {turn}: {what}: {source}")]
    Text {
        /// Task id.
        task: String,
        /// Assistant turn (1-based; 0 is the prompt).
        turn: usize,
        /// What was being done.
        what: &'static str,
        /// The tokenizer's or template's error.
        source: ModelError,
    },
    /// The chat template does not render a longer conversation as an extension of the shorter one.
    #[error("task \"{task}\", turn {turn}: the chat template renders the conversation with its tool messages as {found:?}…, which does not start with the rendering before them, so the tool results cannot be appended as a suffix")]
    NotPrefix {
        /// Task id.
        task: String,
        /// Assistant turn (1-based).
        turn: usize,
        /// The start of the rendering where it departs (up to 80 characters).
        found: String,
    },
    /// The rendered assistant turn does not contain the token that ended it.
    #[error("task \"{task}\", turn {turn}: the chat template's rendering of the assistant turn contains none of the stop tokens {stops:?}, so the glue after the turn is unknown")]
    NoEndOfTurn {
        /// Task id.
        task: String,
        /// Assistant turn (1-based).
        turn: usize,
        /// The stop tokens' texts looked for.
        stops: Vec<String>,
    },
}
