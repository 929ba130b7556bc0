//! The generation engine: batched decoding with a preallocated KV cache.
//!
//! Prompts are left-padded into one batch; identical prompts (the G samples of
//! a group) are prefilled once and their cache rows shared. On CPU in float32
//! the decode steps run fused (`fused`) and the output projection in packed
//! vocabulary blocks (`packed`); elsewhere each step is libtorch's
//! `hidden_states`. Sampling happens on the tensor side (temperature, top-k,
//! top-p, seeded); greedy steps scan the logits in Rust (`kernels`). The log-prob
//! of every sampled token under the temperature-scaled distribution (the one the
//! learner recomputes) is recorded. Generation continues from any token prefix:
//! a caller that appends tool results simply passes the longer prefix.
use crate::cache::KvCache;
use crate::error::{ModelError, Result};
use crate::fused::{DecodeEngine, FusedDecoder};
use crate::packed::DecodeHead;
use crate::tokenizer::Tokenizer;
use crate::transformer::{causal_mask, positions_from_valid, Batch, Transformer};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// How to pick tokens and when to stop.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Most tokens generated per sequence.
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 means greedy.
    pub temperature: f64,
    /// Nucleus mass kept (1.0 = off).
    pub top_p: f64,
    /// Most likely tokens kept (0 = off).
    pub top_k: i64,
    /// Seed of the sampler.
    pub seed: u64,
    /// Token ids that end a sequence (kept in the output).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end a sequence once the decoded output contains them.
    pub stop_strings: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { max_new_tokens: 128, temperature: 1.0, top_p: 1.0, top_k: 0, seed: 0, stop_token_ids: vec![], stop_strings: vec![] }
    }
}

/// Why a sequence stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was generated.
    StopToken,
    /// A stop string appeared.
    StopString,
    /// `max_new_tokens` (or the context limit) was reached.
    Length,
}

/// One generated continuation.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// New token ids (the stop token included).
    pub tokens: Vec<u32>,
    /// Log-prob of each new token under the sampling distribution (before top-k/top-p truncation).
    pub logprobs: Vec<f32>,
    /// Why it stopped.
    pub finish: FinishReason,
}

impl Transformer {
    /// Generate a continuation of every prompt (a token prefix) in one batch.
    pub fn generate(&self, prompts: &[Vec<u32>], params: &SamplingParams, tokenizer: Option<&Tokenizer>) -> Result<Vec<Completion>> {
        self.generate_with(prompts, params, tokenizer, DecodeEngine::from_env())
    }

