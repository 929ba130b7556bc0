//! The KV cache kept between `generate` calls: a multi-turn rollout's
//! keys and values across its turns.
//!
//! A tool loop calls the engine once per turn with each rollout's whole
//! conversation so far. [`Transformer::generate_kept`] takes, for every row,
//! the [`KeptKv`] the row's previous call left it. Where that covers a prefix
//! of the row's prompt (the previous turn's prompt and generated tokens,
//! which the tool result and the template glue extend), only the tokens after
//! it are prefilled and the row's earlier keys and values are copied into the
//! batch's cache; rows without one are prefilled as `generate` does them,
//! identical prompts once. Afterwards each row keeps what this call computed:
//! its prompt and its new tokens but the last (which was sampled, never fed).
//!
//! Kept keys and values are tagged with the policy version that computed
//! them. [`OnUpdate`] says whether a row may continue from keys and values of
//! another version than the model's (`Keep`: cheaper, the context was read by
//! an older policy) or is prefilled again (`Recompute`: every key and value of
//! a turn is the current policy's).
//!
//! [`PrefillTokens`] counts the tokens each call prefilled: `new` ones, seen
//! for the first time, and `recomputed` ones, whose keys and values had been
//! computed before for the same row (what the per-turn path pays each turn).
use crate::cache::KvCache;
use crate::error::{ModelError, Result};
use crate::fused::DecodeEngine;
use crate::generate::{Completion, DecodeStart, FinishReason, SamplingParams};
use crate::tokenizer::Tokenizer;
use crate::transformer::{causal_mask, positions_from_valid, Batch, Transformer};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use tch::{Kind, Tensor};

/// One row's keys and values after a call, with the tokens they cover.
pub struct KeptKv {
    tokens: Vec<u32>,
    /// Per layer, `[1, kv_heads, tokens, head_dim]`.
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    version: u64,
}

impl KeptKv {
    /// The tokens whose keys and values are held, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The policy version that computed them.
    pub fn version(&self) -> u64 {
        self.version
    }
}

/// What a row does with kept keys and values of another policy version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUpdate {
    /// Continue from them.
    #[default]
    Keep,
    /// Prefill the row again with the current weights.
    Recompute,
}

/// Tokens prefilled, by whether their keys and values had been computed before for the same row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefillTokens {
    /// Seen for the first time.
    pub new: usize,
    /// Computed before, and computed again.
    pub recomputed: usize,
}

impl PrefillTokens {
    /// A row of `prompt` tokens whose first `before` had been computed in an
    /// earlier call, and whose first `reused` are continued from then.
    pub fn of(prompt: usize, before: usize, reused: usize) -> PrefillTokens {
        let prefilled = prompt - reused.min(prompt);
        let recomputed = before.min(prompt).saturating_sub(reused).min(prefilled);
        PrefillTokens { new: prefilled - recomputed, recomputed }
    }

    /// Both counts added.
    pub fn add(&mut self, other: PrefillTokens) {
        self.new += other.new;
        self.recomputed += other.recomputed;
    }
}

/// How many leading tokens two sequences share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The leading tokens of `prompt` a row continues from `kept` (all of them
/// when they are a prefix of it, never its last token, whose logits are
/// needed), or 0 (another version under [`OnUpdate::Recompute`], or a prompt
/// that does not extend them).
pub fn reusable(kept: &KeptKv, prompt: &[u32], version: u64, on_update: OnUpdate) -> usize {
    let same = kept.version == version || on_update == OnUpdate::Keep;
    match same && prompt.starts_with(&kept.tokens) {
        true => kept.tokens.len().min(prompt.len().saturating_sub(1)),
        false => 0,
    }
}

