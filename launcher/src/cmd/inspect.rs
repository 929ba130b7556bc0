//! `score`, `render`, `advantages`, `reward`: the JSON contracts of CLI.md.
use super::read_input;
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `launcher score`.
#[derive(Args)]
pub struct ScoreArgs {
    /// Model directory (config.json + safetensors).
    #[arg(long)]
    model: PathBuf,
    /// JSONL file of {"token_ids": [...]} (or - for stdin).
    #[arg(long)]
    input: PathBuf,
    /// Sequences scored per batch.
    #[arg(long, default_value_t = 8)]
    batch: usize,
}

/// `launcher score`.
pub fn score(a: ScoreArgs) -> CliResult {
    let text = read_input(&a.input)?;
    let model = rlmesh_model::Transformer::load(&a.model, tch::Device::Cpu, Some(tch::Kind::Float)).usage("loading the model")?;
    let mut seqs = vec![];
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let where_ = format!("{}:{}", a.input.display(), i + 1);
        let v: Value = serde_json::from_str(line).usage(format!("{where_}: not valid JSON"))?;
        let ids: Vec<u32> = v
            .get("token_ids")
            .ok_or_else(|| CliError::usage(anyhow::anyhow!("{where_}: field \"token_ids\": missing")))
            .and_then(|x| serde_json::from_value(x.clone()).usage(format!("{where_}: field \"token_ids\": expected an array of non-negative integers")))?;
        model.check_ids(&ids).usage(&where_)?;
        if ids.is_empty() {
            return Err(CliError::usage(anyhow::anyhow!("{where_}: field \"token_ids\": empty")));
        }
        seqs.push(ids);
    }
    let mut out = std::io::stdout().lock();
    for chunk in seqs.chunks(a.batch.max(1)) {
        for lp in model.score(chunk)? {
            writeln!(out, "{}", json!({ "logprobs": lp }))?;
        }
    }
    Ok(())
}

/// Arguments of `launcher render`.
#[derive(Args)]
pub struct RenderArgs {
    /// Model directory (tokenizer.json + chat template).
    #[arg(long)]
    model: PathBuf,
    /// JSON file: {"messages": [...], "tools": [...], "add_generation_prompt": bool} (or - for stdin).
    #[arg(long)]
    input: PathBuf,
}

/// `launcher render`.
pub fn render(a: RenderArgs) -> CliResult {
    let text = read_input(&a.input)?;
    let req: Value = serde_json::from_str(&text).usage(format!("{}: not valid JSON", a.input.display()))?;
    let messages = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| CliError::usage(anyhow::anyhow!("{}: field \"messages\": expected an array", a.input.display())))?;
    for (i, m) in messages.iter().enumerate() {
        if m.get("role").and_then(Value::as_str).is_none() {
            return Err(CliError::usage(anyhow::anyhow!("{}: field \"messages[{i}].role\": expected a string", a.input.display())));
        }
    }
    let tools = match req.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(t)) => Some(t.as_slice()),
        Some(_) => return Err(CliError::usage(anyhow::anyhow!("{}: field \"tools\": expected an array", a.input.display()))),
    };
    let add = req.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(false);
    let tok = rlmesh_model::Tokenizer::load(&a.model).usage("loading the tokenizer")?;
    let (text, ids) = tok.render_ids(messages, tools, add).usage("rendering the chat template")?;
    println!("{}", json!({"text": text, "token_ids": ids}));
    Ok(())
}

/// Arguments of `launcher advantages`.
#[derive(Args)]
pub struct AdvantagesArgs {
    /// JSON file with estimator, params and groups (or - for stdin).
    #[arg(long)]
    input: PathBuf,
}

/// `launcher advantages`.
pub fn advantages(a: AdvantagesArgs) -> CliResult {
    let text = read_input(&a.input)?;
    let v: Value = serde_json::from_str(&text).usage(format!("{}: not valid JSON", a.input.display()))?;
    let out = rlmesh_core::offline::advantages_json(&v).usage(a.input.display())?;
    println!("{out}");
    Ok(())
}

/// Arguments of `launcher reward`.
#[derive(Args)]
pub struct RewardArgs {
    /// JSONL file, one scoring request per line (or - for stdin).
    #[arg(long)]
    input: PathBuf,
}

/// `launcher reward`.
pub fn reward(a: RewardArgs) -> CliResult {
    let text = read_input(&a.input)?;
    let mut out = std::io::stdout().lock();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v = rlmesh_core::offline::reward_json_line(line).usage(format!("{}:{}", a.input.display(), i + 1))?;
        writeln!(out, "{v}")?;
    }
    Ok(())
}
