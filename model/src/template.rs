//! Checks that a chat template can carry a tool-calling rollout, before a run
//! trains on it.
//!
//! The rollout loop renders the prompt with the tool schemas, appends what the
//! model generates as tokens, then appends each tool result as a token *suffix*:
//! the rendering of the conversation with the results, minus the rendering
//! without them. That needs three things of the template, each checked here on a
//! probe conversation:
//!
//! 1. it renders the `tools` it is given (a template that ignores them trains a
//!    model that never sees a schema: SmolLM2's own template is one);
//! 2. it is *prefix-preserving*: rendering a conversation, then the same
//!    conversation with one more message, gives the first text followed by more
//!    (templates that rewrite earlier turns, e.g. drop old reasoning, are not);
//! 3. an assistant turn ends with one of the model's stop tokens, so the glue
//!    after the model's own end-of-turn can be found.
//!
//! ```no_run
//! # fn f(tok: &rlmesh_model::Tokenizer) {
//! if let Err(problem) = rlmesh_model::template::check_tool_template(tok) {
//!     eprintln!("refused: {problem}");
//! }
//! # }
//! ```
use crate::tokenizer::Tokenizer;
use serde_json::{json, Value};

/// Why a template cannot carry a tool-calling rollout.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateProblem {
    /// The tokenizer has no template, or rendering failed.
    #[error("the chat template does not render a tool conversation: {0}")]
    Render(String),
    /// The rendered prompt does not contain the tool's schema.
    #[error("the chat template does not render the tools it is given: a prompt rendered with a tool named \"{0}\" does not contain that name (set [model] chat_template to a template that renders `tools`)")]
    NoTools(String),
    /// Adding a message rewrote what was rendered before it.
    #[error("the chat template is not prefix-preserving: adding {added} changed the text rendered before it at byte {at} (before: {before:?}, after: {after:?}); rollouts append tokens and never re-render earlier turns")]
    NotPrefix {
        /// The message that was added.
        added: &'static str,
        /// Where the two renderings first differ.
        at: usize,
        /// The earlier rendering from there (up to 60 characters).
        before: String,
        /// The later rendering from there (up to 60 characters).
        after: String,
    },
    /// An assistant turn's rendering holds none of the stop tokens.
    #[error("an assistant turn rendered by the chat template ends with none of the model's stop tokens ({0}); the rollout could not tell where the model's turn ends")]
    NoEndOfTurn(String),
}

/// The probe tool: a name no template hard-codes.
const PROBE_TOOL: &str = "rlmesh_probe_lookup";

/// The probe conversation, one message at a time: user, an assistant tool call,
/// the tool's result, the final reply.
fn probe() -> (Vec<Value>, Vec<(Value, &'static str)>) {
    let tools = vec![json!({
        "type": "function",
        "function": {
            "name": PROBE_TOOL,
            "description": "Looks a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string", "description": "The word."}}, "required": ["word"]}
        }
    })];
    let turns = vec![
        (json!({"role": "user", "content": "What does \"mesh\" mean?"}), "a user message"),
        (
            json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": PROBE_TOOL, "arguments": {"word": "mesh"}}}]}),
            "an assistant tool call",
        ),
        (json!({"role": "tool", "name": PROBE_TOOL, "content": "a net of connected strands"}), "a tool result"),
        (json!({"role": "assistant", "content": "A net of connected strands."}), "the final reply"),
    ];
    (tools, turns)
}

/// The text of an assistant turn that calls the probe tool `rlmesh_probe_lookup` with
/// `{"word": "mesh"}`, as the template renders it (between the generation prompt and the
/// end of the turn): what a model trained on this template writes to call a tool. A
/// caller checks that its tool-call parser reads the call back.
pub fn rendered_call(tokenizer: &Tokenizer) -> Result<String, TemplateProblem> {
    let (tools, turns) = probe();
    let render = |messages: &[Value], generation: bool| tokenizer.render(messages, Some(&tools), generation).map_err(|e| TemplateProblem::Render(e.to_string()));
    let prompt = render(&[turns[0].0.clone()], true)?;
    let whole = render(&[turns[0].0.clone(), turns[1].0.clone()], false)?;
    let turn = whole.strip_prefix(prompt.as_str()).unwrap_or(&whole);
    let stops: Vec<String> = tokenizer.stop_token_ids().iter().filter_map(|&id| tokenizer.decode(&[id], false).ok()).filter(|t| !t.is_empty()).collect();
    let end = stops.iter().filter_map(|s| turn.find(s.as_str())).min().unwrap_or(turn.len());
    Ok(turn[..end].to_string())
}

/// The probe call's tool name and arguments (see [`rendered_call`]).
pub fn probe_call() -> (&'static str, Value) {
    (PROBE_TOOL, json!({"word": "mesh"}))
}

/// Checks that `tokenizer`'s chat template renders tools, is prefix-preserving
/// over a tool round-trip, and ends assistant turns with a stop token.
pub fn check_tool_template(tokenizer: &Tokenizer) -> Result<(), TemplateProblem> {
    let (tools, turns) = probe();
    let render = |messages: &[Value], generation: bool| tokenizer.render(messages, Some(&tools), generation).map_err(|e| TemplateProblem::Render(e.to_string()));
    let mut messages = vec![turns[0].0.clone()];
    let prompt = render(&messages, true)?;
    if !prompt.contains(PROBE_TOOL) {
        return Err(TemplateProblem::NoTools(PROBE_TOOL.into()));
    }
    // Each rendering the rollout builds on must be a prefix of the next one: the prompt with
    // the generation prompt before an assistant turn, the conversation without it before a tool result.
    let mut before = prompt;
    for (message, added) in &turns[1..] {
        messages.push(message.clone());
        let generation = message["role"] == "tool";
        let after = render(&messages, generation)?;
        if !after.starts_with(&before) {
            let at = before.char_indices().zip(after.chars()).find(|((_, a), b)| a != b).map_or(before.len().min(after.len()), |((i, _), _)| i);
            let cut = |s: &str| s.get(at..).unwrap_or("").chars().take(60).collect();
            return Err(TemplateProblem::NotPrefix { added, at, before: cut(&before), after: cut(&after) });
        }
        if message["role"] == "assistant" {
            let turn = &after[before.len()..];
            let stops: Vec<String> = tokenizer.stop_token_ids().iter().filter_map(|&id| tokenizer.decode(&[id], false).ok()).filter(|t| !t.is_empty()).collect();
            if !stops.iter().any(|s| turn.contains(s.as_str())) {
                return Err(TemplateProblem::NoEndOfTurn(if stops.is_empty() { "the model has none".into() } else { stops.join(", ") }));
            }
        }
        before = after;
    }
    Ok(())
}
