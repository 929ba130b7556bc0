//! The trained parameters as one flat gradient buffer, AdamW, and the
//! learning-rate schedule.
//!
//! Gradients of every parameter are accumulated (in float32, whatever the
//! parameter dtype) into one flat buffer with a view per parameter, so the
//! data-parallel all-reduce works on flat buckets of it directly and AdamW's
//! moments are flat too. Parameters stored in bfloat16 get float32 master
//! copies inside the optimiser; the bfloat16 weights are rounded from them
//! after every step.
use super::config::{AdamWConfig, LearnerConfig, LrSchedule};
use super::error::{LearnerError, Result};
use rlmesh_comm::ShardLayout;
use tch::{Device, Kind, Tensor};

/// The ordered trainable parameters and their flat float32 gradient buffer.
pub(crate) struct ParamSet {
    pub names: Vec<String>,
    pub tensors: Vec<Tensor>,
    pub offsets: Vec<usize>,
    /// Weight decay applies (matrices; not biases or norms).
    pub decay: Vec<bool>,
    pub total: usize,
    /// Flat float32 gradients, `total` elements.
    pub grads: Tensor,
    /// Parameter i's `.grad` is a view of its range of `grads` (float32 parameters):
    /// backward accumulates straight into the flat buffer.
    aliased: Vec<bool>,
    /// Every parameter is a contiguous float32 CPU tensor: AdamW may take its fused CPU path.
    pub fused_cpu: bool,
}

impl ParamSet {
    /// Parameters in the given order; the flat gradient buffer holds `flat_len`
    /// elements (at least their total: a sharded layout pads it, see [`ShardLayout::padded`]).
    pub(crate) fn new(named: Vec<(String, Tensor)>, device: Device, flat_len: Option<usize>) -> ParamSet {
        let mut offsets = Vec::with_capacity(named.len());
        let mut total = 0;
        for (_, t) in &named {
            offsets.push(total);
            total += t.numel();
        }
        let decay = named.iter().map(|(_, t)| t.dim() >= 2).collect();
        let (names, tensors): (Vec<String>, Vec<Tensor>) = named.into_iter().unzip();
        let fused_cpu = device == Device::Cpu && tensors.iter().all(|t| t.kind() == Kind::Float && t.is_contiguous());
        let grads = Tensor::zeros([flat_len.unwrap_or(total).max(total) as i64], (Kind::Float, device));
        let mut set = ParamSet { names, tensors, offsets, decay, total, grads, aliased: vec![], fused_cpu };
        set.alias_grads();
        set
    }

    /// Points every float32 parameter's `.grad` at its range of the flat buffer (as
    /// DDP's `gradient_as_bucket_view`): autograd then adds each micro-batch's gradient
    /// in place there, instead of into a separate tensor that is copied and zeroed.
    /// Lower-precision parameters keep their own `.grad`, converted by [`ParamSet::accumulate_grads`].
    fn alias_grads(&mut self) {
        self.aliased = self.tensors.iter().map(|t| t.kind() == Kind::Float && t.requires_grad()).collect();
        let float: Vec<usize> = (0..self.tensors.len()).filter(|&i| self.aliased[i]).collect();
        if float.is_empty() {
            return;
        }
        // A `.grad` must exist before it can be re-pointed: one backward through a zero-weighted
        // sum creates them (autograd's own tensors, replaced at once).
        let seed = float.iter().map(|&i| self.tensors[i].sum(Kind::Float)).fold(Tensor::zeros([], (Kind::Float, self.grads.device())), |a, b| a + b);
        (seed * 0.0).backward();
        tch::no_grad(|| {
            for &i in &float {
                let mut g = self.tensors[i].grad();
                let _ = g.set_source_tensor_(&self.view(&self.grads, i));
            }
        });
        let _ = self.grads.zero_();
    }

    /// The flat range of parameter `i`, viewed in its shape.
    pub(crate) fn view(&self, flat: &Tensor, i: usize) -> Tensor {
        let t = &self.tensors[i];
        flat.narrow(0, self.offsets[i] as i64, t.numel() as i64).view(t.size().as_slice())
    }

