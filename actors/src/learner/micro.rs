//! Micro-batches: which sequences are forwarded together, how their tokens are
//! laid out, and which hidden state predicts each trained token.
//!
//! Three layouts, one interface:
//! - **padded** (`pack = false`): one sequence per row, right-padded to the
//!   micro-batch's longest, `micro_batch_size` rows — the plain path, kept as the oracle;
//! - **packed** (`pack = true`): sequences end to end with no padding, micro-batches
//!   filled first-fit up to `micro_batch_tokens` computed tokens;
//! - **shared prefix** (`pack` and `shared_prefix`): a group's common prompt laid
//!   out once, its rollouts' continuations after it ([`rlmesh_model::layout`]).
//!
//! Whatever the layout, a micro-batch ends as flat per-target arrays: for each
//! token a loss reads, the row of the flattened hidden states that predicts it
//! (`src`), the token itself, and the token's advantage, behaviour log-prob and
//! so on. Losses then run on `[K]` tensors, the same code for every layout.
use super::batch::{SftBatch, TrainBatch, TrainSequence};
use rlmesh_model::layout::{Layout, PackedInput};
use rlmesh_model::{Batch, Transformer};
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// How sequences are laid out for the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Packing {
    /// One sequence per row, right-padded.
    Padded,
    /// Sequences end to end.
    Packed,
    /// End to end, a group's shared prompt once.
    SharedPrefix,
}

/// Read access to the sequences being planned.
pub(crate) trait Sequences {
    fn ids(&self, i: usize) -> &[u32];
    fn mask(&self, i: usize) -> &[u8];
    /// The group sequence `i` belongs to (sequences of one group may share their prompt).
    fn group(&self, i: usize) -> usize;
}

impl Sequences for TrainBatch {
    fn ids(&self, i: usize) -> &[u32] {
        &self.sequences[i].token_ids
    }
    fn mask(&self, i: usize) -> &[u8] {
        &self.sequences[i].loss_mask
    }
    fn group(&self, i: usize) -> usize {
        self.group_of(i)
    }
}

impl Sequences for SftBatch {
    fn ids(&self, i: usize) -> &[u32] {
        &self.sequences[i].token_ids
    }
    fn mask(&self, i: usize) -> &[u8] {
        &self.sequences[i].loss_mask
    }
    fn group(&self, i: usize) -> usize {
        i
    }
}

/// Sequences forwarded together as one piece of a packed micro-batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    /// A sequence on its own.
    Alone(usize),
    /// Sequences whose first `prefix` tokens are the same and untrained: laid out once.
    Shared { prefix: usize, members: Vec<usize> },
}

impl Unit {
    /// Tokens the unit computes.
    pub(crate) fn computed(&self, s: &impl Sequences) -> usize {
        match self {
            Unit::Alone(i) => s.ids(*i).len(),
            Unit::Shared { prefix, members } => prefix + members.iter().map(|&i| s.ids(i).len() - prefix).sum::<usize>(),
        }
    }
}

/// The longest prompt the sequences `members` can share: their common token prefix,
/// cut before the first token any of them trains (a trained token has its own
/// advantage per sequence) and before the last token of the shortest (each keeps one of its own).
pub(crate) fn shared_prefix_len(s: &impl Sequences, members: &[usize]) -> usize {
    let Some((&first, rest)) = members.split_first() else { return 0 };
    let head = s.ids(first);
    let untrained = |i: usize| s.mask(i).iter().position(|&m| m != 0).unwrap_or(usize::MAX);
    let mut n = members.iter().map(|&i| untrained(i).min(s.ids(i).len() - 1)).min().unwrap_or(0);
    for &i in rest {
        n = n.min(head.iter().zip(s.ids(i)).take_while(|(a, b)| a == b).count());
    }
    n
}

