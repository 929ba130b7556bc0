//! [`Learner`]: one data-parallel rank's model, optimiser and training steps.
use super::batch::{SftBatch, TrainBatch};
use super::micro::{self, MicroBatch, Packing, Targets, Unit};
use super::config::{KlCoef, KlPlacement, LearnerConfig, Shard};
use super::error::{LearnerError, Result};
use super::loss::{self, Aggregation, BatchTotals};
use super::optim::{next_lr, AdamW, ParamSet};
use super::parallel::{digest_tensors, DataParallel};
use super::stats::Sums;
pub use super::stats::{RatioStats, StepStats};
use super::value::ValueHead;
use rlmesh_comm::{Collective, ShardLayout};
use rlmesh_model::Transformer;
use rlmesh_core::advantage::steptool::{steptool_advantages, StepToolParams, StepToolRollout};
use std::time::Instant;
use tch::{Kind, Tensor};

/// What a step optimises.
#[derive(Clone, Copy)]
enum Objective<'a> {
    Policy(&'a TrainBatch),
    Sft(&'a SftBatch),
}

impl Objective<'_> {
    fn len(&self) -> usize {
        match self {
            Objective::Policy(b) => b.sequences.len(),
            Objective::Sft(b) => b.sequences.len(),
        }
    }
    fn masked(&self, i: usize) -> usize {
        let m = match self {
            Objective::Policy(b) => &b.sequences[i].loss_mask,
            Objective::Sft(b) => &b.sequences[i].loss_mask,
        };
        m.iter().map(|&x| x as usize).sum()
    }

    /// The step's micro-batches over sequences `idx` ([`super::micro`]): policy steps in
    /// the configured layout; SFT rows packed end to end (its loss is a plain token mean,
    /// blind to rows) when `pack_sft`, else padded.
    fn plan(&self, idx: &[usize], cfg: &LearnerConfig) -> Vec<Piece> {
        let padded = |s: &dyn Fn(&[usize]) -> Vec<Vec<usize>>| s(idx).into_iter().map(Piece::Rows).collect();
        match (self, cfg.packing()) {
            (Objective::Policy(b), Packing::Padded) => padded(&|idx| micro::plan_padded(*b, idx, cfg.micro_batch_size)),
            (Objective::Policy(b), p) => {
                micro::plan_packed(*b, idx, cfg.micro_batch_tokens, p == Packing::SharedPrefix).into_iter().map(Piece::Units).collect()
            }
            (Objective::Sft(b), _) if cfg.pack_sft => micro::pack_rows(*b, idx)
                .chunks(cfg.micro_batch_size.max(1))
                .map(|rows| Piece::Units(rows.iter().flatten().map(|&i| Unit::Alone(i)).collect()))
                .collect(),
            (Objective::Sft(b), _) => padded(&|idx| micro::plan_padded(*b, idx, cfg.micro_batch_size)),
        }
    }

    fn micro(&self, piece: &Piece, device: tch::Device) -> MicroBatch {
        match (self, piece) {
            (Objective::Policy(b), Piece::Rows(r)) => MicroBatch::padded(*b, Some(b), r, Targets::Masked, device),
            (Objective::Policy(b), Piece::Units(u)) => MicroBatch::packed(*b, Some(b), u, Targets::Masked, device),
            (Objective::Sft(b), Piece::Rows(r)) => MicroBatch::padded(*b, None, r, Targets::Masked, device),
            (Objective::Sft(b), Piece::Units(u)) => MicroBatch::packed(*b, None, u, Targets::Masked, device),
        }
    }
}

/// The sequences of one micro-batch: padded rows, or packed units.
enum Piece {
    Rows(Vec<usize>),
    Units(Vec<Unit>),
}

/// Outputs of one forward pass over a micro-batch, one per target `[K]`.
struct Forward {
    logp: Tensor,
    entropy: Tensor,
    values: Option<Tensor>,
}

/// The splitmix64 generator: the learner's only randomness (mini-batch shuffling).
pub(crate) fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded permutation of `0..n` (Fisher–Yates).
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut s = seed;
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        p.swap(i, (splitmix(&mut s) % (i as u64 + 1)) as usize);
    }
    p
}