    /// Adds the non-aliased parameters' `.grad` into the flat buffer and clears them
    /// (the aliased ones are there already).
    pub(crate) fn accumulate_grads(&mut self) {
        tch::no_grad(|| {
            for i in 0..self.tensors.len() {
                if self.aliased[i] {
                    continue;
                }
                let mut g = self.tensors[i].grad();
                if g.defined() {
                    let _ = self.view(&self.grads, i).f_add_(&g.to_kind(Kind::Float)).expect("same shape");
                    let _ = g.detach_().zero_();
                }
            }
        });
    }

    /// Zeroes the flat gradient buffer.
    pub(crate) fn zero_grads(&mut self) {
        let _ = self.grads.zero_();
    }

    /// The parameters as `(name, tensor)` pairs.
    pub(crate) fn named(&self) -> Vec<(String, Tensor)> {
        self.names.iter().cloned().zip(self.tensors.iter().map(|t| t.detach())).collect()
    }

    /// The flat ranges `(start, len)` cut at parameter boundaries, each with its
    /// parameter and its position in it, and its offset counted along the ranges.
    pub(crate) fn segments(&self, ranges: &[(usize, usize)]) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut state = 0;
        for &(start, len) in ranges {
            let end = (start + len).min(self.total);
            let mut at = start;
            // The parameter holding `at`: the last whose offset is ≤ at.
            let mut i = self.offsets.partition_point(|&o| o <= at).saturating_sub(1);
            while at < end {
                let (lo, hi) = (self.offsets[i], self.offsets[i] + self.tensors[i].numel());
                let n = hi.min(end) - at;
                if n > 0 {
                    out.push(Segment { param: i, at: at - lo, flat: at, state: state + at - start, len: n });
                }
                at += n;
                i += 1;
            }
            state += len;
        }
        out
    }

    /// Parameter `i` as a flat view.
    pub(crate) fn flat_param(&self, i: usize) -> Tensor {
        self.tensors[i].view([-1])
    }
}

/// A run of one parameter's elements: parameter `param`, elements `at..at + len`
/// of it, at `flat` in the flat order and `state` in the optimizer state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub param: usize,
    pub at: usize,
    pub flat: usize,
    pub state: usize,
    pub len: usize,
}

/// The learning rate before optimizer step `step` (0-based), as transformers'
/// `get_constant_schedule_with_warmup` / `get_cosine_schedule_with_warmup` (the first warm-up step has rate 0).
pub fn lr_at(peak: f64, warmup: u64, schedule: LrSchedule, step: u64) -> f64 {
    if step < warmup {
        return peak * step as f64 / warmup.max(1) as f64;
    }
    match schedule {
        LrSchedule::Constant => peak,
        LrSchedule::Cosine { total_steps } => {
            let progress = (step - warmup) as f64 / (total_steps.saturating_sub(warmup)).max(1) as f64;
            peak * (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())).max(0.0)
        }
    }
}

/// Elements per piece of the AdamW update (4 MiB of float32).
const UPDATE_CHUNK: i64 = 1 << 20;

/// AdamW (torch.optim.AdamW semantics) over a [`ParamSet`], with flat float32
/// moments over the elements this rank owns ([`ShardLayout`]: all of them unsharded).
pub(crate) struct AdamW {
    cfg: AdamWConfig,
    m: Tensor,
    v: Tensor,
    /// Float32 master weights when some parameter is stored in a lower precision.
    master: Option<Tensor>,
    /// Optimizer steps taken.
    pub step: u64,
    /// The fused CPU update's buffer of square roots (one piece).
    scratch: Option<Tensor>,
    /// Who owns which elements, and which rank this is.
    pub layout: ShardLayout,
    pub rank: usize,
    /// This rank's elements, parameter by parameter, in state order.
    segments: Vec<Segment>,
}