/// Packed micro-batches over sequences `idx`: units (a group's members together when
/// `shared`), a unit over `budget` tokens split into pieces that each repeat the prompt,
/// then first-fit, largest first, into micro-batches of at most `budget` computed tokens
/// (a single sequence over the budget gets a micro-batch of its own).
pub(crate) fn plan_packed(s: &impl Sequences, idx: &[usize], budget: usize, shared: bool) -> Vec<Vec<Unit>> {
    let mut groups: Vec<Vec<usize>> = vec![];
    let mut at: HashMap<usize, usize> = HashMap::new();
    for &i in idx {
        let g = *at.entry(s.group(i)).or_insert_with(|| {
            groups.push(vec![]);
            groups.len() - 1
        });
        groups[g].push(i);
    }
    let mut units = vec![];
    for members in groups {
        let prefix = if shared && members.len() > 1 { shared_prefix_len(s, &members) } else { 0 };
        if prefix == 0 {
            units.extend(members.into_iter().map(Unit::Alone));
            continue;
        }
        let mut piece: Vec<usize> = vec![];
        let mut cost = prefix;
        for i in members {
            let own = s.ids(i).len() - prefix;
            if !piece.is_empty() && cost + own > budget {
                units.push(shared_unit(prefix, std::mem::take(&mut piece)));
                cost = prefix;
            }
            piece.push(i);
            cost += own;
        }
        units.push(shared_unit(prefix, piece));
    }
    // Largest first; equal sizes keep their order (the plan is deterministic).
    let mut order: Vec<(usize, Unit)> = units.into_iter().map(|u| (u.computed(s), u)).collect();
    order.sort_by_key(|(c, _)| std::cmp::Reverse(*c));
    let mut bins: Vec<(usize, Vec<Unit>)> = vec![];
    for (cost, unit) in order {
        match bins.iter_mut().find(|(used, _)| used + cost <= budget) {
            Some((used, bin)) => {
                *used += cost;
                bin.push(unit);
            }
            None => bins.push((cost, vec![unit])),
        }
    }
    bins.into_iter().map(|(_, b)| b).collect()
}

fn shared_unit(prefix: usize, members: Vec<usize>) -> Unit {
    match members.as_slice() {
        [one] => Unit::Alone(*one),
        _ => Unit::Shared { prefix, members },
    }
}

/// Padded micro-batches over sequences `idx`: sorted by length (similar lengths pad
/// less), `rows` per micro-batch.
pub(crate) fn plan_padded(s: &impl Sequences, idx: &[usize], rows: usize) -> Vec<Vec<usize>> {
    let mut idx = idx.to_vec();
    idx.sort_by_key(|&i| s.ids(i).len());
    idx.chunks(rows.max(1)).map(<[_]>::to_vec).collect()
}

/// The tokens of a micro-batch as the model takes them.
pub(crate) enum Input {
    /// Rows `[B, T]`, right-padded.
    Padded(Tensor),
    /// A packed layout.
    Packed(PackedInput),
}

impl Input {
    /// Final hidden states of every computed position, flattened to `[N, H]`.
    pub(crate) fn hidden_states(&self, model: &Transformer) -> rlmesh_model::Result<Tensor> {
        match self {
            Input::Padded(ids) => {
                let h = model.hidden_states(&Batch::right_padded(ids), None)?;
                let width = h.size()[2];
                Ok(h.reshape([-1, width]))
            }
            Input::Packed(p) => model.packed_hidden_states(p),
        }
    }
}

/// Which tokens of each sequence become targets.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Targets {
    /// The tokens under the loss mask (training).
    Masked,
    /// Every token after the first (values or log-probs of whole sequences).
    All,
}

/// The per-token values a policy loss reads, one column each.
#[derive(Default)]
pub(crate) struct Columns {
    pub advantages: Option<Tensor>,
    pub behaviour: Option<Tensor>,
    pub ref_logprobs: Option<Tensor>,
    pub values: Option<Tensor>,
    pub returns: Option<Tensor>,
}

/// One micro-batch, ready for the forward pass and the losses.
pub(crate) struct MicroBatch {
    pub input: Input,
    /// For each target, the row of the flattened hidden states that predicts it `[K]`.
    pub src: Tensor,
    /// The target tokens `[K]`.
    pub targets: Tensor,
    /// For each target, the masked tokens of its sequence `[K]` (per-sequence aggregation).
    pub counts: Tensor,
    /// Policy columns `[K]` (all None for SFT and for whole-sequence outputs).
    pub columns: Columns,
    /// Targets (K): under the loss mask when training.
    pub targets_len: usize,
    /// Tokens of the sequences, padding excluded.
    pub tokens: usize,
    /// Positions the forward pass computes (padding included, shared prompts once).
    pub computed: usize,
    /// Sequences in target order (with [`Targets::All`], sequence `i` owns `len − 1` consecutive targets).
    pub order: Vec<usize>,
}

