//! `launcher chat`: one conversation with a model.
use super::load_model;
use crate::error::{CliError, CliResult};
use clap::Args;
use rlmesh_model::SamplingParams;
use serde_json::{json, Value};
use std::path::PathBuf;

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
    /// Most tokens generated per assistant turn.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
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
    let (model, tok) = load_model(&a.model)?;
    let params = SamplingParams {
        max_new_tokens: a.max_new_tokens,
        temperature: if a.greedy { 0.0 } else { 0.7 },
        seed: a.seed,
        stop_token_ids: tok.stop_token_ids().to_vec(),
        ..Default::default()
    };
    if !a.tools.is_empty() {
        return Err(CliError::usage(anyhow::anyhow!("--tools: the tool loop is not wired into chat yet")));
    }
    let mut messages = vec![json!({"role": "user", "content": a.prompt})];
    let (_, prompt_ids) = tok.render_ids(&messages, None, true).map_err(CliError::usage)?;
    let out = model.generate(&[prompt_ids.clone()], &params, Some(&tok))?.remove(0);
    let reply = tok.decode(&out.tokens, true)?;
    messages.push(json!({"role": "assistant", "content": reply}));
    print_conversation(&messages, prompt_ids.into_iter().chain(out.tokens).collect(), &tok, a.json)
}

fn print_conversation(messages: &[Value], ids: Vec<u32>, tok: &rlmesh_model::Tokenizer, as_json: bool) -> CliResult {
    let text = tok.decode(&ids, false)?;
    if as_json {
        println!("{}", json!({"messages": messages, "token_ids": ids, "text": text}));
    } else {
        for m in messages {
            let role = m["role"].as_str().unwrap_or("?");
            println!("[{role}] {}", m["content"].as_str().unwrap_or(""));
        }
    }
    Ok(())
}
