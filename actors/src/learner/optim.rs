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
}

impl ParamSet {
    /// Parameters in the given order.
    pub(crate) fn new(named: Vec<(String, Tensor)>, device: Device) -> ParamSet {
        let mut offsets = Vec::with_capacity(named.len());
        let mut total = 0;
        for (_, t) in &named {
            offsets.push(total);
            total += t.numel();
        }
        let decay = named.iter().map(|(_, t)| t.dim() >= 2).collect();
        let (names, tensors) = named.into_iter().unzip();
        ParamSet { names, tensors, offsets, decay, total, grads: Tensor::zeros([total as i64], (Kind::Float, device)) }
    }

    /// The flat range of parameter `i`, viewed in its shape.
    pub(crate) fn view(&self, flat: &Tensor, i: usize) -> Tensor {
        let t = &self.tensors[i];
        flat.narrow(0, self.offsets[i] as i64, t.numel() as i64).view(t.size().as_slice())
    }

    /// Adds the parameters' `.grad` into the flat buffer and clears them.
    pub(crate) fn accumulate_grads(&mut self) {
        tch::no_grad(|| {
            for i in 0..self.tensors.len() {
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

/// AdamW (torch.optim.AdamW semantics) over a [`ParamSet`], with flat float32 moments.
pub(crate) struct AdamW {
    cfg: AdamWConfig,
    m: Tensor,
    v: Tensor,
    /// Float32 master weights when some parameter is stored in a lower precision.
    master: Option<Tensor>,
    /// Optimizer steps taken.
    pub step: u64,
}

impl AdamW {
    pub(crate) fn new(params: &ParamSet, cfg: AdamWConfig) -> AdamW {
        let device = params.grads.device();
        let zeros = || Tensor::zeros([params.total as i64], (Kind::Float, device));
        let master = params.tensors.iter().any(|t| t.kind() != Kind::Float).then(|| {
            let flat: Vec<Tensor> = params.tensors.iter().map(|t| t.detach().to_kind(Kind::Float).reshape([-1])).collect();
            Tensor::cat(&flat, 0)
        });
        AdamW { cfg, m: zeros(), v: zeros(), master, step: 0 }
    }

    /// One update with learning rate `lr` from `params.grads`.
    pub(crate) fn update(&mut self, params: &ParamSet, lr: f64) {
        let c = self.cfg;
        self.step += 1;
        let bc1 = 1.0 - c.beta1.powi(self.step as i32);
        let bc2 = 1.0 - c.beta2.powi(self.step as i32);
        tch::no_grad(|| {
            for i in 0..params.tensors.len() {
                let mut target = match &self.master {
                    Some(master) => params.view(master, i),
                    None => params.tensors[i].shallow_clone(),
                };
                if params.decay[i] && c.weight_decay != 0.0 {
                    let _ = target.g_mul_scalar_(1.0 - lr * c.weight_decay);
                }
                // Element-wise, so it runs chunk by chunk: the temporaries stay small (cache-sized,
                // reused by the allocator) instead of several fresh buffers of the whole model.
                let n = target.numel() as i64;
                let flat_target = target.view([-1]);
                let (m, v, g) = (params.view(&self.m, i).view([-1]), params.view(&self.v, i).view([-1]), params.view(&params.grads, i).view([-1]));
                for at in (0..n).step_by(UPDATE_CHUNK as usize) {
                    let len = UPDATE_CHUNK.min(n - at);
                    let (m, v, g) = (m.narrow(0, at, len), v.narrow(0, at, len), g.narrow(0, at, len));
                    let _ = m.shallow_clone().lerp_(&g, 1.0 - c.beta1);
                    let _ = v.shallow_clone().g_mul_scalar_(c.beta2).addcmul_(&g, &(&g * (1.0 - c.beta2)));
                    let denom = v.sqrt() / bc2.sqrt() + c.eps;
                    let update = (&m / denom) * (lr / bc1);
                    let _ = flat_target.narrow(0, at, len).g_sub_(&update);
                }
                if self.master.is_some() {
                    let _ = params.tensors[i].shallow_clone().copy_(&target);
                }
            }
        });
    }

    /// The state to checkpoint: moments and master weights, by name.
    pub(crate) fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("exp_avg".to_string(), self.m.shallow_clone()), ("exp_avg_sq".to_string(), self.v.shallow_clone())];
        if let Some(master) = &self.master {
            out.push(("master".to_string(), master.shallow_clone()));
        }
        out
    }

    /// Restores [`AdamW::state`] (shapes checked) and the step count.
    pub(crate) fn load_state(&mut self, tensors: &[(String, Tensor)], step: u64, path: &std::path::Path) -> Result<()> {
        let get = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        let targets: Vec<(&str, &Tensor)> =
            [("exp_avg", &self.m), ("exp_avg_sq", &self.v)].into_iter().chain(self.master.as_ref().map(|m| ("master", m))).collect();
        for (name, target) in targets {
            let src = get(name).ok_or_else(|| LearnerError::Checkpoint { path: path.to_path_buf(), message: format!("tensor {name} missing") })?;
            if src.size() != target.size() {
                return Err(LearnerError::Checkpoint {
                    path: path.to_path_buf(),
                    message: format!("tensor {name}: shape {:?}, the model needs {:?}", src.size(), target.size()),
                });
            }
            tch::no_grad(|| target.shallow_clone().copy_(src));
        }
        self.step = step;
        Ok(())
    }
}

/// Learning rate for the next optimizer step of a config.
pub(crate) fn next_lr(cfg: &LearnerConfig, step: u64) -> f64 {
    lr_at(cfg.optim.lr, cfg.warmup_steps, cfg.schedule, step)
}