impl AdamW {
    /// AdamW over the elements rank `rank` owns in `layout` (fresh moments, master weights from the parameters).
    pub(crate) fn new(params: &ParamSet, cfg: AdamWConfig, layout: ShardLayout, rank: usize) -> AdamW {
        let device = params.grads.device();
        let segments = params.segments(&layout.owned(rank));
        let len = layout.owned_len(rank) as i64;
        let zeros = || Tensor::zeros([len], (Kind::Float, device));
        let master = params.tensors.iter().any(|t| t.kind() != Kind::Float).then(|| {
            let flat: Vec<Tensor> = segments.iter().map(|s| params.flat_param(s.param).narrow(0, s.at as i64, s.len as i64).detach().to_kind(Kind::Float)).collect();
            if flat.is_empty() { zeros() } else { Tensor::cat(&flat, 0) }
        });
        AdamW { cfg, m: zeros(), v: zeros(), master, step: 0, scratch: None, layout, rank, segments }
    }

    /// Bytes of the state this rank holds (moments, master weights).
    pub(crate) fn state_bytes(&self) -> usize {
        self.state().iter().map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes()).sum()
    }

    /// The float32 master weights of every parameter, by name, when there are
    /// master weights and this rank holds all of them (unsharded).
    pub(crate) fn master_weights(&self, params: &ParamSet) -> Option<Vec<(String, Tensor)>> {
        let master = self.master.as_ref().filter(|_| self.layout.world == 1)?;
        Some((0..params.tensors.len()).map(|i| (params.names[i].clone(), params.view(master, i).copy())).collect())
    }

    /// This rank's elements, parameter by parameter.
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// One update with learning rate `lr` from `params.grads` times `grad_scale`
    /// (the clipping coefficient, applied on the fly: the flat buffer is not rewritten).
    #[allow(clippy::assign_op_pattern)] // `a = a + b` on tensors: `+=` would write in place into a tensor autograd or a view shares
    pub(crate) fn update(&mut self, params: &ParamSet, lr: f64, grad_scale: f64) {
        let c = self.cfg;
        self.step += 1;
        let bc1 = 1.0 - c.beta1.powi(self.step as i32);
        let bc2 = 1.0 - c.beta2.powi(self.step as i32);
        if self.master.is_none() && params.fused_cpu {
            let s = AdamWScalars::new(&c, lr, bc1, bc2, grad_scale);
            // SAFETY: `fused_cpu` says every parameter, the gradients and (by construction) the
            // moments are contiguous float32 CPU tensors; the pieces handed out are disjoint.
            unsafe { self.update_fused_cpu(params, &s) };
            return;
        }
        tch::no_grad(|| {
            for seg in &self.segments {
                let i = seg.param;
                let (len, state, flat) = (seg.len as i64, seg.state as i64, seg.flat as i64);
                let param = params.flat_param(i).narrow(0, seg.at as i64, len);
                let mut target = match &self.master {
                    Some(master) => master.narrow(0, state, len),
                    None => param.shallow_clone(),
                };
                if params.decay[i] && c.weight_decay != 0.0 {
                    let _ = target.g_mul_scalar_(1.0 - lr * c.weight_decay);
                }
                // Element-wise, so it runs chunk by chunk: the temporaries stay small (cache-sized,
                // reused by the allocator) instead of several fresh buffers of the whole model.
                let (m, v, g) = (self.m.narrow(0, state, len), self.v.narrow(0, state, len), params.grads.narrow(0, flat, len));
                for at in (0..len).step_by(UPDATE_CHUNK as usize) {
                    let n = UPDATE_CHUNK.min(len - at);
                    let (m, v, mut g) = (m.narrow(0, at, n), v.narrow(0, at, n), g.narrow(0, at, n));
                    if grad_scale != 1.0 {
                        g = g * grad_scale;
                    }
                    let _ = m.shallow_clone().lerp_(&g, 1.0 - c.beta1);
                    let _ = v.shallow_clone().g_mul_scalar_(c.beta2).addcmul_(&g, &(&g * (1.0 - c.beta2)));
                    let denom = v.sqrt() / bc2.sqrt() + c.eps;
                    let update = (&m / denom) * (lr / bc1);
                    let _ = target.narrow(0, at, n).g_sub_(&update);
                }
                if self.master.is_some() {
                    param.shallow_clone().copy_(&target);
                }
            }
        });
    }

    /// The CPU update, piece by cache-sized piece: the moments in one Rust pass,
    /// `√v` by libtorch into a small scratch buffer (its MKL square root rounds a
    /// few elements differently from IEEE `sqrtf`; using it keeps the result
    /// bit-identical to the tensor path), then the parameters in a second pass
    /// while the piece is still in cache. Each array crosses memory once.
    ///
    /// # Safety
    /// Every parameter, the gradients and the moments must be contiguous float32 CPU tensors.
    unsafe fn update_fused_cpu(&mut self, params: &ParamSet, s: &AdamWScalars) {
        let scratch = self.scratch.get_or_insert_with(|| Tensor::empty([FUSED_PIECE as i64], (Kind::Float, Device::Cpu)));
        let ptr = |t: &Tensor| t.data_ptr() as *mut f32;
        let (m, v, g, root) = (ptr(&self.m), ptr(&self.v), ptr(&params.grads), ptr(scratch));
        for seg in &self.segments {
            let (p, decay) = (ptr(&params.tensors[seg.param]), params.decay[seg.param]);
            for at in (0..seg.len).step_by(FUSED_PIECE) {
                let n = FUSED_PIECE.min(seg.len - at);
                let (flat, state, own) = (seg.flat + at, seg.state + at, seg.at + at);
                // SAFETY: [flat, flat + n) lies inside the flat gradients, [state, state + n) inside
                // the moments and [own, own + n) inside the parameter; the scratch holds
                // FUSED_PIECE ≥ n elements; nothing else touches them.
                unsafe {
                    adamw_moments(
                        std::slice::from_raw_parts(g.add(flat), n),
                        std::slice::from_raw_parts_mut(m.add(state), n),
                        std::slice::from_raw_parts_mut(v.add(state), n),
                        s,
                    );
                    let _ = self.v.narrow(0, state as i64, n as i64).sqrt_out(&scratch.narrow(0, 0, n as i64));
                    adamw_apply(
                        std::slice::from_raw_parts_mut(p.add(own), n),
                        std::slice::from_raw_parts(m.add(state), n),
                        std::slice::from_raw_parts(root, n),
                        s,
                        decay,
                    );
                }
            }
        }
    }

    /// The state to checkpoint: moments and master weights, by name.
    pub(crate) fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("exp_avg".to_string(), self.m.shallow_clone()), ("exp_avg_sq".to_string(), self.v.shallow_clone())];
        if let Some(master) = &self.master {
            out.push(("master".to_string(), master.shallow_clone()));
        }
        out
    }

    /// Restores the state saved by the ranks of `saved` (each rank's [`AdamW::state`],
    /// read by `read(rank)`) and the step count. The same layout loads this rank's
    /// own file; another (other ranks, another bucket, unsharded ↔ sharded) takes
    /// each element from the rank that owned it, reading each such file once.
    pub(crate) fn load_state(&mut self, saved: &ShardLayout, mut read: impl FnMut(usize) -> Result<Vec<(String, Tensor)>>, step: u64, path: &std::path::Path) -> Result<()> {
        let bad = |message: String| LearnerError::Checkpoint { path: path.to_path_buf(), message };
        if saved.total != self.layout.total {
            return Err(bad(format!("optimizer state of {} elements, the model has {}", saved.total, self.layout.total)));
        }
        let names: Vec<&str> = ["exp_avg", "exp_avg_sq"].into_iter().chain(self.master.as_ref().map(|_| "master")).collect();
        let pieces = if *saved == self.layout {
            vec![(0, self.rank, 0, self.layout.owned_len(self.rank))]
        } else {
            self.layout.pieces_from(self.rank, saved)
        };
        for from in 0..saved.world {
            let mine: Vec<_> = pieces.iter().filter(|p| p.1 == from && p.3 > 0).collect();
            if mine.is_empty() {
                continue;
            }
            let tensors = read(from)?;
            for &name in &names {
                let src = tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t).ok_or_else(|| bad(format!("rank {from}'s tensor {name} missing")))?;
                let want = saved.owned_len(from) as i64;
                if src.size() != [want] {
                    return Err(bad(format!("rank {from}'s tensor {name}: shape {:?}, its layout needs [{want}]", src.size())));
                }
                let dst = match name {
                    "exp_avg" => &self.m,
                    "exp_avg_sq" => &self.v,
                    _ => self.master.as_ref().expect("named only with master weights"),
                };
                tch::no_grad(|| {
                    for &&(at, _, off, n) in &mine {
                        dst.narrow(0, at as i64, n as i64).copy_(&src.narrow(0, off as i64, n as i64));
                    }
                });
            }
        }
        self.step = step;
        Ok(())
    }
}

