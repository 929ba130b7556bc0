//! The requests of OpenAI's API that the endpoint reads, defined once.
//!
//! Fields the endpoint does not use are ignored, as OpenAI's servers and vLLM
//! ignore them; a field of the wrong type is a 400 naming the field.
use crate::error::ApiError;
use serde::Deserialize;
use serde_json::Value;

/// `stop`: one string or a list of them.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Stop {
    /// No stop strings.
    #[default]
    None,
    /// One string.
    One(String),
    /// Several strings.
    Many(Vec<String>),
}

impl Stop {
    /// The strings, empty ones dropped.
    pub fn strings(&self) -> Vec<String> {
        match self {
            Stop::None => vec![],
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect()
    }
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct StreamOptions {
    /// Send a last chunk with the usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling fields shared by chat and text completions.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Sampling {
    /// Softmax temperature (default 1; 0 is greedy).
    pub temperature: Option<f64>,
    /// Nucleus mass (default 1).
    pub top_p: Option<f64>,
    /// Most likely tokens kept (vLLM's extension; -1 or 0: off).
    pub top_k: Option<i64>,
    /// Most tokens generated.
    pub max_tokens: Option<u64>,
    /// Most tokens generated (the newer name; wins over `max_tokens`).
    pub max_completion_tokens: Option<u64>,
    /// Completions per prompt.
    pub n: Option<u64>,
    /// Sampler seed.
    pub seed: Option<i64>,
    /// Stop strings (not part of the output).
    #[serde(default)]
    pub stop: Stop,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Add the prompt's and each completion's token ids (vLLM's extension).
    #[serde(default)]
    pub return_token_ids: bool,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ChatRequest {
    /// The model asked for.
    #[serde(default)]
    pub model: String,
    /// The conversation (OpenAI's message objects).
    pub messages: Vec<Value>,
    /// Tools offered (`{"type": "function", "function": {…}}`).
    pub tools: Option<Vec<Value>>,
    /// `"auto"` (default with tools) or `"none"`.
    pub tool_choice: Option<Value>,
    /// Return the sampled tokens' log-probs.
    #[serde(default)]
    pub logprobs: bool,
    /// Also the most likely tokens at each position (0..=20; needs `logprobs`).
    pub top_logprobs: Option<u64>,
    /// Sampling.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `prompt` of a text completion: text, token ids, or a list of either.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Several prompts as token ids.
    IdLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct CompletionRequest {
    /// The model asked for.
    #[serde(default)]
    pub model: String,
    /// The prompt(s).
    pub prompt: Prompt,
    /// Log-probs of the sampled tokens and this many most likely tokens (0..=20).
    pub logprobs: Option<u64>,
    /// Put the prompt before the completion in `text`.
    #[serde(default)]
    pub echo: bool,
    /// Sampling.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// Reads a request body as `T`, or says which field is wrong (400).
pub fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object", None));
    }
    serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("invalid request: {e}"), None))
}
