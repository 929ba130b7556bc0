//! Trajectories and groups: what a rollout produces and the learner consumes.
use crate::chat::Message;
use crate::task::Task;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A half-open token range `[start, end)` into a trajectory's `token_ids`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct Span {
    /// First token index.
    pub start: usize,
    /// One past the last token index.
    pub end: usize,
}

impl Span {
    /// Number of tokens in the span.
    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start)
    }
    /// True when the span holds no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One executed (or attempted) tool call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Assistant turn (0-based) that emitted the call.
    pub turn: usize,
    /// Index of the call within its turn (parallel calls).
    pub index: usize,
    /// Tool name as written by the model (may be unknown).
    pub name: String,
    /// Arguments as written by the model.
    #[serde(with = "crate::wire::json_value")]
    pub arguments: Value,
    /// Text returned to the model (a tool result or `{"error": …}`).
    pub result: String,
    /// True when the tool ran and returned without error.
    pub success: bool,
    /// Error text when it did not.
    pub error: Option<String>,
    /// Wall time of the call in milliseconds.
    pub latency_ms: f64,
    /// True when an identical call (same name and arguments) was made earlier in the rollout.
    pub repeated: bool,
}

/// Why a rollout ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model answered without a tool call.
    Answered,
    /// `max_turns` assistant turns were used.
    MaxTurns,
    /// The token budget ran out.
    TokenBudget,
}

/// One rollout of the policy on a task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// Task this rollout answers.
    pub task_id: String,
    /// Index within the group (0..G).
    pub sample_index: usize,
    /// Number of prompt tokens at the start of `token_ids`.
    pub prompt_len: usize,
    /// Prompt text as rendered by the chat template.
    pub rendered_prompt: String,
    /// Prompt + response token ids.
    pub token_ids: Vec<u32>,
    /// 1 where the policy generated the token, 0 for prompt, template glue and tool results.
    pub loss_mask: Vec<u8>,
    /// Behaviour log-prob of every token (0.0 where `loss_mask` is 0).
    pub logprobs: Vec<f32>,
    /// Policy version that generated every token (0 where `loss_mask` is 0).
    pub versions: Vec<u64>,
    /// Token span of each assistant action that contained tool calls.
    pub segments: Vec<Span>,
    /// The last contiguous policy-generated block (the final summary), if any.
    pub summary: Option<Span>,
    /// Executed tool calls in order.
    pub steps: Vec<Step>,
    /// Parse failures of `<tool_call>` blocks (reason per failure).
    pub format_errors: Vec<String>,
    /// The conversation after the prompt, in the transformers format.
    pub messages: Vec<Message>,
    /// Everything the policy wrote after the prompt, decoded (tool results included).
    pub completion: String,
    /// The text of the last assistant turn.
    pub final_answer: String,
    /// Why generation stopped.
    pub stop_reason: StopReason,
    /// The tool sources' own grades of the rollout, by source (reward
    /// function `env:<source>`): a value, not applicable, or could not grade.
    /// Always serialised: bincode is not self-describing, so a skipped
    /// field would shift every byte after it.
    #[serde(default)]
    pub grades: Vec<(String, crate::reward::functions::Score)>,
}

impl Trajectory {
    /// Number of policy-generated tokens.
    pub fn policy_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m != 0).count()
    }
    /// Oldest policy version among generated tokens (None without generated tokens).
    pub fn min_version(&self) -> Option<u64> {
        self.loss_mask.iter().zip(&self.versions).filter(|(m, _)| **m != 0).map(|(_, v)| *v).min()
    }
}

/// The G trajectories sampled for one task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// Ledger identifier of this group.
    pub group_id: u64,
    /// The task.
    pub task: Task,
    /// The rollouts.
    pub trajectories: Vec<Trajectory>,
    /// Why some rollouts could not be produced (an agent program failed),
    /// `None` when all were: such a group is dropped (`failed_agent`) and
    /// replaced, never scored; `trajectories` then holds the ones that were.
    #[serde(default)]
    pub failed: Option<String>,
    /// The earlier calls of rollouts whose agent program rewrote its history
    /// (one segment per call; the last call is the rollout's trajectory):
    /// each is trained with the advantage of the rollout of its `sample_index`.
    #[serde(default)]
    pub earlier_segments: Vec<Trajectory>,
}