    /// [`generate`](Self::generate) with its decode steps on the given engine (on CPU; other
    /// devices always use libtorch's).
    pub fn generate_with(&self, prompts: &[Vec<u32>], params: &SamplingParams, tokenizer: Option<&Tokenizer>, engine: DecodeEngine) -> Result<Vec<Completion>> {
        if prompts.is_empty() {
            return Ok(vec![]);
        }
        let (longest, max_new) = self.check_request(prompts, params, tokenizer)?;
        if max_new == 0 {
            return Ok(prompts.iter().map(|_| Completion { tokens: vec![], logprobs: vec![], finish: FinishReason::Length }).collect());
        }
        let device = self.device();
        let b = prompts.len();
        // The sampler's own generator: deterministic for a seed whatever other threads do with libtorch's global one.
        let mut rng = params.seed ^ 0x2545_F491_4F6C_DD1D;
        tch::no_grad(|| -> Result<Vec<Completion>> {
            // Prefill each distinct prompt once, then share its cache rows.
            let mut unique: Vec<&Vec<u32>> = vec![];
            let mut first: HashMap<&Vec<u32>, i64> = HashMap::new();
            let row_of: Vec<i64> = prompts
                .iter()
                .map(|p| {
                    *first.entry(p).or_insert_with(|| {
                        unique.push(p);
                        unique.len() as i64 - 1
                    })
                })
                .collect();
            let (ids, valid) = left_pad(&unique, longest, device);
            let c = &self.config;
            let mut cache =
                KvCache::new(c.num_layers as usize, unique.len() as i64, c.num_kv_heads, longest + max_new, c.head_dim, self.kind(), device);
            let padded = unique.iter().any(|p| p.len() < longest);
            let batch = Batch { ids: ids.shallow_clone(), positions: positions_from_valid(&valid), mask: if padded { causal_mask(&valid) } else { Tensor::new() } };
            let hidden = self.hidden_states(&batch, Some(&mut cache))?;
            let logits_u = hidden.narrow(1, longest as i64 - 1, 1).squeeze_dim(1).linear::<Tensor>(self.lm_head(), None);
            let start = if unique.len() == b {
                let last = positions_from_valid(&valid).narrow(1, longest as i64 - 1, 1);
                DecodeStart { cache, logits: logits_u, valid, padded, positions: last, width: longest, max_new }
            } else {
                let index = Tensor::from_slice(&row_of).to_device(device);
                let v = valid.index_select(0, &index);
                let last = positions_from_valid(&v).narrow(1, longest as i64 - 1, 1);
                DecodeStart { cache: cache.select_rows(&index), logits: logits_u.index_select(0, &index), valid: v, padded, positions: last, width: longest, max_new }
            };
            Ok(self.decode(start, params, tokenizer, engine, &mut rng)?.0)
        })
    }

    /// Checks a request (ids in the vocabulary, no empty prompt, sampling
    /// parameters in range, a tokenizer for stop strings) and returns its
    /// longest prompt and the new tokens that fit the context after it.
    pub(crate) fn check_request(&self, prompts: &[Vec<u32>], params: &SamplingParams, tokenizer: Option<&Tokenizer>) -> Result<(usize, usize)> {
        for (i, p) in prompts.iter().enumerate() {
            if p.is_empty() {
                return Err(ModelError::Input(format!("prompt {i} is empty")));
            }
            self.check_ids(p)?;
        }
        if !params.stop_strings.is_empty() && tokenizer.is_none() {
            return Err(ModelError::Input("stop strings need a tokenizer".into()));
        }
        if params.temperature < 0.0 || !(0.0..=1.0).contains(&params.top_p) || params.top_p == 0.0 {
            return Err(ModelError::Input(format!("bad sampling parameters: temperature {} top_p {}", params.temperature, params.top_p)));
        }
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let limit = self.config.max_position_embeddings as usize;
        if longest >= limit {
            return Err(ModelError::Input(format!("prompt of {longest} tokens does not fit the context of {limit}")));
        }
        Ok((longest, params.max_new_tokens.min(limit - longest)))
    }