impl Transformer {
    /// [`generate`](Transformer::generate), each row continuing from its kept
    /// keys and values where its prompt extends them (see the module), and
    /// leaving in `kept` what this call computed, tagged with `version`.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_kept(
        &self,
        prompts: &[Vec<u32>],
        kept: &mut [Option<KeptKv>],
        version: u64,
        on_update: OnUpdate,
        params: &SamplingParams,
        tokenizer: Option<&Tokenizer>,
        engine: DecodeEngine,
    ) -> Result<(Vec<Completion>, PrefillTokens)> {
        if kept.len() != prompts.len() {
            return Err(ModelError::Input(format!("{} prompts and {} kept caches", prompts.len(), kept.len())));
        }
        let mut counts = PrefillTokens::default();
        if prompts.is_empty() {
            return Ok((vec![], counts));
        }
        let (longest, max_new) = self.check_request(prompts, params, tokenizer)?;
        if max_new == 0 {
            return Ok((prompts.iter().map(|_| Completion { tokens: vec![], logprobs: vec![], finish: FinishReason::Length }).collect(), counts));
        }
        let reuse: Vec<usize> = prompts.iter().zip(kept.iter()).map(|(p, k)| k.as_ref().map_or(0, |k| reusable(k, p, version, on_update))).collect();
        let before: Vec<usize> = prompts.iter().zip(kept.iter()).map(|(p, k)| k.as_ref().map_or(0, |k| common_prefix(&k.tokens, p))).collect();
        // The sampler's generator, seeded as `generate` seeds it.
        let mut rng = params.seed ^ 0x2545_F491_4F6C_DD1D;
        let (device, c, b) = (self.device(), &self.config, prompts.len());
        tch::no_grad(|| -> Result<(Vec<Completion>, PrefillTokens)> {
            // Rows with nothing to continue from: prefilled together, identical prompts once.
            let mut unique: Vec<&Vec<u32>> = vec![];
            let mut first: HashMap<&Vec<u32>, i64> = HashMap::new();
            let mut row_unique = vec![-1i64; b];
            for i in (0..b).filter(|&i| reuse[i] == 0) {
                let p = &prompts[i];
                row_unique[i] = *first.entry(p).or_insert_with(|| {
                    unique.push(p);
                    if before[i] == 0 {
                        counts.add(PrefillTokens::of(p.len(), 0, 0));
                    }
                    unique.len() as i64 - 1
                });
                if before[i] > 0 {
                    counts.add(PrefillTokens::of(p.len(), before[i], 0));
                }
            }
            let fresh = match unique.is_empty() {
                true => None,
                false => Some(self.prefill_fresh(&unique)?),
            };
            let mut cache = KvCache::new(c.num_layers as usize, b as i64, c.num_kv_heads, longest + max_new, c.head_dim, self.kind(), device);
            let mut logits = Vec::with_capacity(b);
            for i in 0..b {
                let (len, at) = (prompts[i].len(), longest - prompts[i].len());
                match (reuse[i], &fresh) {
                    (0, Some((fcache, flogits, width))) => {
                        let u = row_unique[i];
                        let (k, v) = fcache.copy_row(u, width - len, len);
                        cache.write_row(i as i64, at, len, &k, &v);
                        logits.push(flogits.narrow(0, u, 1));
                    }
                    (r, _) => {
                        let k = kept[i].as_ref().expect("a row reusing keys and values has them");
                        counts.add(PrefillTokens::of(len, before[i], r));
                        let (own, row_logits) = self.prefill_after(k, r, &prompts[i])?;
                        let (k, v) = own.copy_row(0, 0, len);
                        cache.write_row(i as i64, at, len, &k, &v);
                        logits.push(row_logits);
                    }
                }
            }
            drop(fresh);
            cache.set_len(longest);
            let valid: Vec<bool> = prompts.iter().flat_map(|p| (0..longest).map(move |s| s >= longest - p.len())).collect();
            let valid = Tensor::from_slice(&valid).view([b as i64, longest as i64]).to_device(device);
            let last: Vec<i64> = prompts.iter().map(|p| p.len() as i64 - 1).collect();
            let start = DecodeStart {
                cache,
                logits: Tensor::cat(&logits, 0),
                valid,
                padded: prompts.iter().any(|p| p.len() < longest),
                positions: Tensor::from_slice(&last).view([b as i64, 1]).to_device(device),
                width: longest,
                max_new,
            };
            let (results, cache) = self.decode(start, params, tokenizer, engine, &mut rng)?;
            for (i, (r, slot)) in results.iter().zip(kept.iter_mut()).enumerate() {
                let fed = r.tokens.len().saturating_sub(1);
                let len = prompts[i].len();
                let (keys, values) = cache.copy_row(i as i64, longest - len, len + fed);
                let tokens = prompts[i].iter().chain(&r.tokens[..fed]).copied().collect();
                *slot = Some(KeptKv { tokens, keys, values, version });
            }
            Ok((results, counts))
        })
    }

    /// Prefills distinct prompts together (left-padded, as `generate` does):
    /// their cache, the logits of each one's last token, and the padded width.
    fn prefill_fresh(&self, unique: &[&Vec<u32>]) -> Result<(KvCache, Tensor, usize)> {
        let (c, device) = (&self.config, self.device());
        let width = unique.iter().map(|p| p.len()).max().unwrap_or(0);
        let (ids, valid) = crate::generate::left_pad(unique, width, device);
        let mut cache = KvCache::new(c.num_layers as usize, unique.len() as i64, c.num_kv_heads, width, c.head_dim, self.kind(), device);
        let padded = unique.iter().any(|p| p.len() < width);
        let batch = Batch { ids, positions: positions_from_valid(&valid), mask: if padded { causal_mask(&valid) } else { Tensor::new() } };
        let hidden = self.hidden_states(&batch, Some(&mut cache))?;
        let logits = hidden.narrow(1, width as i64 - 1, 1).squeeze_dim(1).linear::<Tensor>(self.lm_head(), None);
        Ok((cache, logits, width))
    }

    /// One row continued from its kept keys and values: its first `reused`
    /// tokens' slots copied in, the rest of `prompt` prefilled after them; the
    /// row's cache (`prompt.len()` slots) and its last token's logits `[1, V]`.
    fn prefill_after(&self, kept: &KeptKv, reused: usize, prompt: &[u32]) -> Result<(KvCache, Tensor)> {
        let (c, device) = (&self.config, self.device());
        let mut own = KvCache::new(c.num_layers as usize, 1, c.num_kv_heads, prompt.len(), c.head_dim, self.kind(), device);
        own.write_row(0, 0, reused, &kept.keys, &kept.values);
        own.set_len(reused);
        let rest: Vec<i64> = prompt[reused..].iter().map(|&t| t as i64).collect();
        let n = rest.len() as i64;
        let ids = Tensor::from_slice(&rest).view([1, n]).to_device(device);
        let positions = Tensor::arange_start(reused as i64, prompt.len() as i64, (Kind::Int64, device)).view([1, n]);
        let hidden = self.hidden_states(&Batch { ids, positions, mask: Tensor::new() }, Some(&mut own))?;
        let logits = hidden.narrow(1, n - 1, 1).squeeze_dim(1).linear::<Tensor>(self.lm_head(), None);
        Ok((own, logits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_counts_split_new_from_recomputed() {
        // Turn 1: a 10-token prompt, nothing before.
        assert_eq!(PrefillTokens::of(10, 0, 0), PrefillTokens { new: 10, recomputed: 0 });
        // Turn 2 of the per-turn path: 10 + 5 generated (4 fed) + 6 of tool result, all prefilled again.
        assert_eq!(PrefillTokens::of(21, 14, 0), PrefillTokens { new: 7, recomputed: 14 });
        // The same turn continued from the kept 14.
        assert_eq!(PrefillTokens::of(21, 14, 14), PrefillTokens { new: 7, recomputed: 0 });
        // A prompt wholly kept: its last token is fed again for its logits.
        assert_eq!(PrefillTokens::of(8, 8, 7), PrefillTokens { new: 0, recomputed: 1 });
    }

    #[test]
    fn only_a_kept_prefix_of_the_prompt_is_reused_and_never_its_last_token() {
        let kept = |tokens: Vec<u32>, version| KeptKv { tokens, keys: vec![], values: vec![], version };
        let k = kept(vec![1, 2, 3], 4);
        assert_eq!(reusable(&k, &[1, 2, 3, 9, 9], 4, OnUpdate::Recompute), 3);
        assert_eq!(reusable(&k, &[1, 2, 3], 4, OnUpdate::Keep), 2);
        assert_eq!(reusable(&k, &[1, 2, 4, 9], 4, OnUpdate::Keep), 0, "a prompt that departs from the kept tokens");
        assert_eq!(reusable(&k, &[1, 2, 3, 9], 5, OnUpdate::Keep), 3, "keep: an older version's keys serve");
        assert_eq!(reusable(&k, &[1, 2, 3, 9], 5, OnUpdate::Recompute), 0, "recompute: never across versions");
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
    }
}
