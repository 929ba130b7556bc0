//! What the learner trains on: plain, serialisable data, turned into padded
//! tensors one micro-batch at a time.
//!
//! Every per-token array is aligned with `token_ids` (element `i` belongs to
//! token `i`, predicted from tokens `..i`); token 0 is never predicted, so its
//! loss mask must be 0.
use super::error::{LearnerError, Result};
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

/// One sequence for a policy-gradient step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainSequence {
    /// Prompt + response token ids.
    pub token_ids: Vec<u32>,
    /// 1 where the policy generated the token (trained), 0 elsewhere.
    pub loss_mask: Vec<u8>,
    /// Advantage of every token.
    pub advantages: Vec<f32>,
    /// Behaviour log-prob of every token (recorded at generation).
    pub behaviour_logprobs: Vec<f32>,
    /// Reference-policy log-probs (computed by the learner's reference model when absent).
    #[serde(default)]
    pub ref_logprobs: Option<Vec<f32>>,
    /// Value-head outputs at rollout time (for the value clip).
    #[serde(default)]
    pub values: Option<Vec<f32>>,
    /// Value targets (GAE returns).
    #[serde(default)]
    pub returns: Option<Vec<f32>>,
    /// Per-token rewards (StepTool: each step's reward on the last token of its
    /// action): a learner with `gae` turns them into advantages, values and returns.
    #[serde(default)]
    pub rewards: Option<Vec<f32>>,
}

/// A batch for [`super::Learner::train_step`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainBatch {
    /// The sequences.
    pub sequences: Vec<TrainSequence>,
}

/// One sequence for supervised fine-tuning: cross-entropy on the masked tokens.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SftSequence {
    /// Token ids.
    pub token_ids: Vec<u32>,
    /// 1 on the tokens to learn.
    pub loss_mask: Vec<u8>,
}

/// A batch for [`super::Learner::sft_step`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SftBatch {
    /// The sequences.
    pub sequences: Vec<SftSequence>,
}

/// The share of rank `rank` of `world`: sequences `rank, rank + world, …`.
pub fn shard<T: Clone>(items: &[T], rank: usize, world: usize) -> Vec<T> {
    items.iter().skip(rank).step_by(world.max(1)).cloned().collect()
}

impl TrainBatch {
    /// The share of rank `rank` of `world` data-parallel ranks.
    pub fn shard(&self, rank: usize, world: usize) -> TrainBatch {
        TrainBatch { sequences: shard(&self.sequences, rank, world) }
    }

    /// Checks lengths, the mask and token ids (`vocab`), naming the sequence and field.
    pub fn validate(&self, vocab: i64, needs_returns: bool) -> Result<()> {
        for (i, s) in self.sequences.iter().enumerate() {
            check_tokens(i, &s.token_ids, &s.loss_mask, vocab)?;
            let n = s.token_ids.len();
            check_len(i, "advantages", n, s.advantages.len())?;
            check_len(i, "behaviour_logprobs", n, s.behaviour_logprobs.len())?;
            for (field, v) in [("ref_logprobs", &s.ref_logprobs), ("values", &s.values), ("returns", &s.returns), ("rewards", &s.rewards)] {
                if let Some(v) = v {
                    check_len(i, field, n, v.len())?;
                }
            }
            if needs_returns {
                for (field, v) in [("values", &s.values), ("returns", &s.returns)] {
                    if v.is_none() {
                        return Err(LearnerError::Batch { index: i, field, message: "required by the value loss, missing".into() });
                    }
                }
            }
            let finite = |v: &[f32]| v.iter().zip(&s.loss_mask).all(|(x, &m)| m == 0 || x.is_finite());
            if !finite(&s.advantages) {
                return Err(LearnerError::Batch { index: i, field: "advantages", message: "non-finite value under the loss mask".into() });
            }
            if !finite(&s.behaviour_logprobs) {
                return Err(LearnerError::Batch { index: i, field: "behaviour_logprobs", message: "non-finite value under the loss mask".into() });
            }
        }
        Ok(())
    }
}

