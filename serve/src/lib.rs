//! # rlmesh-serve — an OpenAI-compatible endpoint on the generation engine
//!
//! The same engine that samples rollouts answers HTTP: `launcher serve` puts a
//! checkpoint behind the API every OpenAI client speaks, and in training each
//! rollout process serves its agent programs through it, so an agent's calls
//! are recorded with the exact token ids, log-probs and policy version that
//! were sampled (nothing is re-tokenized). Like `rlmesh-mesh`, it is a
//! transport: it knows nothing about RL.
//!
//! - [`engine`] is the small interface to a generation engine ([`engine::Engine`])
//!   and the one on a local model ([`engine::ModelEngine`]).
//! - [`batcher`] turns concurrent requests into batched engine calls on the
//!   engine's own thread.
//! - [`wire`] defines the requests; [`chat`] maps messages to the chat template
//!   and completions back to OpenAI's choices (tool calls parsed by the model's
//!   tool format); [`stream`] writes server-sent events.
//! - [`server`] is the axum server: routes, keys, limits, `/health`, `/metrics`;
//!   [`error`] the OpenAI-shaped errors; [`sessions`] the per-rollout keys and
//!   call records of agent programs; [`agent`] the per-rollout session table
//!   and the agent program's process (environment, stdin, timeout, group kill).
//!
//! ```no_run
//! # async fn f(tokenizer: std::sync::Arc<rlmesh_model::Tokenizer>) -> std::io::Result<()> {
//! use rlmesh_serve::{batcher::{BatchPolicy, Batcher}, engine::ModelEngine, server::{Endpoint, ServeConfig}};
//! let tk = tokenizer.clone();
//! let batcher = Batcher::spawn(move || ModelEngine::load("model-dir".as_ref(), tch::Device::Cpu, tk), BatchPolicy::default(), None);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let endpoint = Endpoint::start(listener, ServeConfig::default(), tokenizer, batcher)?;
//! println!("OPENAI_BASE_URL={}", endpoint.base_url());
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod agent;
pub mod batcher;
pub mod chat;
mod complete;
pub mod engine;
pub mod error;
pub mod sessions;
pub mod server;
pub mod stream;
pub mod wire;

pub use error::ApiError;
pub use server::{Endpoint, ServeConfig, ServeMetrics};