/// One learner rank: the policy, its optional value head and reference, AdamW, and the collective.
pub struct Learner {
    pub(crate) model: Transformer,
    lm_head: Tensor,
    reference: Option<Transformer>,
    pub(crate) value_head: Option<ValueHead>,
    pub(crate) config: LearnerConfig,
    pub(crate) params: ParamSet,
    pub(crate) optim: AdamW,
    dp: Option<DataParallel>,
    pub(crate) kl_coef: f64,
    pub(crate) rng: u64,
    pub(crate) train_steps: u64,
    /// The gradient-norm clipping factor of the last optimizer step (1 when not clipped).
    grad_scale: f64,
    /// Seconds spent in collectives during the current call.
    comm_seconds: f64,
}

impl Learner {
    /// A learner training `model` (its `VarStore` is the set of trained
    /// parameters); `comm` joins the data-parallel ranks, whose parameters
    /// are checked to be identical here already.
    pub fn new(model: Transformer, config: LearnerConfig, comm: Option<Box<dyn Collective>>) -> Result<Learner> {
        config.validate()?;
        let device = model.device();
        let vars = model.vs.variables();
        let lm_head = vars.get("lm_head.weight").or_else(|| vars.get("model.embed_tokens.weight")).map(Tensor::shallow_clone).ok_or(
            LearnerError::Config { field: "model", message: "the model has neither lm_head.weight nor model.embed_tokens.weight".into() },
        )?;
        let value_head = config.value.map(|_| ValueHead::new(model.config.hidden_size, device));
        let mut named: Vec<(String, Tensor)> = vars.into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(v) = &value_head {
            named.extend(v.named());
        }
        // Under `shard`, this rank updates only the elements it owns ([`ShardLayout`]).
        let (rank, world) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.world_size()));
        let total = named.iter().map(|(_, t)| t.numel()).sum();
        let (layout, owner) = match config.shard.splits_optimizer() {
            true => (ShardLayout::for_bytes(total, world, config.bucket_bytes), rank),
            false => (ShardLayout::whole(total), 0),
        };
        let params = ParamSet::new(named, device, Some(layout.padded()));
        let optim = AdamW::new(&params, config.optim, layout, owner);
        let kl_coef = match config.kl.map(|k| k.coef) {
            Some(KlCoef::Fixed { beta }) => beta,
            Some(KlCoef::Adaptive { init, .. }) => init,
            None => 0.0,
        };
        let mut learner = Learner {
            model,
            lm_head,
            reference: None,
            value_head,
            rng: config.seed,
            config,
            params,
            optim,
            dp: comm.map(|c| DataParallel::new(c, device)),
            kl_coef,
            train_steps: 0,
            grad_scale: 1.0,
            comm_seconds: 0.0,
        };
        learner.verify_digest()?;
        Ok(learner)
    }

    /// Switch to new settings (e.g. from SFT warm-up to RL): the optimiser
    /// restarts with fresh moments at step 0; the value head must stay as it is.
    pub fn reconfigure(&mut self, config: LearnerConfig) -> Result<()> {
        config.validate()?;
        if config.value.is_some() != self.value_head.is_some() {
            return Err(LearnerError::Config { field: "value", message: "a value head cannot be added or removed by reconfigure".into() });
        }
        let sharded = self.config.shard.splits_optimizer();
        for (field, same) in [("shard", config.shard == self.config.shard), ("dtype", config.dtype == self.config.dtype), ("bucket_bytes", !sharded || config.bucket_bytes == self.config.bucket_bytes)] {
            if !same {
                return Err(LearnerError::Config { field, message: "fixed when the learner is built; reconfigure cannot change it".into() });
            }
        }
        self.optim = AdamW::new(&self.params, config.optim, self.optim.layout, self.optim.rank);
        if let Some(k) = config.kl {
            self.kl_coef = match k.coef {
                KlCoef::Fixed { beta } => beta,
                KlCoef::Adaptive { init, .. } => init,
            };
            // The reference is the policy as it is now (after the warm-up): frozen, checkpointed with the learner.
            if self.reference.is_none() {
                self.set_reference(self.frozen_copy()?);
            }
        }
        self.config = config;
        Ok(())
    }

    /// A frozen copy of the policy's current weights.
    fn frozen_copy(&self) -> Result<Transformer> {
        let mut copy = Transformer::new(self.model.config.clone(), self.model.device(), self.model.kind());
        tch::no_grad(|| copy.vs.copy(&self.model.vs))?;
        copy.vs.freeze();
        Ok(copy)
    }

    /// The frozen reference policy, when there is one.
    pub fn reference(&self) -> Option<&Transformer> {
        self.reference.as_ref()
    }

    /// Turns per-token `rewards` into advantages, values and returns when the
    /// learner computes GAE (`gae`), on the whole batch before it is sharded:
    /// the value head's outputs now (the rollout-time values of the value
    /// clip), the KL to the reference in the reward when `kl` is placed there
    /// (`logp` the behaviour log-probs, as TRL's PPO takes them), GAE, and
    /// advantages whitened over every masked token of the batch.
    pub fn prepare(&self, batch: &mut TrainBatch) -> Result<()> {
        let Some(g) = self.config.gae else { return Ok(()) };
        if let Some(i) = batch.sequences.iter().position(|s| s.rewards.is_none()) {
            return Err(LearnerError::Batch { index: i, field: "rewards", message: "required by GAE (gae), missing".into() });
        }
        let values = self.values(batch)?;
        let in_reward = self.config.kl.is_some_and(|k| k.placement == KlPlacement::Reward);
        let refs: Option<Vec<Vec<f32>>> = match (in_reward, batch.sequences.iter().all(|s| s.ref_logprobs.is_some())) {
            (false, _) => None,
            (true, true) => Some(batch.sequences.iter().map(|s| s.ref_logprobs.clone().expect("checked")).collect()),
            (true, false) => Some(self.reference_logprobs(batch)?),
        };
        let rewards: Vec<Vec<f64>> = batch.sequences.iter().map(|s| s.rewards.as_deref().expect("checked").iter().map(|&r| f64::from(r)).collect()).collect();
        let rollouts: Vec<StepToolRollout<'_>> = batch
            .sequences
            .iter()
            .enumerate()
            .map(|(i, s)| StepToolRollout {
                loss_mask: &s.loss_mask,
                token_rewards: &rewards[i],
                values: &values[i],
                logprobs: refs.as_ref().map(|r| (s.behaviour_logprobs.as_slice(), r[i].as_slice())),
            })
            .collect();
        let params = StepToolParams { gamma: g.gamma, lam: g.lam, kl_coef: if in_reward { self.kl_coef } else { 0.0 }, upstream_weighting: false };
        let out = steptool_advantages(&rollouts, &params).map_err(|e| LearnerError::Batch { index: 0, field: "rewards", message: e.to_string() })?;
        drop(rollouts);
        for (((s, a), r), v) in batch.sequences.iter_mut().zip(out.advantages).zip(out.returns).zip(values) {
            s.advantages = a;
            s.returns = Some(r);
            s.values = Some(v);
        }
        Ok(())
    }

    /// Sets the frozen reference policy used for KL when a batch carries no reference log-probs.
    pub fn set_reference(&mut self, mut reference: Transformer) {
        reference.vs.freeze();
        self.reference = Some(reference);
    }

    /// The policy being trained.
    pub fn model(&self) -> &Transformer {
        &self.model
    }

    /// The configuration.
    pub fn config(&self) -> &LearnerConfig {
        &self.config
    }

    /// The current KL coefficient β (None without KL).
    pub fn kl_coef(&self) -> Option<f64> {
        self.config.kl.map(|_| self.kl_coef)
    }

    /// Optimizer steps taken so far.
    pub fn optimizer_steps(&self) -> u64 {
        self.optim.step
    }

    /// Train (or SFT) steps taken so far.
    pub fn train_steps(&self) -> u64 {
        self.train_steps
    }

    /// This rank and the number of ranks.
    pub fn rank(&self) -> (usize, usize) {
        self.dp.as_ref().map(|d| (d.rank(), d.world())).unwrap_or((0, 1))
    }

    /// The gradients of the last optimizer step (all-reduced and clipped), by parameter name.
    /// Under `shard` the flat buffer carries the parameters' all-gather after the update:
    /// only with `shard = "none"` does it still hold them.
    pub fn gradients(&self) -> Vec<(String, Tensor)> {
        let clipped = tch::no_grad(|| &self.params.grads * self.grad_scale);
        (0..self.params.names.len()).map(|i| (self.params.names[i].clone(), self.params.view(&clipped, i).copy())).collect()
    }

    /// AdamW's float32 master weights by parameter name: with lower-precision
    /// parameters and unsharded state (None otherwise).
    pub fn master_weights(&self) -> Option<Vec<(String, Tensor)>> {
        self.optim.master_weights(&self.params)
    }

    /// Bytes of optimizer state this rank holds (AdamW's moments and master weights):
    /// under `shard`, about `1/world` of an unsharded rank's.
    pub fn optimizer_state_bytes(&self) -> usize {
        self.optim.state_bytes()
    }

    /// Returns once every data-parallel rank has entered (at once with one rank).
    pub(crate) fn barrier(&mut self) -> Result<()> {
        self.dp.as_mut().map_or(Ok(()), DataParallel::barrier)
    }

    /// Takes the data-parallel communicator out (to hand it to a resumed learner).
    pub fn take_comm(&mut self) -> Option<Box<dyn Collective>> {
        self.dp.take().map(DataParallel::into_comm)
    }

    /// A digest of every trained parameter (policy and value head): equal across ranks after every step.
    pub fn parameter_digest(&self) -> Result<u64> {
        digest_tensors(&self.params.named())
    }

    /// One policy-gradient step on this rank's share of a batch: `ppo_epochs`
    /// passes, each split into `mini_batches` optimizer steps, each
    /// accumulated over micro-batches of `micro_batch_size` sequences.
    pub fn train_step(&mut self, batch: &TrainBatch) -> Result<StepStats> {
        batch.validate(self.model.config.vocab_size, self.config.value.is_some())?;
        if self.config.kl.is_some() && self.reference.is_none() {
            if let Some(i) = batch.sequences.iter().position(|s| s.ref_logprobs.is_none()) {
                return Err(LearnerError::Batch {
                    index: i,
                    field: "ref_logprobs",
                    message: "missing, and the learner has no reference model to compute them".into(),
                });
            }
        }
        let (stats, kl_per_sequence) = self.run(Objective::Policy(batch), self.config.ppo_epochs, self.config.mini_batches)?;
        if let Some(KlCoef::Adaptive { target, horizon, .. }) = self.config.kl.map(|k| k.coef) {
            // TRL's controller takes the KL summed over a sequence's tokens, averaged over sequences.
            let mut ctl = loss::AdaptiveKl { value: self.kl_coef, target, horizon };
            ctl.update(kl_per_sequence, stats.sequences as f64);
            self.kl_coef = ctl.value;
        }
        Ok(stats)
    }

    /// One supervised step: cross-entropy on the masked tokens (token mean over the batch), one optimizer step.
    pub fn sft_step(&mut self, batch: &SftBatch) -> Result<StepStats> {
        batch.validate(self.model.config.vocab_size)?;
        Ok(self.run(Objective::Sft(batch), 1, 1)?.0)
    }

    /// Value-head outputs for each token of each sequence (element `i` is the value before token `i`; 0 for token 0).
    pub fn values(&self, batch: &TrainBatch) -> Result<Vec<Vec<f32>>> {
        let head = self.value_head.as_ref().ok_or(LearnerError::Config { field: "value", message: "the learner has no value head".into() })?;
        self.per_token(batch, &self.model, |h, _| head.forward(h))
    }

    /// Reference-policy log-probs for each token (element `i` is log P(token i | ..i); 0 for token 0).
    pub fn reference_logprobs(&self, batch: &TrainBatch) -> Result<Vec<Vec<f32>>> {
        let r = self.reference.as_ref().ok_or(LearnerError::Config { field: "kl", message: "the learner has no reference model".into() })?;
        self.per_token(batch, r, |h, targets| r.output_logprobs(h).gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1))
    }

    /// `head(hidden states, targets)` at every token after the first of every sequence,
    /// with `model`, in the micro-batches and layout the learner trains with.
    fn per_token(&self, batch: &TrainBatch, model: &Transformer, head: impl Fn(&Tensor, &Tensor) -> Tensor) -> Result<Vec<Vec<f32>>> {
        let mut out = vec![vec![]; batch.sequences.len()];
        let all: Vec<usize> = (0..batch.sequences.len()).collect();
        for piece in Objective::Policy(batch).plan(&all, &self.config) {
            let mb = match &piece {
                Piece::Rows(r) => MicroBatch::padded(batch, None, r, Targets::All, model.device()),
                Piece::Units(u) => MicroBatch::packed(batch, None, u, Targets::All, model.device()),
            };
            let v = tch::no_grad(|| -> Result<Tensor> {
                let h = mb.input.hidden_states(model)?.index_select(0, &mb.src);
                Ok(head(&h, &mb.targets))
            })?;
            let flat = Vec::<f32>::try_from(v.to_device(tch::Device::Cpu).to_kind(Kind::Float).contiguous())?;
            let mut at = 0;
            for &i in &mb.order {
                let n = batch.sequences[i].token_ids.len();
                let mut row = vec![0.0f32; n];
                row[1..].copy_from_slice(&flat[at..at + n - 1]);
                at += n - 1;
                out[i] = row;
            }
        }
        Ok(out)
    }

    /// The optimizer steps of one call: its statistics and the KL summed per sequence, averaged over sequences.
    fn run(&mut self, obj: Objective<'_>, epochs: usize, mini_batches: usize) -> Result<(StepStats, f64)> {
        let start = Instant::now();
        self.comm_seconds = 0.0;
        let n = obj.len();
        let mut total = Sums::new();
        let (mut grad_norm, mut lr, mut steps, mut sequences) = (0.0, 0.0, 0u64, 0.0);
        for _ in 0..epochs {
            let order = permutation(n, splitmix(&mut self.rng));
            for j in 0..mini_batches {
                let idx = &order[j * n / mini_batches..(j + 1) * n / mini_batches];
                let (sums, norm, step_lr, seqs) = self.optimizer_step(obj, idx)?;
                total.merge(&sums);
                grad_norm += norm;
                lr = step_lr;
                sequences += seqs;
                steps += 1;
            }
        }
        self.train_steps += 1;
        let seconds = start.elapsed().as_secs_f64();
        let k = steps as f64;
        let masked = total.masked.max(1.0);
        let policy = matches!(obj, Objective::Policy(_));
        let stats = StepStats {
            loss: total.loss / k,
            policy_loss: total.policy / k,
            value_loss: (policy && self.value_head.is_some()).then(|| total.value / k),
            kl: (policy && self.config.kl.is_some()).then(|| total.kl / masked),
            kl_coef: (policy && self.config.kl.is_some()).then_some(self.kl_coef),
            entropy: total.entropy / masked,
            clip_fraction: policy.then(|| total.clipped / masked),
            ratio: policy.then(|| RatioStats { mean: total.ratio / masked, min: total.ratio_min, max: total.ratio_max }),
            grad_norm: grad_norm / k,
            lr,
            optimizer_steps: steps,
            sequences: (sequences / epochs as f64).round() as usize,
            tokens: total.tokens as usize,
            trained_tokens: total.masked as usize,
            computed_tokens: total.computed as usize,
            tokens_per_s: total.tokens / seconds.max(1e-9),
            seconds,
            allreduce_seconds: self.comm_seconds,
        };
        Ok((stats, total.kl / sequences.max(1.0)))
    }

    /// One optimizer step over local sequences `idx`: (global sums, grad norm, lr, global sequences).
    fn optimizer_step(&mut self, obj: Objective<'_>, idx: &[usize]) -> Result<(Sums, f64, f64, f64)> {
        let mut counts = [idx.len() as f64, idx.iter().map(|&i| obj.masked(i) as f64).sum()];
        if let Some(dp) = &mut self.dp {
            let t = Instant::now();
            dp.sum(&mut counts)?;
            self.comm_seconds += t.elapsed().as_secs_f64();
        }
        let totals = BatchTotals { sequences: counts[0], tokens: counts[1], max_completion_length: self.config.max_completion_length as f64 };
        self.params.zero_grads();
        let mut sums = Sums::new();
        let device = self.model.device();
        // The step's gradient is the same sum over its sequences whatever the grouping
        // into micro-batches and layouts (weights use the step's totals).
        let policy = matches!(obj, Objective::Policy(_));
        for piece in obj.plan(idx, &self.config) {
            let mb = obj.micro(&piece, device);
            let trained = if self.config.checkpoint_activations {
                // Only each decoder layer's input is kept; the layers are recomputed in the backward.
                let forward = || mb.input.hidden_states(&self.model).map_err(LearnerError::from);
                self.model.checkpointed(|| self.micro_loss(&mb, policy, &totals, &mut sums), forward)?
            } else if let Some(loss) = self.micro_loss(&mb, policy, &totals, &mut sums)? {
                loss.f_backward()?;
                true
            } else {
                false
            };
            if trained {
                self.params.accumulate_grads();
            }
        }
        if let Some(dp) = &mut self.dp {
            let t = Instant::now();
            match self.config.shard {
                // ZeRO-2: each rank receives only the sum of the elements it owns.
                Shard::Gradients => dp.reduce_scatter_flat(&self.params.grads, &self.optim.layout)?,
                _ => dp.all_reduce_flat(&self.params.grads, self.config.bucket_bytes)?,
            }
            self.comm_seconds += t.elapsed().as_secs_f64();
        }
        let norm = self.grad_norm()?;
        // Clipping scales the gradient inside the update; the flat buffer keeps the unclipped sum.
        self.grad_scale = match self.config.max_grad_norm {
            Some(max) if max / (norm + 1e-6) < 1.0 => max / (norm + 1e-6),
            _ => 1.0,
        };
        let lr = next_lr(&self.config, self.optim.step);
        self.optim.update(&self.params, lr, self.grad_scale);
        if let (Some(dp), true) = (&mut self.dp, self.config.shard.splits_optimizer()) {
            // Each rank updated the elements it owns: every rank gets all of them.
            let t = Instant::now();
            dp.gather_parameters(&self.params, &self.optim)?;
            self.comm_seconds += t.elapsed().as_secs_f64();
        }
        if self.dp.is_some() {
            sums = self.reduce_and_verify(sums)?;
        }
        Ok((sums, norm, lr, counts[0]))
    }

    /// The norm of the step's summed gradient: of the whole flat buffer, or under
    /// ZeRO-2 (each rank holds the sums of its own elements only) from every rank's share.
    fn grad_norm(&mut self) -> Result<f64> {
        let grads = &self.params.grads;
        match (&mut self.dp, self.config.shard) {
            (Some(dp), Shard::Gradients) => {
                let mut sq = [self.optim.segments().iter().map(|s| grads.narrow(0, s.flat as i64, s.len as i64).square().sum(Kind::Double).double_value(&[])).sum::<f64>()];
                let t = Instant::now();
                dp.sum(&mut sq)?;
                self.comm_seconds += t.elapsed().as_secs_f64();
                Ok(sq[0].sqrt())
            }
            _ => Ok(grads.norm().double_value(&[])),
        }
    }

    /// Combines the step's sums over ranks and checks every rank's parameter digest.
    fn reduce_and_verify(&mut self, sums: Sums) -> Result<Sums> {
        let digest = self.parameter_digest()?;
        let mut local = sums.to_vec();
        local.extend([(digest >> 32) as f64, (digest & 0xFFFF_FFFF) as f64]);
        let t = Instant::now();
        let all = self.dp.as_mut().expect("data-parallel").gather(&local)?;
        self.comm_seconds += t.elapsed().as_secs_f64();
        let digests: Vec<u64> = all.iter().map(|v| ((v[Sums::LEN] as u64) << 32) | v[Sums::LEN + 1] as u64).collect();
        if digests.iter().any(|&d| d != digests[0]) {
            return Err(LearnerError::DigestMismatch { step: self.optim.step, digests });
        }
        let mut out = Sums::new();
        for v in &all {
            out.merge(&Sums::from_slice(&v[..Sums::LEN]));
        }
        Ok(out)
    }

    /// Checks that every rank holds the same parameters (a no-op on one rank).
    fn verify_digest(&mut self) -> Result<()> {
        if self.dp.as_ref().is_none_or(|d| d.world() == 1) {
            return Ok(());
        }
        let digest = self.parameter_digest()?;
        let all = self.dp.as_mut().expect("data-parallel").gather(&[(digest >> 32) as f64, (digest & 0xFFFF_FFFF) as f64])?;
        let digests: Vec<u64> = all.iter().map(|v| ((v[0] as u64) << 32) | v[1] as u64).collect();
        if digests.iter().any(|&d| d != digests[0]) {
            return Err(LearnerError::DigestMismatch { step: self.optim.step, digests });
        }
        Ok(())
    }

    /// Log-probs, entropies and values at the micro-batch's targets `[K]`. The vocabulary
    /// projection runs only where a loss reads it: with long shared prompts (tool schemas)
    /// and short completions, that is most of the learner's time and memory.
    fn forward(&self, mb: &MicroBatch, entropy_grad: bool) -> Result<Forward> {
        let picked = mb.input.hidden_states(&self.model)?.index_select(0, &mb.src);
        let lp = picked.linear::<Tensor>(&self.lm_head, None).to_kind(Kind::Float).log_softmax(-1, Kind::Float);
        let logp = lp.gather(-1, &mb.targets.unsqueeze(-1), false).squeeze_dim(-1);
        let entropy = if entropy_grad { loss::entropy(&lp) } else { tch::no_grad(|| loss::entropy(&lp)) };
        let values = self.value_head.as_ref().map(|v| v.forward(&picked));
        Ok(Forward { logp, entropy, values })
    }

    /// The micro-batch's share of the objective (`Σ w·l`), adding its statistics to `sums`;
    /// None when no token of it is under the loss mask (nothing to forward).
    #[allow(clippy::assign_op_pattern)] // `a = a + b` on tensors: `+=` would write in place into a tensor autograd or a view shares
    fn micro_loss(&self, mb: &MicroBatch, policy: bool, totals: &BatchTotals, sums: &mut Sums) -> Result<Option<Tensor>> {
        let cfg = &self.config;
        sums.masked += mb.targets_len as f64;
        sums.tokens += mb.tokens as f64;
        sums.computed += mb.computed as f64;
        if mb.targets_len == 0 {
            return Ok(None);
        }
        let f = self.forward(mb, policy && cfg.entropy_coef != 0.0)?;
        let scalar = |t: &Tensor| t.double_value(&[]);
        sums.entropy += scalar(&f.entropy.sum(Kind::Float).detach());
        if !policy {
            let w = loss::target_weights(&mb.counts, Aggregation::Bnpo, totals);
            let total = (-&f.logp * w).sum(Kind::Float);
            let v = scalar(&total.detach());
            sums.loss += v;
            sums.policy += v;
            return Ok(Some(total));
        }
        let c = &mb.columns;
        let w = loss::target_weights(&mb.counts, cfg.aggregation, totals);
        let terms = loss::ppo_clip(&f.logp, c.behaviour.as_ref().expect("policy batch"), c.advantages.as_ref().expect("policy batch"), &cfg.clip);
        let pg = (&terms.loss * &w).sum(Kind::Float);
        sums.policy += scalar(&pg.detach());
        let mut total = pg;
        if let Some(kl) = cfg.kl {
            let reference = match &c.ref_logprobs {
                Some(r) => r.shallow_clone(),
                None => {
                    let r = self.reference.as_ref().expect("checked in train_step");
                    tch::no_grad(|| -> Result<Tensor> {
                        let h = mb.input.hidden_states(r)?.index_select(0, &mb.src);
                        Ok(r.output_logprobs(&h).gather(-1, &mb.targets.unsqueeze(-1), false).squeeze_dim(-1))
                    })?
                }
            };
            let k = loss::kl_penalty(&f.logp, &reference, kl.estimator);
            sums.kl += scalar(&k.sum(Kind::Float).detach());
            if kl.placement == KlPlacement::Loss && self.kl_coef != 0.0 {
                total = total + (&k * &w).sum(Kind::Float) * self.kl_coef;
            }
        }
        if cfg.entropy_coef != 0.0 {
            total = total - (&f.entropy * &w).sum(Kind::Float) * cfg.entropy_coef;
        }
        if let (Some(vc), Some(pred)) = (cfg.value, &f.values) {
            let (vl, _) = loss::clipped_value_loss(pred, c.values.as_ref().expect("validated"), c.returns.as_ref().expect("validated"), vc.clip);
            let v = (&vl * &w).sum(Kind::Float);
            sums.value += scalar(&v.detach());
            total = total + v * vc.coef;
        }
        let ratio = terms.ratio.detach();
        sums.ratio += scalar(&ratio.sum(Kind::Float));
        sums.clipped += scalar(&terms.clipped.to_kind(Kind::Float).sum(Kind::Float));
        sums.ratio_min = sums.ratio_min.min(scalar(&ratio.min()));
        sums.ratio_max = sums.ratio_max.max(scalar(&ratio.max()));
        sums.loss += scalar(&total.detach());
        Ok(Some(total))
    }
}