/// Elements per piece of the fused CPU update (256 KiB per array: the piece's
/// gradient, moments, parameters and square roots stay in L2 between the passes).
const FUSED_PIECE: usize = 1 << 16;

/// The scalars of one AdamW update, in float32 as libtorch applies them to float32 tensors.
#[derive(Clone, Copy, Debug)]
pub struct AdamWScalars {
    /// `1 − lr·weight_decay` (applied to decayed parameters).
    pub decay: f32,
    /// `1 − β₁`, the weight of `m`'s lerp towards the gradient.
    pub w1: f32,
    /// β₂.
    pub beta2: f32,
    /// `1 − β₂`.
    pub w2: f32,
    /// `√(1 − β₂ᵗ)`.
    pub bc2_sqrt: f32,
    /// ε.
    pub eps: f32,
    /// `lr / (1 − β₁ᵗ)`.
    pub step_size: f32,
    /// Factor on every gradient (gradient-norm clipping).
    pub grad_scale: f32,
}

impl AdamWScalars {
    /// The scalars of a step with learning rate `lr` and bias corrections `bc1`, `bc2`.
    pub fn new(c: &AdamWConfig, lr: f64, bc1: f64, bc2: f64, grad_scale: f64) -> AdamWScalars {
        AdamWScalars {
            decay: (1.0 - lr * c.weight_decay) as f32,
            w1: (1.0 - c.beta1) as f32,
            beta2: c.beta2 as f32,
            w2: (1.0 - c.beta2) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            eps: c.eps as f32,
            step_size: (lr / bc1) as f32,
            grad_scale: grad_scale as f32,
        }
    }
}