    /// The decode steps after a prefill: each row's tokens until its stop, and the cache they filled.
    pub(crate) fn decode(&self, start: DecodeStart, params: &SamplingParams, tokenizer: Option<&Tokenizer>, engine: DecodeEngine, rng: &mut u64) -> Result<(Vec<Completion>, KvCache)> {
        let DecodeStart { mut cache, logits, valid, padded, mut positions, width, max_new } = start;
        let device = self.device();
        let b = cache.batch();
        let mut results: Vec<Completion> = (0..b).map(|_| Completion { tokens: vec![], logprobs: vec![], finish: FinishReason::Length }).collect();
        // The fused decode step where the engine asks for it and it applies (see `fused`).
        let mut fused = if device == Device::Cpu && max_new > 1 && engine == DecodeEngine::Fused {
            FusedDecoder::new(self, &cache, padded.then_some(&valid))?
        } else {
            None
        };
        let mut positions_host = if fused.is_some() { Vec::<i64>::try_from(positions.view([-1]))? } else { vec![] };
        // Key slots a decode step may attend, built once: the prompt's padding is masked,
        // every generated slot is open (a finished row keeps decoding; its tokens are dropped).
        let slots = padded.then(|| Tensor::cat(&[valid, Tensor::ones([b as i64, max_new as i64], (Kind::Bool, device))], 1));
        // The output projection packed once for this call's decode steps where that is exact (see `packed`).
        let mut head = DecodeHead::new(self.lm_head(), b as i64, max_new);
        let mut done = vec![false; b];
        let stop_ids: Vec<u32> = params.stop_token_ids.clone();
        // What the next step picks from: the prefill's logits, then each step's hidden states.
        let mut hidden: Option<Tensor> = None;
        for step in 0..max_new {
            let (next_host, logp_host) = match &hidden {
                None => pick(&logits, params, rng)?,
                Some(h) => match (params.temperature == 0.0).then(|| head.greedy(h)).flatten() {
                    Some(picked) => picked,
                    None => pick(&head.logits(h), params, rng)?,
                },
            };
            for i in 0..b {
                if done[i] {
                    continue;
                }
                let tok = next_host[i] as u32;
                let r = &mut results[i];
                r.tokens.push(tok);
                r.logprobs.push(logp_host[i]);
                if stop_ids.contains(&tok) {
                    r.finish = FinishReason::StopToken;
                    done[i] = true;
                } else if let (Some(tk), false) = (tokenizer, params.stop_strings.is_empty()) {
                    let text = tk.decode(&r.tokens, false)?;
                    if params.stop_strings.iter().any(|s| text.contains(s.as_str())) {
                        r.finish = FinishReason::StopString;
                        done[i] = true;
                    }
                }
            }
            if step + 1 == max_new || done.iter().all(|&d| d) {
                break;
            }
            // Feed the sampled tokens.
            if let Some(fused) = fused.as_mut() {
                positions_host.iter_mut().for_each(|p| *p += 1);
                hidden = Some(fused.step(&next_host, &positions_host, &mut cache)?.shallow_clone());
                continue;
            }
            positions = &positions + 1;
            let s = (width + step + 1) as i64;
            let mask = slots.as_ref().map_or_else(Tensor::new, |m| m.narrow(1, 0, s).view([b as i64, 1, 1, s]));
            let next = Tensor::from_slice(&next_host).to_device(device);
            let batch = Batch { ids: next.unsqueeze(1), positions: positions.shallow_clone(), mask };
            hidden = Some(self.hidden_states(&batch, Some(&mut cache))?.squeeze_dim(1));
        }
        Ok((results, cache))
    }
}

/// Where the decode steps start: a filled cache (`width` slots, a row's tokens
/// ending at the last), the logits of each row's last token, which of the
/// `width` slots each row may attend, each row's last position (`[B, 1]`).
pub(crate) struct DecodeStart {
    pub(crate) cache: KvCache,
    pub(crate) logits: Tensor,
    pub(crate) valid: Tensor,
    /// Whether any slot of `valid` is padding.
    pub(crate) padded: bool,
    pub(crate) positions: Tensor,
    pub(crate) width: usize,
    pub(crate) max_new: usize,
}

/// Prompts left-padded to `width`: ids (0 on padding) and which slots are valid, `[B, width]` each.
pub(crate) fn left_pad(prompts: &[&Vec<u32>], width: usize, device: Device) -> (Tensor, Tensor) {
    let mut ids = vec![0i64; prompts.len() * width];
    let mut valid = vec![false; prompts.len() * width];
    for (i, p) in prompts.iter().enumerate() {
        let off = width - p.len();
        for (j, &tok) in p.iter().enumerate() {
            ids[i * width + off + j] = tok as i64;
            valid[i * width + off + j] = true;
        }
    }
    let shape = [prompts.len() as i64, width as i64];
    (Tensor::from_slice(&ids).view(shape).to_device(device), Tensor::from_slice(&valid).view(shape).to_device(device))
}

