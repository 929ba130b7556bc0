//! `launcher chat`: one conversation with a model through the rollout tool loop.
use super::load_model;
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_actors::controller::init::TOOL_TEMPLATE;
use rlmesh_actors::rollout::{self, RolloutConfig};
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_core::{Message, Task, Trajectory};
use rlmesh_model::{SamplingParams, Tokenizer};
use serde_json::{json, Value};
use std::path::PathBuf;

/// Upper bound of `--max-new-tokens`: 2^20, past the context of any model rlmesh loads.
pub const MAX_NEW_TOKENS: u64 = 1 << 20;

/// Arguments of `launcher chat`.
#[derive(Args)]
pub struct ChatArgs {
    /// Model directory.
    #[arg(long)]
    model: PathBuf,
    /// The user message.
    #[arg(long)]
    prompt: String,
    /// Tools to offer (comma-separated, e.g. calculator).
    #[arg(long, value_delimiter = ',')]
    tools: Vec<String>,
    /// Greedy decoding (default: temperature 0.7).
    #[arg(long)]
    greedy: bool,
    /// Most tokens generated per assistant turn (1..=1048576; the model's context bounds it too).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=MAX_NEW_TOKENS))]
    max_new_tokens: u64,
    /// Print {"messages", "token_ids", "text"} as JSON.
    #[arg(long)]
    json: bool,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// `launcher chat`.
pub fn run(a: ChatArgs) -> CliResult {
    if a.prompt.trim().is_empty() {
        return Err(CliError::usage(anyhow::anyhow!("--prompt: empty")));
    }
    let registry = ToolRegistry::from_names(&a.tools, ExecLimits::default()).usage("--tools")?;
    let no_env: Task = serde_json::from_value(json!({"requires_tool": false})).expect("a task needs only requires_tool");
    let specs = registry.specs_for(&no_env).usage("--tools")?;
    if let Some(env) = a.tools.iter().find(|t| !specs.iter().any(|s| &s.name == *t)) {
        return Err(CliError::usage(anyhow::anyhow!("--tools {env}: an environment (its tools need a task's state); chat offers stateless tools only")));
    }
    let (model, mut tok) = load_model(&a.model)?;
    let schemas: Vec<Value> = specs.iter().map(|s| s.json_schema()).collect();
    if !renders_tools(&tok, &schemas) {
        eprintln!("note: {} has no chat template that renders tools; using rlmesh's tool template (Qwen2.5 style)", a.model.display());
        tok.set_chat_template(TOOL_TEMPLATE);
    }
    let context = usize::try_from(model.config.max_position_embeddings).unwrap_or(usize::MAX);
    let max_new_tokens = usize::try_from(a.max_new_tokens).unwrap_or(usize::MAX);
    let prompt_len = prompt_tokens(&tok, &a.prompt, &schemas)?;
    if prompt_len >= context {
        return Err(CliError::usage(anyhow::anyhow!(
            "--prompt: {prompt_len} tokens once rendered with the chat template, but the model's context holds {context} (max_position_embeddings), so no reply would fit"
        )));
    }
    if context - prompt_len < max_new_tokens {
        eprintln!("note: the prompt takes {prompt_len} of the model's {context} positions: a reply gets at most {} tokens, not --max-new-tokens {max_new_tokens}", context - prompt_len);
    }
    let cfg = RolloutConfig {
        group_size: 1,
        max_turns: if a.tools.is_empty() { 1 } else { RolloutConfig::default().max_turns },
        sampling: SamplingParams { max_new_tokens, temperature: if a.greedy { 0.0 } else { 0.7 }, seed: a.seed, ..Default::default() },
        ..RolloutConfig::default()
    };
    let traj = rollout::chat(&model, &tok, &registry, &a.prompt, &cfg, a.seed)?;
    let messages: Vec<Message> = std::iter::once(Message::user(a.prompt.as_str())).chain(traj.messages.iter().cloned()).collect();
    if a.json {
        let text = tok.decode(&traj.token_ids, false)?;
        // transformers' format: absent fields are left out, not null.
        let messages: Vec<Value> = messages.iter().map(|m| serde_json::to_value(m).map(drop_nulls)).collect::<Result<_, _>>()?;
        println!("{}", json!({"messages": messages, "token_ids": traj.token_ids, "text": text}));
    } else {
        print_conversation(&messages, &traj);
    }
    Ok(())
}

/// The rendered prompt's length in tokens, as the tool loop renders it (the user message, the tools, the generation prompt).
fn prompt_tokens(tok: &Tokenizer, prompt: &str, schemas: &[Value]) -> CliResult<usize> {
    let messages = [json!({"role": "user", "content": prompt})];
    let tools = (!schemas.is_empty()).then_some(schemas);
    let (_, ids) = tok.render_ids(&messages, tools, true).usage("--prompt: rendering it with the chat template")?;
    Ok(ids.len())
}

/// A message object without its null fields.
fn drop_nulls(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        m.retain(|_, x| !x.is_null());
    }
    v
}

/// Whether the tokenizer's template exists and, when tools are offered, renders them.
fn renders_tools(tok: &Tokenizer, schemas: &[Value]) -> bool {
    let probe = [json!({"role": "user", "content": "hi"})];
    match tok.render(&probe, None, true) {
        Err(_) => false,
        Ok(_) if schemas.is_empty() => true,
        Ok(plain) => tok.render(&probe, Some(schemas), true).is_ok_and(|with| with != plain),
    }
}

/// Role-tagged lines: `[user] …`, `[assistant] …`, `[assistant → tool] {args}`, `[tool name] result`.
fn print_conversation(messages: &[Message], traj: &Trajectory) {
    for m in messages {
        let name = m.name.as_deref().map(|n| format!(" {n}")).unwrap_or_default();
        if !m.content.is_empty() || m.tool_calls.is_none() {
            println!("[{}{name}] {}", m.role, m.content);
        }
        for c in m.tool_calls.iter().flatten() {
            println!("[{} → {}] {}", m.role, c.function.name, c.function.arguments);
        }
    }
    for e in &traj.format_errors {
        println!("[format error] {e}");
    }
    match traj.stop_reason {
        rlmesh_core::StopReason::TokenBudget => println!("[stop] TokenBudget (the model's context or the token budget is used up)"),
        other => println!("[stop] {other:?}"),
    }
}