// The two halves of AdamW's element-wise arithmetic on flat float32 ranges, as the
// tensor path computes it on the clipped gradient `g·grad_scale`:
//   m ← m.lerp(g, 1 − β₁)            (one rounding: libtorch's vectorised lerp is an FMA)
//   v ← v·β₂ + g·(g·(1 − β₂))        (one rounding in the addition, as its addcmul)
//   p ← p·(1 − lr·wd) − step_size · m / (√v / √bc₂ + ε)
// On a CPU with FMA the result is bit-for-bit the tensor path's (tested).

/// Updates the moments `m`, `v` of a range from its gradient `g`.
pub fn adamw_moments(g: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamWScalars) {
    assert!(m.len() == g.len() && v.len() == g.len(), "adamw_moments: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if rlmesh_model::isa::avx2_fma() {
        // SAFETY: the CPU has both features.
        unsafe { moments_avx2_fma(g, m, v, s) };
        return;
    }
    moments_kernel(g, m, v, s);
}

/// Applies a range's update from its first moment `m` and `root` = √v (decay when `decay`).
pub fn adamw_apply(p: &mut [f32], m: &[f32], root: &[f32], s: &AdamWScalars, decay: bool) {
    assert!(m.len() == p.len() && root.len() == p.len(), "adamw_apply: lengths differ");
    let factor = if decay { s.decay } else { 1.0 };
    for ((p, &m), &r) in p.iter_mut().zip(m).zip(root) {
        *p = *p * factor - s.step_size * (m / (r / s.bc2_sqrt + s.eps));
    }
}

/// [`moments_kernel`] compiled for AVX2 with hardware FMA (the build's baseline has neither).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn moments_avx2_fma(g: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamWScalars) {
    moments_kernel(g, m, v, s);
}

#[inline(always)]
fn moments_kernel(g: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamWScalars) {
    for ((&g, m), v) in g.iter().zip(m.iter_mut()).zip(v.iter_mut()) {
        let g = g * s.grad_scale;
        *m = s.w1.mul_add(g - *m, *m);
        *v = g.mul_add(g * s.w2, *v * s.beta2);
    }
}