/// Next value of a splitmix64 generator.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// [`sample`] with the results on the host; greedy float32 CPU rows never leave it.
fn pick(logits: &Tensor, params: &SamplingParams, rng: &mut u64) -> Result<(Vec<i64>, Vec<f32>)> {
    if params.temperature == 0.0 {
        if let Some(host) = crate::kernels::greedy_rows(logits) {
            return Ok(host);
        }
    }
    let (next, logp) = sample(logits, params, rng)?;
    Ok((Vec::<i64>::try_from(&next)?, Vec::<f32>::try_from(&logp)?))
}

/// Pick the next token of every row from logits `[B, V]`; returns (tokens `[B]`, log-probs `[B]`).
///
/// Sampling is inverse-CDF on the tensor side with one uniform per row from `rng`
/// (splitmix64), so a seed gives the same tokens on any device and thread.
pub fn sample(logits: &Tensor, params: &SamplingParams, rng: &mut u64) -> Result<(Tensor, Tensor)> {
    let logits = logits.to_kind(Kind::Float);
    if params.temperature == 0.0 {
        if let Some((next, logp)) = crate::kernels::greedy_rows(&logits) {
            return Ok((Tensor::from_slice(&next).to_device(logits.device()), Tensor::from_slice(&logp).to_device(logits.device())));
        }
        let next = logits.argmax(-1, false);
        let logp = logits.log_softmax(-1, Kind::Float).gather(-1, &next.unsqueeze(-1), false).squeeze_dim(-1);
        return Ok((next, logp));
    }
    let scaled = logits / params.temperature;
    let logp_all = scaled.log_softmax(-1, Kind::Float);
    let mut filtered = scaled;
    let vocab = filtered.size()[1];
    if params.top_k > 0 && params.top_k < vocab {
        let (top, _) = filtered.topk(params.top_k, -1, true, true);
        let kth = top.narrow(1, params.top_k - 1, 1);
        filtered = filtered.masked_fill(&filtered.lt_tensor(&kth), f64::NEG_INFINITY);
    }
    if params.top_p < 1.0 {
        // As transformers' TopPLogitsWarper: drop the low tail whose mass is ≤ 1 − p, keep at least one token.
        let (sorted, idx) = filtered.sort(-1, false);
        let cum = sorted.softmax(-1, Kind::Float).cumsum(-1, Kind::Float);
        let remove_sorted = cum.le(1.0 - params.top_p);
        let remove_sorted = remove_sorted.index_fill(1, &Tensor::from(vocab - 1).to_device(filtered.device()), 0);
        let remove = remove_sorted.scatter(1, &idx, &remove_sorted);
        filtered = filtered.masked_fill(&remove, f64::NEG_INFINITY);
    }
    let probs = filtered.softmax(-1, Kind::Float);
    let b = probs.size()[0];
    // u in (0, 1), scaled by each row's total mass: the first token whose cumulative mass reaches it.
    let u: Vec<f32> = (0..b).map(|_| (((splitmix64(rng) >> 11) as f64 + 0.5) / (1u64 << 53) as f64) as f32).collect();
    let cum = probs.cumsum(-1, Kind::Float);
    let target = Tensor::from_slice(&u).to_device(probs.device()).unsqueeze(1) * cum.narrow(1, vocab - 1, 1);
    let next = cum.lt_tensor(&target).sum_dim_intlist(-1, false, Kind::Int64).clamp_max(vocab - 1);
    let logp = logp_all.gather(-1, &next.unsqueeze(-1), false).squeeze_dim(-1);
    Ok((next, logp))
}

/// Deterministic benchmark prompts (an LCG over ids `3..vocab`): `launcher bench generate`
/// and the GPU check use the same ones, so their figures line up.
pub fn bench_prompts(batch: usize, len: usize, vocab: u64, seed: u64) -> Vec<Vec<u32>> {
    let mut s = seed;
    (0..batch)
        .map(|_| {
            (0..len)
                .map(|_| {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (3 + (s >> 33) % (vocab - 3)) as u32
                })
                .collect()
        })
        .collect()
}
