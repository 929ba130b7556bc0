//! The endpoint's view of a generation engine: a small trait, so the engine
//! behind it can change (continuous batching, KV kept across turns) without
//! the endpoint changing.
//!
//! An [`Engine`] lives on one OS thread (the batcher's; tensor work never runs
//! on tokio workers) and answers two questions: continue these token prefixes
//! under these sampling parameters, and what were the most likely tokens at
//! each position of a sequence. [`ModelEngine`] is the one on a local
//! [`Transformer`]; a rollout actor supplies its own, so completions are served
//! at the policy version it holds.
use rlmesh_model::{Completion, SamplingParams, Tokenizer, Transformer};
use std::path::Path;
use std::sync::Arc;
use tch::{Device, Kind, Tensor};

/// The most likely tokens at one position: (token id, log-prob), best first.
pub type TopTokens = Vec<(u32, f32)>;

/// A batched generation engine, driven from one thread.
pub trait Engine: 'static {
    /// Continues every prompt in one batch (identical prompts may share their prefill).
    fn generate(&mut self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, String>;

    /// For each position `p` in `from..sequence.len()`: the `k` most likely tokens
    /// at `p` given `sequence[..p]`, under the distribution scaled by `temperature`
    /// (0: unscaled), as the sampled tokens' log-probs are.
    fn top_logprobs(&mut self, sequence: &[u32], from: usize, k: usize, temperature: f64) -> Result<Vec<TopTokens>, String>;

    /// The policy version that the next [`generate`](Engine::generate) samples from.
    fn version(&self) -> u64;

    /// The model's context in tokens (prompt and completion together).
    fn context(&self) -> usize;
}

/// An [`Engine`] on a [`Transformer`] this thread owns.
pub struct ModelEngine {
    model: Transformer,
    tokenizer: Arc<Tokenizer>,
    version: u64,
}

impl ModelEngine {
    /// Loads the weights of a model directory onto `device` (float32).
    pub fn load(dir: &Path, device: Device, tokenizer: Arc<Tokenizer>) -> Result<ModelEngine, String> {
        let model = Transformer::load(dir, device, Some(Kind::Float)).map_err(|e| format!("loading {}: {e}", dir.display()))?;
        Ok(ModelEngine::new(model, tokenizer, 0))
    }

    /// An engine on an already loaded model, serving `version`.
    pub fn new(model: Transformer, tokenizer: Arc<Tokenizer>, version: u64) -> ModelEngine {
        ModelEngine { model, tokenizer, version }
    }
}

impl Engine for ModelEngine {
    fn generate(&mut self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, String> {
        generate_on(&self.model, &self.tokenizer, prompts, params)
    }

    fn top_logprobs(&mut self, sequence: &[u32], from: usize, k: usize, temperature: f64) -> Result<Vec<TopTokens>, String> {
        top_logprobs_on(&self.model, sequence, from, k, temperature)
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn context(&self) -> usize {
        usize::try_from(self.model.config.max_position_embeddings).unwrap_or(usize::MAX)
    }
}

/// [`Engine::generate`] on a borrowed model (what a rollout actor's engine calls on its device thread).
pub fn generate_on(model: &Transformer, tokenizer: &Tokenizer, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, String> {
    model.generate(prompts, params, Some(tokenizer)).map_err(|e| e.to_string())
}

/// [`Engine::top_logprobs`] on a borrowed model: one forward pass over the sequence.
pub fn top_logprobs_on(model: &Transformer, sequence: &[u32], from: usize, k: usize, temperature: f64) -> Result<Vec<TopTokens>, String> {
    if from == 0 || from > sequence.len() {
        return Err(format!("top log-probs from position {from} of a sequence of {}", sequence.len()));
    }
    if from == sequence.len() || k == 0 {
        return Ok(vec![vec![]; sequence.len() - from]);
    }
    let run = || -> rlmesh_model::Result<Vec<TopTokens>> {
        let ids: Vec<i64> = sequence.iter().map(|&t| t as i64).collect();
        let ids = Tensor::from_slice(&ids).view([1, -1]).to_device(model.device());
        let logits = model.forward(&rlmesh_model::Batch::right_padded(&ids), None)?;
        // The logits at position p - 1 predict token p.
        let n = (sequence.len() - from) as i64;
        let mut logits = logits.narrow(1, from as i64 - 1, n).squeeze_dim(0).to_kind(Kind::Float);
        if temperature > 0.0 {
            logits /= temperature;
        }
        let logp = logits.log_softmax(-1, Kind::Float);
        let (values, indices) = logp.topk(k as i64, -1, true, true);
        let values = Vec::<f32>::try_from(values.to_device(Device::Cpu).contiguous().view([-1]))?;
        let indices = Vec::<i64>::try_from(indices.to_device(Device::Cpu).contiguous().view([-1]))?;
        Ok(values.chunks(k).zip(indices.chunks(k)).map(|(v, i)| i.iter().zip(v).map(|(&t, &lp)| (t as u32, lp)).collect()).collect())
    };
    tch::no_grad(run).map_err(|e| e.to_string())
}