impl SftBatch {
    /// The share of rank `rank` of `world` data-parallel ranks.
    pub fn shard(&self, rank: usize, world: usize) -> SftBatch {
        SftBatch { sequences: shard(&self.sequences, rank, world) }
    }

    /// Checks lengths, the mask and token ids (`vocab`).
    pub fn validate(&self, vocab: i64) -> Result<()> {
        self.sequences.iter().enumerate().try_for_each(|(i, s)| check_tokens(i, &s.token_ids, &s.loss_mask, vocab))
    }
}

fn check_len(index: usize, field: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        return Ok(());
    }
    Err(LearnerError::Batch { index, field, message: format!("{got} values for {expected} tokens") })
}

fn check_tokens(index: usize, ids: &[u32], mask: &[u8], vocab: i64) -> Result<()> {
    if ids.len() < 2 {
        return Err(LearnerError::Batch { index, field: "token_ids", message: format!("{} tokens; at least 2 are needed", ids.len()) });
    }
    check_len(index, "loss_mask", ids.len(), mask.len())?;
    if mask[0] != 0 {
        return Err(LearnerError::Batch { index, field: "loss_mask", message: "token 0 has no prediction and must have mask 0".into() });
    }
    if let Some(m) = mask.iter().find(|&&m| m > 1) {
        return Err(LearnerError::Batch { index, field: "loss_mask", message: format!("value {m}; expected 0 or 1") });
    }
    if let Some(t) = ids.iter().find(|&&t| t as i64 >= vocab) {
        return Err(LearnerError::Batch { index, field: "token_ids", message: format!("id {t} is outside the vocabulary of {vocab}") });
    }
    Ok(())
}

/// A padded micro-batch: ids and validity `[B, T]`, per-token arrays shifted to `[B, T−1]`.
pub(crate) struct MicroBatch {
    pub ids: Tensor,
    pub valid: Tensor,
    /// Loss mask of the predicted tokens `[B, T−1]` (float).
    pub mask: Tensor,
    pub advantages: Option<Tensor>,
    pub behaviour: Option<Tensor>,
    pub ref_logprobs: Option<Tensor>,
    pub values: Option<Tensor>,
    pub returns: Option<Tensor>,
    /// Tokens in the micro-batch (all positions, not only masked ones).
    pub tokens: usize,
    /// Rows holding several sequences end to end: the lengths of each row's sequences.
    pub packing: Option<Vec<Vec<usize>>>,
}

/// Sequences `idx` (of lengths `len(i)`) packed first-fit, longest first, into rows as
/// long as the longest of them: each row lists its sequences in order.
pub(crate) fn pack(idx: &[usize], len: impl Fn(usize) -> usize) -> Vec<Vec<usize>> {
    let mut order = idx.to_vec();
    order.sort_by_key(|&i| std::cmp::Reverse(len(i)));
    let cap = order.first().map_or(0, |&i| len(i));
    let mut rows: Vec<(usize, Vec<usize>)> = vec![];
    for i in order {
        match rows.iter_mut().find(|(used, _)| used + len(i) <= cap) {
            Some((used, row)) => {
                *used += len(i);
                row.push(i);
            }
            None => rows.push((len(i), vec![i])),
        }
    }
    rows.into_iter().map(|(_, row)| row).collect()
}

/// Pads rows of ids (and row-aligned token arrays) to the longest row.
pub(crate) struct Padder {
    t: usize,
    b: usize,
    device: Device,
}

impl Padder {
    pub(crate) fn new(lens: impl Iterator<Item = usize>, device: Device) -> Self {
        let lens: Vec<usize> = lens.collect();
        Padder { t: lens.iter().copied().max().unwrap_or(2).max(2), b: lens.len(), device }
    }

