//! # rlmesh-model — the policy
//!
//! Every part of rlmesh runs the policy: rollout actors generate with it, the
//! learner trains it, the weight-sync actor moves it. This crate is that policy:
//! a decoder-only transformer covering the Qwen2 / Qwen2.5 and Llama (SmolLM2)
//! families, loaded from a Hugging Face directory (`config.json` +
//! safetensors), computing what transformers computes, and saved back in the
//! same format.
//!
//! - [`config`] reads `config.json`; [`io`] loads and saves weights.
//! - [`transformer::Transformer`] is the network (parameters in a tch `VarStore`
//!   under their Hugging Face names); [`score`] gives per-token log-probs;
//!   [`layout`] packs a learner's sequences, a group's shared prompt once.
//! - [`generate`] is the batched generation engine with a preallocated
//!   [`cache::KvCache`], seeded sampling, stop tokens and strings; on CPU its
//!   decode steps run in [`fused`], its output projection in [`packed`], and
//!   greedy picks in [`kernels`]; [`isa`] says which vector extensions those use;
//!   [`kept`] continues each row of a multi-turn rollout from the keys and
//!   values its previous call left, prefilling only its new tokens.
//! - [`tokenizer`] wraps `tokenizer.json` and renders the model's chat template
//!   with minijinja exactly as transformers' `apply_chat_template` does;
//!   [`template`] checks that a template can carry a tool-calling rollout.
#![warn(missing_docs)]

pub mod cache;
pub mod config;
pub mod error;
pub mod fused;
pub mod generate;
pub mod io;
pub mod isa;
pub mod kept;
pub mod kernels;
pub mod layout;
mod mkl;
pub mod packed;
pub mod score;
pub mod template;
pub mod tokenizer;
pub mod transformer;

pub use config::{Architecture, ModelConfig};
pub use error::{ModelError, Result};
pub use generate::{Completion, FinishReason, SamplingParams};
pub use kept::{KeptKv, OnUpdate, PrefillTokens};
pub use tokenizer::Tokenizer;
pub use transformer::{Batch, Transformer};