/// Collects the per-target arrays while a micro-batch is laid out.
struct Collect<'a, S: Sequences> {
    s: &'a S,
    policy: Option<&'a TrainBatch>,
    which: Targets,
    src: Vec<i64>,
    targets: Vec<i64>,
    counts: Vec<f32>,
    cols: [Vec<f32>; 5],
    has: [bool; 5],
    order: Vec<usize>,
    tokens: usize,
}

impl<'a, S: Sequences> Collect<'a, S> {
    fn new(s: &'a S, policy: Option<&'a TrainBatch>, which: Targets) -> Self {
        Collect { s, policy, which, src: vec![], targets: vec![], counts: vec![], cols: Default::default(), has: [true; 5], order: vec![], tokens: 0 }
    }

    /// Adds sequence `i`, whose token `j` sits at row `at(j)` of the hidden states.
    fn add(&mut self, i: usize, at: impl Fn(usize) -> usize) {
        let ids = self.s.ids(i);
        let mask = self.s.mask(i);
        self.order.push(i);
        self.tokens += ids.len();
        let count = mask.iter().map(|&m| m as f32).sum::<f32>();
        let seq: Option<&TrainSequence> = self.policy.map(|b| &b.sequences[i]);
        fn optional(s: &TrainSequence) -> [Option<&Vec<f32>>; 5] {
            [Some(&s.advantages), Some(&s.behaviour_logprobs), s.ref_logprobs.as_ref(), s.values.as_ref(), s.returns.as_ref()]
        }
        if let Some(s) = seq {
            for (has, col) in self.has.iter_mut().zip(optional(s)) {
                *has &= col.is_some();
            }
        }
        for j in 1..ids.len() {
            if self.which == Targets::Masked && mask[j] == 0 {
                continue;
            }
            self.src.push(at(j - 1) as i64);
            self.targets.push(ids[j] as i64);
            self.counts.push(count);
            if let Some(s) = seq {
                for (out, col) in self.cols.iter_mut().zip(optional(s)) {
                    if let Some(col) = col {
                        out.push(col[j]);
                    }
                }
            }
        }
    }

    fn finish(self, input: Input, computed: usize, device: Device) -> MicroBatch {
        let k = self.targets.len();
        let long = |v: &[i64]| Tensor::from_slice(v).to_device(device);
        let float = |v: &[f32]| Tensor::from_slice(v).to_device(device);
        let policy = self.policy.is_some();
        let col = |n: usize| (policy && self.has[n]).then(|| float(&self.cols[n]));
        MicroBatch {
            input,
            src: long(&self.src),
            targets: long(&self.targets),
            counts: float(&self.counts).to_kind(Kind::Float),
            columns: Columns { advantages: col(0), behaviour: col(1), ref_logprobs: col(2), values: col(3), returns: col(4) },
            targets_len: k,
            tokens: self.tokens,
            computed,
            order: self.order,
        }
    }
}

impl MicroBatch {
    /// A packed micro-batch of `units`.
    pub(crate) fn packed<S: Sequences>(s: &S, policy: Option<&TrainBatch>, units: &[Unit], which: Targets, device: Device) -> MicroBatch {
        let mut layout = Layout::default();
        let mut c = Collect::new(s, policy, which);
        for unit in units {
            match unit {
                Unit::Alone(i) => {
                    let span = layout.push_root(s.ids(*i));
                    c.add(*i, |j| layout.token_index(span, j));
                }
                Unit::Shared { prefix, members } => {
                    let root = layout.push_root(&s.ids(members[0])[..*prefix]);
                    for &i in members {
                        let span = layout.push_child(root, &s.ids(i)[*prefix..]);
                        c.add(i, |j| layout.token_index(span, j));
                    }
                }
            }
        }
        let computed = layout.len();
        c.finish(Input::Packed(layout.to_device(device)), computed, device)
    }