/// Learning rate for the next optimizer step of a config.
pub(crate) fn next_lr(cfg: &LearnerConfig, step: u64) -> f64 {
    lr_at(cfg.optim.lr, cfg.warmup_steps, cfg.schedule, step)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` deterministic values in (−2, 2) (tests run in parallel: libtorch's global seed would race).
    fn values(n: usize, seed: u64) -> Tensor {
        let mut s = seed;
        let v: Vec<f32> = (0..n).map(|_| ((crate::learner::trainer::splitmix(&mut s) >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0).collect();
        Tensor::from_slice(&v)
    }

    fn params(seed: u64) -> ParamSet {
        let w = values(371 * 290, seed).view([371, 290]).set_requires_grad(true);
        let b = values(290, seed + 1).set_requires_grad(true);
        ParamSet::new(vec![("b".into(), b), ("w".into(), w)], Device::Cpu, None)
    }

    /// The fused CPU update computes what the tensor path (GPUs, bfloat16 masters) computes,
    /// with decay on matrices only and the clipping factor applied to the gradient.
    #[test]
    fn fused_cpu_update_matches_the_tensor_path() {
        let cfg = AdamWConfig { lr: 3e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
        let (fused, mut plain) = (params(7), params(7));
        assert!(fused.fused_cpu);
        plain.fused_cpu = false;
        let whole = ShardLayout::whole(fused.total);
        let (mut a, mut b) = (AdamW::new(&fused, cfg, whole, 0), AdamW::new(&plain, cfg, whole, 0));
        for step in 0..4 {
            let g = values(fused.total, 100 + step);
            fused.grads.shallow_clone().copy_(&g);
            plain.grads.shallow_clone().copy_(&g);
            let scale = if step % 2 == 0 { 1.0 } else { 0.37 };
            a.update(&fused, 1e-3 * (step + 1) as f64, scale);
            b.update(&plain, 1e-3 * (step + 1) as f64, scale);
        }
        // With hardware FMA libtorch's vectorised kernels round where the fused loop does: bit-identical.
        #[cfg(target_arch = "x86_64")]
        let tolerance = if rlmesh_model::isa::avx2_fma() { 0.0 } else { 1e-6 };
        #[cfg(not(target_arch = "x86_64"))]
        let tolerance = 1e-6;
        for i in 0..2 {
            let diff = (&fused.tensors[i] - &plain.tensors[i]).abs().max().double_value(&[]);
            assert!(diff <= tolerance, "{}: fused and tensor updates differ by {diff}", fused.names[i]);
            let moved = (&fused.tensors[i] - &params(7).tensors[i]).abs().max().double_value(&[]);
            assert!(moved > 1e-3, "{}: the update did not move the parameter", fused.names[i]);
        }
        for (x, y) in [(&a.m, &b.m), (&a.v, &b.v)] {
            let diff = (x - y).abs().max().double_value(&[]);
            assert!(diff <= tolerance, "moments differ by {diff}");
        }
    }

    /// Each float32 parameter's `.grad` is its range of the flat buffer, so backward
    /// accumulates there and zeroing the buffer zeroes them.
    #[test]
    fn parameter_gradients_are_views_of_the_flat_buffer() {
        let mut set = params(3);
        for round in 1..=2 {
            let loss = (&set.tensors[1] * 2.0).sum(Kind::Float) + (&set.tensors[0] * &set.tensors[0]).sum(Kind::Float);
            loss.backward();
            set.accumulate_grads();
            let w = set.view(&set.grads, 1);
            let expect = Tensor::full([371, 290], 2.0 * round as f64, (Kind::Float, Device::Cpu));
            assert!(w.allclose(&expect, 0.0, 0.0, false), "round {round}: the matrix's gradient is not in the flat buffer");
            let bias = set.view(&set.grads, 0);
            assert!(bias.allclose(&(set.tensors[0].detach() * 2.0 * round as f64), 1e-6, 1e-6, false));
        }
        assert_eq!(set.tensors[1].grad().data_ptr(), set.view(&set.grads, 1).data_ptr());
        set.zero_grads();
        assert_eq!(set.tensors[1].grad().abs().sum(Kind::Float).double_value(&[]), 0.0);
    }
}