    /// `[B, T]` int64 ids and bool validity.
    pub(crate) fn ids<'a>(&self, rows: impl Iterator<Item = &'a [u32]>) -> (Tensor, Tensor) {
        let mut ids = vec![0i64; self.b * self.t];
        let mut valid = vec![false; self.b * self.t];
        for (r, row) in rows.enumerate() {
            for (j, &x) in row.iter().enumerate() {
                ids[r * self.t + j] = x as i64;
                valid[r * self.t + j] = true;
            }
        }
        let shape = [self.b as i64, self.t as i64];
        (Tensor::from_slice(&ids).view(shape).to_device(self.device), Tensor::from_slice(&valid).view(shape).to_device(self.device))
    }

    /// Per-token values of tokens `1..n` as a `[B, T−1]` float tensor (0 on padding).
    pub(crate) fn shifted<'a, X: Copy + Into<f64> + 'a>(&self, rows: impl Iterator<Item = &'a [X]>) -> Tensor {
        let w = self.t - 1;
        let mut out = vec![0f32; self.b * w];
        for (r, row) in rows.enumerate() {
            for (j, &x) in row.iter().enumerate().skip(1) {
                out[r * w + j - 1] = x.into() as f32;
            }
        }
        Tensor::from_slice(&out).view([self.b as i64, w as i64]).to_device(self.device)
    }
}

impl MicroBatch {
    /// The micro-batch of SFT sequences in `rows` (sequence indices): `packed`, rows hold
    /// several sequences ([`pack`]) under a block-diagonal mask; else one sequence each,
    /// right-padded. A sequence's first token is never a target (in a packed row the
    /// position before it belongs to another sequence).
    pub(crate) fn sft(batch: &SftBatch, rows: &[Vec<usize>], packed: bool, device: Device) -> MicroBatch {
        let rows: Vec<Vec<&SftSequence>> = rows.iter().map(|row| row.iter().map(|&i| &batch.sequences[i]).collect()).collect();
        let flat_ids: Vec<Vec<u32>> = rows.iter().map(|row| row.iter().flat_map(|s| s.token_ids.iter().copied()).collect()).collect();
        let flat_mask: Vec<Vec<u8>> =
            rows.iter().map(|row| row.iter().flat_map(|s| s.loss_mask.iter().enumerate().map(|(j, &m)| if j == 0 { 0 } else { m })).collect()).collect();
        let p = Padder::new(flat_ids.iter().map(Vec::len), device);
        let (ids, valid) = p.ids(flat_ids.iter().map(Vec::as_slice));
        MicroBatch {
            ids,
            valid,
            mask: p.shifted(flat_mask.iter().map(Vec::as_slice)),
            advantages: None,
            behaviour: None,
            ref_logprobs: None,
            values: None,
            returns: None,
            tokens: flat_ids.iter().map(Vec::len).sum(),
            packing: packed.then(|| rows.iter().map(|row| row.iter().map(|s| s.token_ids.len()).collect()).collect()),
        }
    }

    /// The micro-batch of policy-gradient sequences `idx`.
    pub(crate) fn train(batch: &TrainBatch, idx: &[usize], device: Device) -> MicroBatch {
        let rows = || idx.iter().map(|&i| &batch.sequences[i]);
        let p = Padder::new(rows().map(|s| s.token_ids.len()), device);
        let (ids, valid) = p.ids(rows().map(|s| s.token_ids.as_slice()));
        let optional = |get: fn(&TrainSequence) -> &Option<Vec<f32>>| {
            rows().all(|s| get(s).is_some()).then(|| p.shifted(rows().map(|s| get(s).as_deref().expect("checked"))))
        };
        MicroBatch {
            ids,
            valid,
            mask: p.shifted(rows().map(|s| s.loss_mask.as_slice())),
            advantages: Some(p.shifted(rows().map(|s| s.advantages.as_slice()))),
            behaviour: Some(p.shifted(rows().map(|s| s.behaviour_logprobs.as_slice()))),
            ref_logprobs: optional(|s| &s.ref_logprobs),
            values: optional(|s| &s.values),
            returns: optional(|s| &s.returns),
            tokens: rows().map(|s| s.token_ids.len()).sum(),
            packing: None,
        }
    }

}