    /// A padded micro-batch of sequences `rows`, one per row.
    pub(crate) fn padded<S: Sequences>(s: &S, policy: Option<&TrainBatch>, rows: &[usize], which: Targets, device: Device) -> MicroBatch {
        let t = rows.iter().map(|&i| s.ids(i).len()).max().unwrap_or(2);
        let mut ids = vec![0i64; rows.len() * t];
        let mut c = Collect::new(s, policy, which);
        for (r, &i) in rows.iter().enumerate() {
            for (j, &x) in s.ids(i).iter().enumerate() {
                ids[r * t + j] = x as i64;
            }
            c.add(i, |j| r * t + j);
        }
        let ids = Tensor::from_slice(&ids).view([rows.len() as i64, t as i64]).to_device(device);
        c.finish(Input::Padded(ids), rows.len() * t, device)
    }
}

/// SFT rows: sequences `idx` packed first-fit, longest first, into rows as long as
/// the longest of them; each row lists its sequences in order.
pub(crate) fn pack_rows(s: &impl Sequences, idx: &[usize]) -> Vec<Vec<usize>> {
    let len = |i: usize| s.ids(i).len();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(ids: &[u32], trained_from: usize) -> TrainSequence {
        let n = ids.len();
        TrainSequence {
            token_ids: ids.to_vec(),
            loss_mask: (0..n).map(|j| (j >= trained_from) as u8).collect(),
            advantages: vec![0.0; n],
            behaviour_logprobs: vec![0.0; n],
            ..Default::default()
        }
    }

    #[test]
    fn the_shared_prefix_stops_at_the_first_difference_the_first_trained_token_and_the_shortest_sequence() {
        let b = TrainBatch::of_groups([vec![seq(&[1, 2, 3, 4, 5], 4), seq(&[1, 2, 3, 9, 9, 9], 4), seq(&[1, 2, 3, 4], 3)]]);
        assert_eq!(shared_prefix_len(&b, &[0, 1]), 3, "the first difference");
        assert_eq!(shared_prefix_len(&b, &[0, 2]), 3, "the first trained token of either");
        let c = TrainBatch::of_groups([vec![seq(&[1, 2, 3], 3), seq(&[1, 2, 3, 4], 4)]]);
        assert_eq!(shared_prefix_len(&c, &[0, 1]), 2, "each keeps at least its last token");
        let d = TrainBatch::of_groups([vec![seq(&[7, 2, 3], 2), seq(&[1, 2, 3], 2)]]);
        assert_eq!(shared_prefix_len(&d, &[0, 1]), 0);
    }

    #[test]
    fn packed_plans_hold_every_sequence_once_within_the_budget() {
        let prompt: Vec<u32> = (0..30).collect();
        let group = |extra: &[usize]| extra.iter().map(|&n| seq(&[prompt.as_slice(), &vec![99; n]].concat(), 30)).collect::<Vec<_>>();
        let b = TrainBatch::of_groups([group(&[5, 40, 7, 3]), group(&[2, 2]), group(&[90]), vec![seq(&[5; 12], 1)]]);
        let all: Vec<usize> = (0..b.sequences.len()).collect();
        for (budget, shared) in [(64, true), (64, false), (200, true), (10, true)] {
            let plan = plan_packed(&b, &all, budget, shared);
            let mut seen: Vec<usize> = plan
                .iter()
                .flatten()
                .flat_map(|u| match u {
                    Unit::Alone(i) => vec![*i],
                    Unit::Shared { members, .. } => members.clone(),
                })
                .collect();
            seen.sort();
            assert_eq!(seen, all, "budget {budget}");
            for mb in &plan {
                let cost: usize = mb.iter().map(|u| u.computed(&b)).sum();
                assert!(cost <= budget || mb.len() == 1, "budget {budget}: a micro-batch of {cost} tokens holds {} units", mb.len());
            }
            let shares = plan.iter().flatten().any(|u| matches!(u, Unit::Shared { .. }));
            assert_eq!(shares, shared && budget >= 64, "budget {budget}, shared {shared}");
        }
    }
}
