//! Packed token layouts for training: every token computed once.
//!
//! A learner's batch holds many sequences of different lengths, and the G
//! rollouts of a group all start with the same prompt (system prompt, tool
//! schemas, task). Padding each sequence to the longest and forwarding the
//! prompt G times computes far more tokens than are trained. A [`Layout`] lays
//! the tokens out end to end, with no padding, as *spans*:
//!
//! - a **root** span is a sequence alone, or a prompt shared by a group;
//! - a **child** span continues one root (its parent): a group member's tokens
//!   after the shared prompt. Its positions continue the parent's, and it
//!   attends to the whole parent and causally to itself, never to a sibling.
//!
//! So a group of G rollouts of a P-token prompt costs `P + Σ suffixes` tokens
//! instead of `G·(P + longest)`, and the prompt's gradient is the sum over its
//! children, which is what the G separate sequences give.
//!
//! The feed-forward parts run on the flat `[N, H]` tokens. Attention gathers
//! the spans' queries and keys into padded blocks of similar lengths (roots:
//! plain causal attention with no mask; children: the parent's keys then their
//! own, under a `[children, 1, longest child, longest parent + longest child]`
//! mask) and scatters the outputs back. No `[N, N]` mask is ever built, on any device.
//!
//! ```
//! use rlmesh_model::layout::Layout;
//! let mut l = Layout::default();
//! let prompt = l.push_root(&[1, 2, 3]);
//! l.push_child(prompt, &[4, 5]);
//! l.push_child(prompt, &[6]);
//! assert_eq!(l.len(), 6);
//! assert_eq!(l.positions(), vec![0, 1, 2, 3, 4, 3]);
//! // Token 1 of the second child's sequence is the prompt's token 1; its token 3 is the child's first.
//! assert_eq!(l.token_index(2, 1), 1);
//! assert_eq!(l.token_index(2, 3), 5);
//! ```
use crate::error::Result;
use crate::transformer::{swap_halves, Transformer};
use tch::{Device, Kind, Tensor};

/// One run of tokens in a [`Layout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Index of its first token in the flat layout.
    pub start: usize,
    /// Tokens in the span.
    pub len: usize,
    /// The root span it continues (None: a root).
    pub parent: Option<usize>,
}

/// Sequences laid out end to end as root and child spans (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    ids: Vec<u32>,
    spans: Vec<Span>,
}

impl Layout {
    /// Appends a root span (a sequence alone, or a shared prompt); returns its index.
    pub fn push_root(&mut self, tokens: &[u32]) -> usize {
        self.push(tokens, None)
    }

    /// Appends a child span continuing root span `parent`; returns its index.
    ///
    /// Panics when `parent` is not a root span of this layout (one level only:
    /// a multi-turn rollout shares its first prompt, then diverges).
    pub fn push_child(&mut self, parent: usize, tokens: &[u32]) -> usize {
        assert!(self.spans.get(parent).is_some_and(|s| s.parent.is_none()), "span {parent} is not a root span");
        self.push(tokens, Some(parent))
    }

    fn push(&mut self, tokens: &[u32], parent: Option<usize>) -> usize {
        assert!(!tokens.is_empty(), "a span holds at least one token");
        self.spans.push(Span { start: self.ids.len(), len: tokens.len(), parent });
        self.ids.extend_from_slice(tokens);
        self.spans.len() - 1
    }

    /// Tokens in the layout: what a forward pass computes.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when the layout holds no token.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The spans, in order.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// The flat token ids.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Length of the sequence that ends with span `span` (its parent's tokens included).
    pub fn sequence_len(&self, span: usize) -> usize {
        let s = self.spans[span];
        s.len + s.parent.map_or(0, |p| self.spans[p].len)
    }

    /// Flat index of token `j` of the sequence that ends with span `span`.
    pub fn token_index(&self, span: usize, j: usize) -> usize {
        let s = self.spans[span];
        match s.parent {
            Some(p) if j < self.spans[p].len => self.spans[p].start + j,
            Some(p) => s.start + j - self.spans[p].len,
            None => s.start + j,
        }
    }

