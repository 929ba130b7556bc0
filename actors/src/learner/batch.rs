//! What the learner trains on: plain, serialisable data ([`super::micro`] lays
//! it out as tensors one micro-batch at a time).
//!
//! Every per-token array is aligned with `token_ids` (element `i` belongs to
//! token `i`, predicted from tokens `..i`); token 0 is never predicted, so its
//! loss mask must be 0.
use super::error::{LearnerError, Result};
use serde::{Deserialize, Serialize};

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
    /// The sequences, a group's members next to each other.
    pub sequences: Vec<TrainSequence>,
    /// How many consecutive sequences each group holds (the G rollouts of one
    /// prompt); empty: every sequence is a group of its own. A group's common
    /// prompt is forwarded once (`shared_prefix`), and a group stays on one
    /// data-parallel rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group_sizes: Vec<usize>,
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
    /// A batch of groups, in order.
    pub fn of_groups(groups: impl IntoIterator<Item = Vec<TrainSequence>>) -> TrainBatch {
        let mut batch = TrainBatch::default();
        for g in groups {
            batch.group_sizes.push(g.len());
            batch.sequences.extend(g);
        }
        batch
    }

    /// The sequence ranges of the groups (one per sequence without `group_sizes`).
    pub fn groups(&self) -> Vec<std::ops::Range<usize>> {
        if self.group_sizes.is_empty() {
            return (0..self.sequences.len()).map(|i| i..i + 1).collect();
        }
        let mut at = 0;
        self.group_sizes
            .iter()
            .map(|&n| {
                at += n;
                at - n..at
            })
            .collect()
    }

    /// The index of the group sequence `i` belongs to.
    pub fn group_of(&self, i: usize) -> usize {
        if self.group_sizes.is_empty() {
            return i;
        }
        let mut end = 0;
        self.group_sizes.iter().position(|&n| {
            end += n;
            i < end
        })
        .unwrap_or(self.group_sizes.len())
    }

    /// The share of rank `rank` of `world` data-parallel ranks: whole groups, each
    /// to the rank with the fewest tokens to compute so far (largest groups first,
    /// counting a group's shared prompt once), so ranks finish their steps together.
    pub fn shard(&self, rank: usize, world: usize) -> TrainBatch {
        if world <= 1 {
            return self.clone();
        }
        let mut groups: Vec<(usize, std::ops::Range<usize>)> = self
            .groups()
            .into_iter()
            .map(|g| {
                let members: Vec<usize> = g.clone().collect();
                let prefix = super::micro::shared_prefix_len(self, &members);
                (prefix + members.iter().map(|&i| self.sequences[i].token_ids.len() - prefix).sum::<usize>(), g)
            })
            .collect();
        groups.sort_by_key(|(cost, g)| (std::cmp::Reverse(*cost), g.start));
        let mut load = vec![0usize; world];
        let mut mine = vec![];
        for (cost, g) in groups {
            let r = (0..world).min_by_key(|&r| (load[r], r)).expect("world > 1");
            load[r] += cost;
            if r == rank {
                mine.push(g);
            }
        }
        mine.sort_by_key(|g| g.start);
        TrainBatch::of_groups(mine.into_iter().map(|g| self.sequences[g].to_vec()))
    }

    /// Checks lengths, the mask and token ids (`vocab`), naming the sequence and field.
    pub fn validate(&self, vocab: i64, needs_returns: bool) -> Result<()> {
        if !self.group_sizes.is_empty() {
            let total: usize = self.group_sizes.iter().sum();
            if total != self.sequences.len() || self.group_sizes.contains(&0) {
                return Err(LearnerError::Batch {
                    index: 0,
                    field: "group_sizes",
                    message: format!("groups of {:?} sequences (sum {total}) for {} sequences; each group holds at least one", self.group_sizes, self.sequences.len()),
                });
            }
        }
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
