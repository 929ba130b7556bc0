//! A fused decode step for float32 models on CPU.
//!
//! A decode step feeds one new token per row. For a small model (the benchmark's
//! tiny Qwen2: hidden 64, two layers) that step is ~60 libtorch calls on a few
//! hundred numbers each, and their dispatch, allocation and shape bookkeeping cost
//! more than the arithmetic. [`FusedDecoder`] runs the same step in Rust over the
//! model's own parameter buffers and the KV cache's tensors, allocation-free:
//!
//! - the seven projections are MKL `sgemm_` calls with the arguments libtorch's
//!   `linear` passes (bias first, then accumulate), so their products are libtorch's;
//! - RoPE reads cos/sin tables that libtorch computes once per `generate` call
//!   with the model's own code, and combines them as `hidden_states` does;
//! - RMSNorm, attention (grouped-query, over the cached slots, prompt padding
//!   masked) and the SwiGLU are plain loops; their sums run in another order than
//!   libtorch's, so hidden states agree to rounding, not bit for bit (tested).
//!
//! Which engine a `generate` call uses is [`DecodeEngine`]'s choice.
use crate::cache::KvCache;
use crate::error::{ModelError, Result};
use crate::kernels::exp_nonpositive;
use crate::mkl::{linear_rows, mkl, Sgemm};
use crate::transformer::{Linear, RmsNorm, Transformer};
use tch::{Device, Kind, Tensor};

/// How `generate` runs its decode steps on CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeEngine {
    /// [`FusedDecoder`] wherever it applies (float32 on CPU with MKL), libtorch's otherwise.
    /// Measured faster at every size here (1 thread, interleaved A/B): 1.2–2.7× on the
    /// tiny model at batch 1–32, 1.21–1.25× on SmolLM2-135M at batch 8 (README, "Benchmarks").
    Fused,
    /// `Transformer::hidden_states`, one libtorch call per operation (`RLMESH_DECODE=tensor`).
    Tensor,
}

impl DecodeEngine {
    /// `RLMESH_DECODE=tensor` for libtorch's step; anything else (or unset): fused.
    pub fn from_env() -> DecodeEngine {
        match std::env::var("RLMESH_DECODE").as_deref() {
            Ok("tensor") => DecodeEngine::Tensor,
            _ => DecodeEngine::Fused,
        }
    }
}

/// A float32 CPU tensor's elements (the caller has checked kind, device and contiguity).
fn floats(t: &Tensor) -> &[f32] {
    // SAFETY: a contiguous float32 CPU tensor of numel elements, borrowed as long as `t`.
    unsafe { std::slice::from_raw_parts(t.data_ptr() as *const f32, t.numel()) }
}

/// The same, writable.
fn floats_mut(t: &mut Tensor) -> &mut [f32] {
    // SAFETY: as `floats`; the exclusive borrow of `t` stands for its storage (the caller's
    // tensors here own theirs, no view of them is read while this slice lives).
    unsafe { std::slice::from_raw_parts_mut(t.data_ptr() as *mut f32, t.numel()) }
}

fn usable(t: &Tensor) -> bool {
    t.device() == Device::Cpu && t.kind() == Kind::Float && t.is_contiguous()
}

/// Scratch buffers and tables of one `generate` call's fused decode steps.
pub struct FusedDecoder<'m> {
    model: &'m Transformer,
    sgemm: Sgemm,
    rows: usize,
    capacity: usize,
    /// RoPE `cos` and signed `sin` per position `[capacity, head_dim]` (libtorch's own values).
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// Which of the first `prompt_width` slots each row may attend (None: all).
    valid: Option<Vec<bool>>,
    prompt_width: usize,
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    scores: Vec<f32>,
    /// Per layer, the keys transposed, `[rows, kv_heads, head_dim, capacity]`: a query's
    /// scores over all slots are then `head_dim` vector multiply-adds along the slots.
    keys_t: Vec<Vec<f32>>,
    out: Tensor,
}

