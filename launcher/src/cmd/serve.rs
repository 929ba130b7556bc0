//! `launcher serve`: an OpenAI-compatible endpoint on a model directory (rlmesh-serve).
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_actors::controller::init::TOOL_TEMPLATE;
use rlmesh_actors::metrics::Metrics;
use rlmesh_core::tools::formats::ToolFormat;
use rlmesh_model::Tokenizer;
use rlmesh_serve::batcher::{BatchPolicy, Batcher};
use rlmesh_serve::engine::ModelEngine;
use rlmesh_serve::sessions::Auth;
use rlmesh_serve::{Endpoint, ServeConfig, ServeMetrics};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `launcher serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Model directory (Hugging Face layout; a run's `checkpoints/latest/` works).
    #[arg(long)]
    model: PathBuf,
    /// Address to listen on (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: String,
    /// Where the model runs: cpu or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// A chat template file replacing the model's own (default: the model's, or
    /// rlmesh's Qwen2.5-style tool template when the model's renders no tools).
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// How the model writes tool calls: hermes, llama3_json or mistral.
    #[arg(long, default_value = "hermes")]
    tool_format: String,
    /// The model's id in /v1/models and requests (default: --model as given).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` (default: open).
    #[arg(long)]
    api_key: Option<String>,
    /// Most requests in flight; more are refused with 429.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    max_in_flight: u64,
    /// Largest request body in bytes; larger ones are refused with 413.
    #[arg(long, default_value_t = 2 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    max_request_bytes: u64,
    /// Milliseconds a request waits for others to share its batch.
    #[arg(long, default_value_t = 2)]
    batch_wait_ms: u64,
    /// Most rows (samples) in one engine call.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    max_batch_rows: u64,
    /// Intra-op threads of the engine (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// `launcher serve`.
pub fn run(a: ServeArgs) -> CliResult {
    let device = parse_device(&a.device)?;
    let format = ToolFormat::ALL
        .into_iter()
        .find(|f| f.name() == a.tool_format)
        .ok_or_else(|| CliError::usage(anyhow::anyhow!("--tool-format {}: expected one of hermes, llama3_json, mistral", a.tool_format)))?;
    let mut tokenizer = Tokenizer::load(&a.model).usage("--model: loading the tokenizer")?;
    match &a.chat_template {
        Some(path) => tokenizer.set_chat_template(std::fs::read_to_string(path).usage(format!("--chat-template {}", path.display()))?),
        None if !renders_tools(&tokenizer) => {
            eprintln!("note: {} has no chat template that renders tools; using rlmesh's tool template (Qwen2.5 style)", a.model.display());
            tokenizer.set_chat_template(TOOL_TEMPLATE);
        }
        None => {}
    }
    if tokenizer.stop_token_ids().is_empty() {
        return Err(CliError::usage(anyhow::anyhow!("--model {}: the tokenizer names no end-of-sequence token, so no completion could stop", a.model.display())));
    }
    let tokenizer = Arc::new(tokenizer);
    let name = a.served_model_name.clone().unwrap_or_else(|| a.model.display().to_string());
    let aliases: Vec<String> = [a.model.file_name().map(|f| f.to_string_lossy().into_owned()), std::fs::canonicalize(&a.model).ok().map(|p| p.display().to_string())]
        .into_iter()
        .flatten()
        .filter(|x| *x != name)
        .collect();
    let metrics = Metrics::new();
    let encoder = metrics.clone();
    let serve_metrics = ServeMetrics {
        requests: metrics.serve_requests_total.clone(),
        seconds: metrics.serve_request_seconds.clone(),
        batch_rows: metrics.serve_batch_rows.clone(),
        encode: Arc::new(move || encoder.encode()),
    };
    let config = ServeConfig {
        model_name: name.clone(),
        aliases,
        any_model: false,
        tool_format: format,
        auth: a.api_key.clone().filter(|k| !k.is_empty()).map_or(Auth::Open, Auth::Key),
        max_body_bytes: usize::try_from(a.max_request_bytes).unwrap_or(usize::MAX),
        max_in_flight: usize::try_from(a.max_in_flight).unwrap_or(usize::MAX),
        metrics: Some(serve_metrics),
    };
    let policy = BatchPolicy { wait: Duration::from_millis(a.batch_wait_ms), max_rows: usize::try_from(a.max_batch_rows).unwrap_or(usize::MAX) };
    let threads = super::bench::threads_or_all(a.threads);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&a.listen).await.usage(format!("--listen {}", a.listen))?;
        let (dir, tk) = (a.model.clone(), tokenizer.clone());
        let batch_rows = metrics.serve_batch_rows.clone();
        let batcher = Batcher::spawn(
            move || {
                tch::set_num_threads(threads as i32);
                ModelEngine::load(&dir, device, tk)
            },
            policy,
            Some(batch_rows),
        );
        let endpoint = Endpoint::start(listener, config, tokenizer, batcher)?;
        // One line a script can read: where it listens.
        println!("{}", json!({"listening": endpoint.local_addr().to_string(), "base_url": endpoint.base_url(), "model": name}));
        eprintln!("serving {name} at {} (loading the model…)", endpoint.base_url());
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut ready_said = false;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {
                    match endpoint.readiness() {
                        rlmesh_serve::batcher::Readiness::Ready { context } if !ready_said => {
                            eprintln!("ready: context {context} tokens");
                            ready_said = true;
                        }
                        rlmesh_serve::batcher::Readiness::Failed(why) => {
                            endpoint.shutdown().await;
                            return Err(CliError::usage(anyhow::anyhow!("--model {}: {why}", a.model.display())));
                        }
                        _ => {}
                    }
                }
            }
        }
        eprintln!("shutting down");
        endpoint.shutdown().await;
        Ok(())
    })
}

/// `cpu` or `cuda:N` (`cuda` alone: device 0).
fn parse_device(s: &str) -> CliResult<tch::Device> {
    match s {
        "cpu" => Ok(tch::Device::Cpu),
        _ => {
            let index = match s.strip_prefix("cuda") {
                Some("") => 0,
                Some(rest) => rest.strip_prefix(':').and_then(|n| n.parse::<usize>().ok()).ok_or_else(|| CliError::usage(anyhow::anyhow!("--device {s}: expected cpu or cuda:N")))?,
                None => return Err(CliError::usage(anyhow::anyhow!("--device {s}: expected cpu or cuda:N"))),
            };
            rlmesh_actors::device::torch_device(Some(index)).map_err(|e| CliError::usage(anyhow::anyhow!("--device {s}: {e}")))
        }
    }
}

/// Whether the tokenizer's template exists and renders the tools it is given.
fn renders_tools(tok: &Tokenizer) -> bool {
    let probe = [json!({"role": "user", "content": "hi"})];
    let tools = [json!({"type": "function", "function": {"name": "rlmesh_probe_lookup", "description": "probe", "parameters": {"type": "object", "properties": {}}}})];
    match (tok.render(&probe, None, true), tok.render(&probe, Some(&tools), true)) {
        (Ok(plain), Ok(with)) => with != plain && with.contains("rlmesh_probe_lookup"),
        _ => false,
    }
}
