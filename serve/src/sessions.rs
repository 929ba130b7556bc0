//! Who may call the endpoint, and where an agent session's calls are recorded.
//!
//! A standalone endpoint is open or takes one key. In training, each rollout
//! of an agent program gets a key of its own: the [`Sessions`] behind the
//! endpoint knows the keys of the live rollouts, refuses others (401) and
//! receives every call made with a live key, with the exact token ids,
//! log-probs and policy version the engine sampled.
use rlmesh_model::FinishReason;
use serde_json::Value;
use std::sync::Arc;

/// One sampled completion of a recorded call.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledCompletion {
    /// The sampled token ids (the stop token included when one ended it).
    pub tokens: Vec<u32>,
    /// Each token's log-prob under the sampling distribution.
    pub logprobs: Vec<f32>,
    /// Why it stopped.
    pub finish: FinishReason,
    /// The assistant message the endpoint answered with (OpenAI's shape).
    pub message: Value,
}

/// One call made under a session's key.
#[derive(Clone, Debug, PartialEq)]
pub struct CallRecord {
    /// The rendered prompt's token ids.
    pub prompt_ids: Vec<u32>,
    /// The request's messages as the chat template read them (empty for a text completion).
    pub messages: Vec<Value>,
    /// The tool schemas rendered into the prompt.
    pub tools: Option<Vec<Value>>,
    /// The policy version that sampled the completions.
    pub version: u64,
    /// The completions (`n` of them).
    pub completions: Vec<SampledCompletion>,
}

/// The live sessions behind an endpoint in training.
pub trait Sessions: Send + Sync {
    /// Whether `key` belongs to a live session; the error says why not (a 401's message).
    fn check(&self, key: &str) -> Result<(), String>;
    /// Records a call made with `key`; an error (the session ended meanwhile) answers 401.
    fn record(&self, key: &str, call: CallRecord) -> Result<(), String>;
    /// The session's say over a request's sampling (training samples at the
    /// recipe's temperature, whatever the program asks: the learner's
    /// importance ratio assumes it). Nothing by default.
    fn adjust(&self, _key: &str, _params: &mut rlmesh_model::SamplingParams) {}
}

/// How callers prove who they are.
#[derive(Clone, Default)]
pub enum Auth {
    /// Anyone may call.
    #[default]
    Open,
    /// `Authorization: Bearer KEY` with this key.
    Key(String),
    /// The key of a live session (agent programs in training).
    Sessions(Arc<dyn Sessions>),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Open => write!(f, "Open"),
            Auth::Key(_) => write!(f, "Key(…)"),
            Auth::Sessions(_) => write!(f, "Sessions"),
        }
    }
}