impl<'m> FusedDecoder<'m> {
    /// A decoder continuing `cache` (`rows` sequences, its filled slots already
    /// prefilled), or `None` where the fused step does not apply (another device or
    /// dtype, no MKL `sgemm_`). `valid` (`[rows, prompt_width]`, bool) marks the prompt
    /// slots a row may attend.
    pub fn new(model: &'m Transformer, cache: &KvCache, valid: Option<&Tensor>) -> Result<Option<FusedDecoder<'m>>> {
        let Some(sgemm) = mkl().and_then(|m| m.sgemm) else { return Ok(None) };
        let linears = model.layers.iter().flat_map(|l| [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]);
        let norms = model.layers.iter().flat_map(|l| [&l.input_norm, &l.post_norm]).chain([&model.norm]);
        let all_usable = usable(&model.embed)
            && linears.into_iter().all(|l| usable(&l.weight) && l.bias.as_ref().is_none_or(usable))
            && norms.into_iter().all(|n| usable(&n.weight));
        let c = &model.config;
        let cache_usable = cache.layers() == model.layers.len() && (0..model.layers.len()).all(|i| {
            let (k, v) = cache.layer(i);
            usable(k) && usable(v)
        });
        if !all_usable || !cache_usable || model.layers.is_empty() || c.head_dim > 512 || c.head_dim % 2 != 0 {
            return Ok(None);
        }
        let (rows, capacity) = (cache.batch(), cache.capacity());
        let (hidden, q_dim, kv_dim, inter) =
            (c.hidden_size as usize, (c.num_heads * c.head_dim) as usize, (c.num_kv_heads * c.head_dim) as usize, c.intermediate_size as usize);
        let positions = Tensor::arange(capacity as i64, (Kind::Int64, Device::Cpu)).view([1, capacity as i64]);
        let (cos, sin) = model.rope(&positions, Kind::Float);
        let table = |t: Tensor| Vec::<f32>::try_from(t.contiguous().view([-1]));
        let (valid, prompt_width) = match valid {
            Some(v) => (Some(Vec::<bool>::try_from(v.contiguous().view([-1]))?), v.size()[1] as usize),
            None => (None, 0),
        };
        let (kv_heads, hd) = (c.num_kv_heads as usize, c.head_dim as usize);
        let keys_t = (0..model.layers.len())
            .map(|i| {
                let keys = floats(cache.layer(i).0);
                let mut t = vec![0.0f32; keys.len()];
                for (head, (src, dst)) in keys.chunks_exact(capacity * hd).zip(t.chunks_exact_mut(capacity * hd)).enumerate() {
                    debug_assert!(head < rows * kv_heads);
                    for s in 0..cache.len() {
                        for j in 0..hd {
                            dst[j * capacity + s] = src[s * hd + j];
                        }
                    }
                }
                t
            })
            .collect();
        Ok(Some(FusedDecoder {
            model,
            sgemm,
            rows,
            capacity,
            cos: table(cos)?,
            sin: table(sin)?,
            valid,
            prompt_width,
            x: vec![0.0; rows * hidden],
            h: vec![0.0; rows * hidden],
            q: vec![0.0; rows * q_dim],
            k: vec![0.0; rows * kv_dim],
            v: vec![0.0; rows * kv_dim],
            attn: vec![0.0; rows * q_dim],
            gate: vec![0.0; rows * inter],
            up: vec![0.0; rows * inter],
            scores: vec![0.0; capacity],
            keys_t,
            out: Tensor::zeros([rows as i64, hidden as i64], (Kind::Float, Device::Cpu)),
        }))
    }

    /// Feed one token per row (`tokens[r]` at position `positions[r]`), append its keys
    /// and values at the cache's next slot, and return the final hidden states `[rows, H]`.
    pub fn step(&mut self, tokens: &[i64], positions: &[i64], cache: &mut KvCache) -> Result<&Tensor> {
        let m = self.model;
        let c = &m.config;
        let (rows, hidden) = (self.rows, c.hidden_size as usize);
        let (heads, kv_heads, hd) = (c.num_heads as usize, c.num_kv_heads as usize, c.head_dim as usize);
        let slot = cache.len();
        if tokens.len() != rows || positions.len() != rows {
            return Err(ModelError::Input(format!("fused step: {} tokens and {} positions for {rows} rows", tokens.len(), positions.len())));
        }
        if cache.batch() != rows || cache.capacity() != self.capacity || cache.layers() != m.layers.len() {
            return Err(ModelError::Input(format!("fused step: a KV cache of another shape than the decoder's ({rows} rows, {} slots)", self.capacity)));
        }
        if slot >= cache.capacity() {
            return Err(ModelError::Input(format!("KV cache holds {} slots, {slot} used, 1 more requested", cache.capacity())));
        }
        let vocab = c.vocab_size;
        let embed = floats(&m.embed);
        for (r, &tok) in tokens.iter().enumerate() {
            if !(0..vocab).contains(&tok) {
                return Err(ModelError::Input(format!("token id {tok} is out of range (vocab_size {vocab})")));
            }
            let tok = tok as usize;
            self.x[r * hidden..][..hidden].copy_from_slice(&embed[tok * hidden..][..hidden]);
        }
        for &p in positions {
            if !(0..self.capacity as i64).contains(&p) {
                return Err(ModelError::Input(format!("position {p} is outside the {} RoPE slots", self.capacity)));
            }
        }
        let sgemm = self.sgemm;
        for (i, layer) in m.layers.iter().enumerate() {
            rms_norm(&self.x, &layer.input_norm, &mut self.h, hidden);
            linear(sgemm, &layer.q, &self.h, &mut self.q, rows);
            linear(sgemm, &layer.k, &self.h, &mut self.k, rows);
            linear(sgemm, &layer.v, &self.h, &mut self.v, rows);
            for (r, &p) in positions.iter().enumerate() {
                let (cos, sin) = (&self.cos[p as usize * hd..][..hd], &self.sin[p as usize * hd..][..hd]);
                rope(&mut self.q[r * heads * hd..][..heads * hd], cos, sin);
                rope(&mut self.k[r * kv_heads * hd..][..kv_heads * hd], cos, sin);
            }
            let (keys, values) = cache.layer(i);
            let (mut keys, mut values) = (keys.shallow_clone(), values.shallow_clone());
            let (keys, values) = (floats_mut(&mut keys), floats_mut(&mut values));
            let keys_t = &mut self.keys_t[i];
            for r in 0..rows {
                for g in 0..kv_heads {
                    let (head, at) = (r * kv_heads + g, ((r * kv_heads + g) * self.capacity + slot) * hd);
                    let k = &self.k[head * hd..][..hd];
                    keys[at..][..hd].copy_from_slice(k);
                    values[at..][..hd].copy_from_slice(&self.v[head * hd..][..hd]);
                    for (j, &kj) in k.iter().enumerate() {
                        keys_t[(head * hd + j) * self.capacity + slot] = kj;
                    }
                }
            }
            let shape = Attention { heads, kv_heads, hd, capacity: self.capacity, slots: slot + 1 };
            for r in 0..rows {
                let valid = self.valid.as_ref().map(|v| &v[r * self.prompt_width..][..self.prompt_width]);
                shape.row(r, &self.q, keys_t, values, valid, &mut self.scores, &mut self.attn);
            }
            linear(sgemm, &layer.o, &self.attn, &mut self.h, rows);
            add_into(&mut self.x, &self.h);
            rms_norm(&self.x, &layer.post_norm, &mut self.h, hidden);
            linear(sgemm, &layer.gate, &self.h, &mut self.gate, rows);
            linear(sgemm, &layer.up, &self.h, &mut self.up, rows);
            for (g, u) in self.gate.iter_mut().zip(&self.up) {
                // libtorch's silu: x / (1 + e^−x), then the product with up.
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
            linear(sgemm, &layer.down, &self.gate, &mut self.h, rows);
            add_into(&mut self.x, &self.h);
        }
        cache.advance(1);
        let mut out = self.out.shallow_clone();
        rms_norm(&self.x, &m.norm, floats_mut(&mut out), hidden);
        Ok(&self.out)
    }
}

/// `y = x · Wᵀ + b` for `rows` rows, as libtorch's `addmm` runs it: bias copied in, then accumulate.
fn linear(sgemm: Sgemm, l: &Linear, x: &[f32], y: &mut [f32], rows: usize) {
    let size = l.weight.size();
    let (n, k) = (size[0] as usize, size[1] as usize);
    let (x, y) = (&x[..rows * k], &mut y[..rows * n]);
    if let Some(b) = &l.bias {
        for row in y.chunks_exact_mut(n) {
            row.copy_from_slice(floats(b));
        }
    }
    // SAFETY: x is rows × k, the weight n × k, y rows × n, all float32 and distinct.
    unsafe { linear_rows(sgemm, x.as_ptr(), floats(&l.weight).as_ptr(), y.as_mut_ptr(), rows, n, k, l.bias.is_some()) };
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// transformers' RMSNorm in float32: `w · (x · 1/√(mean(x²) + ε))`, row by row.
fn rms_norm(x: &[f32], norm: &RmsNorm, out: &mut [f32], width: usize) {
    let w = floats(&norm.weight);
    let eps = norm.eps as f32;
    for (row, dst) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let mut acc = [0.0f32; 8];
        let chunks = row.chunks_exact(8);
        let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
        for ch in chunks {
            for l in 0..8 {
                acc[l] += ch[l] * ch[l];
            }
        }
        let mean = (acc.iter().sum::<f32>() + tail) / width as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((d, &v), &g) in dst.iter_mut().zip(row).zip(w) {
            *d = g * (v * scale);
        }
    }
}

/// `x·cos + swap_halves(x)·sin` per head of `x` (heads × head_dim), as `hidden_states`.
fn rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let hd = cos.len();
    let half = hd / 2;
    let mut swapped = [0.0f32; 512];
    for head in x.chunks_exact_mut(hd) {
        let sw = &mut swapped[..hd];
        sw[..half].copy_from_slice(&head[half..]);
        sw[half..].copy_from_slice(&head[..half]);
        for j in 0..hd {
            head[j] = head[j] * cos[j] + sw[j] * sin[j];
        }
    }
}

/// The shapes of one decode step's attention.
struct Attention {
    heads: usize,
    kv_heads: usize,
    hd: usize,
    capacity: usize,
    slots: usize,
}

impl Attention {
    /// Row `r`'s attention output for every query head: softmax(q·kᵀ/√d) · v over the
    /// filled slots, prompt slots the row may not attend left out. `keys_t` is
    /// `[rows, kv_heads, head_dim, capacity]`, `values` `[rows, kv_heads, capacity, head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn row(&self, r: usize, q: &[f32], keys_t: &[f32], values: &[f32], valid: Option<&[bool]>, scores: &mut [f32], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::isa::avx512() {
            // SAFETY: the CPU has the features.
            return unsafe { self.row_avx512(r, q, keys_t, values, valid, scores, out) };
        }
        #[cfg(target_arch = "x86_64")]
        if crate::isa::avx2_fma() {
            // SAFETY: the CPU has the features.
            return unsafe { self.row_avx2(r, q, keys_t, values, valid, scores, out) };
        }
        self.row_scan(r, q, keys_t, values, valid, scores, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn row_avx512(&self, r: usize, q: &[f32], keys_t: &[f32], values: &[f32], valid: Option<&[bool]>, scores: &mut [f32], out: &mut [f32]) {
        self.row_scan(r, q, keys_t, values, valid, scores, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn row_avx2(&self, r: usize, q: &[f32], keys_t: &[f32], values: &[f32], valid: Option<&[bool]>, scores: &mut [f32], out: &mut [f32]) {
        self.row_scan(r, q, keys_t, values, valid, scores, out)
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn row_scan(&self, r: usize, q: &[f32], keys_t: &[f32], values: &[f32], valid: Option<&[bool]>, scores: &mut [f32], out: &mut [f32]) {
        let (hd, group, cap, n) = (self.hd, self.heads / self.kv_heads, self.capacity, self.slots);
        let scale = (1.0 / (hd as f64).sqrt()) as f32;
        let scores = &mut scores[..n];
        for head in 0..self.heads {
            let g = head / group;
            let qv = &q[(r * self.heads + head) * hd..][..hd];
            let kt = &keys_t[(r * self.kv_heads + g) * hd * cap..][..hd * cap];
            let vg = &values[(r * self.kv_heads + g) * cap * hd..][..n * hd];
            // Scores along the slots: Σⱼ qⱼ · kᵀ[j, s].
            scores.fill(0.0);
            for (j, &qj) in qv.iter().enumerate() {
                for (sc, &k) in scores.iter_mut().zip(&kt[j * cap..][..n]) {
                    *sc += qj * k;
                }
            }
            for sc in scores.iter_mut() {
                *sc *= scale;
            }
            if let Some(v) = valid {
                for (sc, &open) in scores.iter_mut().zip(v) {
                    *sc = if open { *sc } else { f32::NEG_INFINITY };
                }
            }
            let max = lane_max(scores);
            for sc in scores.iter_mut() {
                *sc = exp_nonpositive(*sc - max);
            }
            let sum = lane_sum(scores);
            let o = &mut out[(r * self.heads + head) * hd..][..hd];
            o.fill(0.0);
            for (&p, vv) in scores.iter().zip(vg.chunks_exact(hd)) {
                for (a, b) in o.iter_mut().zip(vv) {
                    *a += p * b;
                }
            }
            let inv = 1.0 / sum;
            for a in o.iter_mut() {
                *a *= inv;
            }
        }
    }
}

/// The largest of `x` (−∞ when empty; no NaN expected), in 16 lanes.
#[inline(always)]
fn lane_max(x: &[f32]) -> f32 {
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    let mut lanes = [f32::NEG_INFINITY; 16];
    for ch in chunks {
        for l in 0..16 {
            lanes[l] = if ch[l] > lanes[l] { ch[l] } else { lanes[l] };
        }
    }
    lanes.iter().chain(tail).fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// `Σ x` in 16 lanes.
#[inline(always)]
fn lane_sum(x: &[f32]) -> f32 {
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    let mut lanes = [0.0f32; 16];
    for ch in chunks {
        for l in 0..16 {
            lanes[l] += ch[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}