    /// Position id of every token: a root counts from 0, a child on from its parent's length.
    pub fn positions(&self) -> Vec<i64> {
        let mut out = vec![0i64; self.ids.len()];
        for s in &self.spans {
            let first = s.parent.map_or(0, |p| self.spans[p].len);
            for j in 0..s.len {
                out[s.start + j] = (first + j) as i64;
            }
        }
        out
    }

    /// The layout's tensors on `device`: ids, positions and the attention plan.
    pub fn to_device(&self, device: Device) -> PackedInput {
        let ids = Tensor::from_slice(&self.ids.iter().map(|&x| x as i64).collect::<Vec<_>>()).to_device(device);
        let positions = Tensor::from_slice(&self.positions()).to_device(device);
        let roots: Vec<usize> = (0..self.spans.len()).filter(|&i| self.spans[i].parent.is_none()).collect();
        let children: Vec<usize> = (0..self.spans.len()).filter(|&i| self.spans[i].parent.is_some()).collect();
        let mut slots = vec![usize::MAX; self.ids.len()];
        let mut offset = 0;
        let mut blocks = vec![];
        for (kind, members) in [(BlockKind::Roots, roots), (BlockKind::Children, children)] {
            for members in self.buckets(members) {
                let block = self.block(kind, &members, offset, &mut slots, device);
                offset += (block.units * block.queries) as usize;
                blocks.push(block);
            }
        }
        debug_assert!(slots.iter().all(|&s| s != usize::MAX), "every token is a query of one block");
        let inverse = Tensor::from_slice(&slots.iter().map(|&s| s as i64).collect::<Vec<_>>()).to_device(device);
        PackedInput { ids, positions, blocks, inverse, tokens: self.ids.len() }
    }

    /// Spans of one kind in blocks of similar lengths, longest first: a block grows while
    /// its padded queries stay within [`PADDING_SLACK`] of its real ones, so a long-tailed
    /// mix does not pad every short span to the longest (attention is computed per slot).
    fn buckets(&self, mut members: Vec<usize>) -> Vec<Vec<usize>> {
        members.sort_by_key(|&i| std::cmp::Reverse(self.spans[i].len));
        let mut out: Vec<Vec<usize>> = vec![];
        let mut real = 0;
        for i in members {
            let len = self.spans[i].len;
            match out.last_mut() {
                Some(block) if ((block.len() + 1) * self.spans[block[0]].len) as f64 <= PADDING_SLACK * (real + len) as f64 => {
                    block.push(i);
                    real += len;
                }
                _ => {
                    out.push(vec![i]);
                    real = len;
                }
            }
        }
        out
    }

    /// The gather indices (and for children the mask) of one kind of span; records the
    /// output slot of each of their tokens in `slots` (block outputs follow each other from `offset`).
    fn block(&self, kind: BlockKind, members: &[usize], offset: usize, slots: &mut [usize], device: Device) -> Block {
        let longest = |spans: &mut dyn Iterator<Item = usize>| spans.map(|i| self.spans[i].len).max().unwrap_or(0);
        let lq = longest(&mut members.iter().copied());
        let lp = if kind == BlockKind::Children { longest(&mut members.iter().map(|&i| self.spans[i].parent.expect("a child"))) } else { 0 };
        let lk = lp + lq;
        let (mut q_index, mut kv_index) = (Vec::with_capacity(members.len() * lq), Vec::with_capacity(members.len() * lk));
        let mut mask = vec![];
        // Padding slots point at a real token of the unit (finite values); no valid query
        // reads a padded key: roots are causal and right-padded, children are masked.
        let fill = |out: &mut Vec<i64>, s: Span, width: usize| out.extend((0..width).map(|j| (s.start + j.min(s.len - 1)) as i64));
        for (u, &i) in members.iter().enumerate() {
            let s = self.spans[i];
            for j in 0..s.len {
                slots[s.start + j] = offset + u * lq + j;
            }
            fill(&mut q_index, s, lq);
            if let Some(p) = s.parent {
                let parent = self.spans[p];
                fill(&mut kv_index, parent, lp);
                fill(&mut kv_index, s, lq);
                // Query i sees the parent's real keys and its own keys up to itself; a padded
                // query (i ≥ len) sees a prefix of its own row, so no row of the mask is empty.
                for qi in 0..lq {
                    mask.extend((0..lp).map(|k| k < parent.len));
                    mask.extend((0..lq).map(|k| k <= qi));
                }
            }
        }
        let index = |v: Vec<i64>| Tensor::from_slice(&v).to_device(device);
        let units = members.len() as i64;
        Block {
            q_index: index(q_index),
            kv_index: (kind == BlockKind::Children).then(|| index(kv_index)),
            mask: (kind == BlockKind::Children).then(|| Tensor::from_slice(&mask).view([units, 1, lq as i64, lk as i64]).to_device(device)),
            units,
            queries: lq as i64,
            keys: lk as i64,
        }
    }
}

/// A block of spans pads each to its longest: at most this many query slots per real token.
const PADDING_SLACK: f64 = 1.25;

#[derive(Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Roots,
    Children,
}

/// The spans of one kind gathered into a padded `[units, …]` block for attention.
struct Block {
    /// Flat index of each query slot `[units · queries]`.
    q_index: Tensor,
    /// Flat index of each key slot `[units · keys]` (None: the queries' own tokens, causal).
    kv_index: Option<Tensor>,
    /// `[units, 1, queries, keys]` (None: plain causal attention).
    mask: Option<Tensor>,
    units: i64,
    queries: i64,
    keys: i64,
}

/// A [`Layout`] on a device: what [`Transformer::packed_hidden_states`] reads.
pub struct PackedInput {
    /// Token ids `[N]`.
    pub ids: Tensor,
    /// Position ids `[N]`.
    pub positions: Tensor,
    blocks: Vec<Block>,
    /// For each token, its row among the concatenated block outputs `[N]`.
    inverse: Tensor,
    tokens: usize,
}

impl PackedInput {
    /// Tokens computed.
    pub fn len(&self) -> usize {
        self.tokens
    }

    /// True when there is no token.
    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    /// Attention over the layout: `q` `[N, heads, d]`, `k` and `v` `[N, kv_heads, d]` → `[N, heads·d]`.
    pub(crate) fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let (heads, d) = (q.size()[1], q.size()[2]);
        let kv_heads = k.size()[1];
        let outs: Vec<Tensor> = self
            .blocks
            .iter()
            .map(|b| {
                let gather = |x: &Tensor, index: &Tensor, len: i64, h: i64| x.index_select(0, index).view([b.units, len, h, d]).transpose(1, 2);
                let qb = gather(q, &b.q_index, b.queries, heads);
                let kv_index = b.kv_index.as_ref().unwrap_or(&b.q_index);
                let (kb, vb) = (gather(k, kv_index, b.keys, kv_heads), gather(v, kv_index, b.keys, kv_heads));
                let out = Tensor::scaled_dot_product_attention(&qb, &kb, &vb, b.mask.as_ref(), 0.0, b.mask.is_none(), None, kv_heads != heads);
                out.transpose(1, 2).reshape([b.units * b.queries, heads * d])
            })
            .collect();
        let all = if outs.len() == 1 { outs.into_iter().next().expect("one block") } else { Tensor::cat(&outs, 0) };
        all.index_select(0, &self.inverse)
    }
}

impl Transformer {
    /// Final hidden states `[N, H]` (after the last norm) of every token of a packed layout.
    pub fn packed_hidden_states(&self, input: &PackedInput) -> Result<Tensor> {
        let n = input.len() as i64;
        let (cos, sin) = self.rope(&input.positions.view([1, n]), self.kind());
        let (cos, sin) = (cos.view([n, 1, -1]), sin.view([n, 1, -1]));
        let x = Tensor::embedding(&self.embed, &input.ids, -1, false, false);
        Ok(self.layers_forward(x, |_, q, k, v| {
            let c = &self.config;
            let q = q.view([n, c.num_heads, c.head_dim]);
            let k = k.view([n, c.num_kv_heads, c.head_dim]);
            let v = v.view([n, c.num_kv_heads, c.head_dim]);
            let q = &q * &cos + swap_halves(&q) * &sin;
            let k = &k * &cos + swap_halves(&k) * &sin;
            input.attend(&q, &k, &v)
        }))
    }

    /// Log-probabilities over the vocabulary `[K, V]` (float32) of hidden states `[K, H]`.
    pub fn output_logprobs(&self, hidden: &Tensor) -> Tensor {
        hidden.linear::<Tensor>(self.lm_head(), None).to_kind(Kind::Float).log_softmax(-1, Kind::Float)
    }
}
