//! StepTool: step-grained rewards, KL in the reward, GAE over a value head, whitening; and a critic-free variant.
//!
//! With a critic (StepTool's PPO, number for number with TRL's
//! `PPOTrainer.compute_advantages`):
//! 1. each step reward goes on the last token of its action — the k-th run of
//!    1s in the loss mask ([`place_step_rewards`]); with `upstream_weighting`
//!    step i's reward is multiplied by `K − 1 − i` as the upstream code does
//!    (which zeroes the final IsSolved reward);
//! 2. every policy token's reward also carries `−β·(logp − ref)`;
//! 3. GAE over all positions with rewards and values zeroed outside the mask:
//!    `δ_t = r_t + γV_{t+1} − V_t`, `A_t = δ_t + γλA_{t+1}`; returns `A + V`;
//! 4. advantages whitened over the masked tokens of the whole batch
//!    (`(A − mean)/sqrt(var_unbiased + 1e-8)`, fewer than 2 tokens → 0).
//!
//! Critic-free ([`critic_free_advantages`]): per rollout the step returns
//! `G_i = Σ_{j≥i} γ^{j−i} r_j`, normalised over all steps of the group
//! (`(G − mean)/(std_unbiased + 1e-4)`), each on every token of its action.
//! KL then belongs in the loss.
use super::grpo::GRPO_EPS;
use super::{center_scale, mask_runs, AdvantageError};
use crate::reward::combine::nanstd;

/// Added to the variance when whitening.
pub const WHITEN_EPS: f64 = 1e-8;

/// StepTool's hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepToolParams {
    /// Discount γ.
    pub gamma: f64,
    /// GAE λ.
    pub lam: f64,
    /// KL coefficient β (the adaptive controller's current value).
    pub kl_coef: f64,
    /// Multiply step i's reward by `K − 1 − i` (upstream parity).
    pub upstream_weighting: bool,
}

impl Default for StepToolParams {
    fn default() -> Self {
        StepToolParams { gamma: 0.99, lam: 0.95, kl_coef: 0.3, upstream_weighting: false }
    }
}

/// Step rewards after the optional upstream `(K − 1 − i)` weighting.
fn weighted_steps(step_rewards: &[f64], upstream_weighting: bool) -> Vec<f64> {
    let k = step_rewards.len();
    step_rewards
        .iter()
        .enumerate()
        .map(|(i, r)| if upstream_weighting { r * (k - 1 - i) as f64 } else { *r })
        .collect()
}

/// Per-token rewards: step i's reward on the last token of the i-th action; a rollout without policy tokens gets none.
pub fn place_step_rewards(mask: &[u8], step_rewards: &[f64], upstream_weighting: bool) -> Result<Vec<f64>, AdvantageError> {
    let runs = mask_runs(mask);
    let mut out = vec![0.0; mask.len()];
    if runs.is_empty() {
        return Ok(out);
    }
    if runs.len() != step_rewards.len() {
        return Err(AdvantageError::StepCount { actions: runs.len(), rewards: step_rewards.len() });
    }
    for (run, r) in runs.iter().zip(weighted_steps(step_rewards, upstream_weighting)) {
        out[run.end - 1] = r;
    }
    Ok(out)
}

/// Adds `−β·(logp − ref)` to the reward of every policy token.
pub fn add_kl_penalty(rewards: &mut [f64], mask: &[u8], logprobs: &[f32], ref_logprobs: &[f32], kl_coef: f64) {
    for (((r, m), lp), rf) in rewards.iter_mut().zip(mask).zip(logprobs).zip(ref_logprobs) {
        if *m != 0 {
            *r -= kl_coef * (f64::from(*lp) - f64::from(*rf));
        }
    }
}

/// GAE advantages and returns (`A + V`) of one rollout; rewards and values count only where the mask is 1.
pub fn gae(rewards: &[f64], values: &[f32], mask: &[u8], gamma: f64, lam: f64) -> (Vec<f64>, Vec<f64>) {
    let n = mask.len();
    let on = |t: usize| mask[t] != 0;
    let v = |t: usize| if t < n && on(t) { f64::from(values[t]) } else { 0.0 };
    let mut adv = vec![0.0; n];
    let mut last = 0.0;
    for t in (0..n).rev() {
        let r = if on(t) { rewards[t] } else { 0.0 };
        let delta = r + gamma * v(t + 1) - v(t);
        last = delta + gamma * lam * last;
        adv[t] = last;
    }
    let returns = (0..n).map(|t| if on(t) { adv[t] + v(t) } else { 0.0 }).collect();
    (adv, returns)
}

/// Whitens the masked entries of all rollouts together; entries outside the mask become 0.
pub fn masked_whiten(xs: &[Vec<f64>], masks: &[&[u8]]) -> Vec<Vec<f32>> {
    let masked: Vec<f64> =
        xs.iter().zip(masks).flat_map(|(x, m)| x.iter().zip(m.iter()).filter(|(_, m)| **m != 0).map(|(x, _)| *x)).collect();
    let sigma = nanstd(&masked);
    let mean = masked.iter().sum::<f64>() / masked.len().max(1) as f64;
    let scale = (sigma * sigma + WHITEN_EPS).sqrt();
    xs.iter()
        .zip(masks)
        .map(|(x, m)| {
            x.iter()
                .zip(m.iter())
                .map(|(x, m)| {
                    let w = (x - mean) / scale;
                    if *m == 0 || w.is_nan() {
                        0.0
                    } else {
                        w as f32
                    }
                })
                .collect()
        })
        .collect()
}

/// One rollout for the critic-based estimator.
#[derive(Clone, Copy, Debug)]
pub struct StepToolRollout<'a> {
    /// Loss mask.
    pub loss_mask: &'a [u8],
    /// Per-token rewards before KL (see [`place_step_rewards`]).
    pub token_rewards: &'a [f64],
    /// Value-head output per token.
    pub values: &'a [f32],
    /// Policy log-probs and reference log-probs per token, for the KL term.
    pub logprobs: Option<(&'a [f32], &'a [f32])>,
}

/// Per-token advantages and returns of a batch, one vector per rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct StepToolOutput {
    /// Whitened GAE advantages (0 outside the mask).
    pub advantages: Vec<Vec<f32>>,
    /// `A + V` before whitening (0 outside the mask).
    pub returns: Vec<Vec<f32>>,
}

/// Whitened advantages and returns for a batch of rollouts.
pub fn steptool_advantages(batch: &[StepToolRollout<'_>], params: &StepToolParams) -> Result<StepToolOutput, AdvantageError> {
    let mut advs = Vec::with_capacity(batch.len());
    let mut returns = Vec::with_capacity(batch.len());
    for r in batch {
        let n = r.loss_mask.len();
        check_len("token_rewards", n, r.token_rewards.len())?;
        check_len("values", n, r.values.len())?;
        let mut rewards = r.token_rewards.to_vec();
        if let Some((lp, rf)) = r.logprobs {
            check_len("logprobs", n, lp.len())?;
            check_len("ref_logprobs", n, rf.len())?;
            add_kl_penalty(&mut rewards, r.loss_mask, lp, rf, params.kl_coef);
        }
        let (a, ret) = gae(&rewards, r.values, r.loss_mask, params.gamma, params.lam);
        advs.push(a);
        returns.push(ret.into_iter().map(|x| x as f32).collect());
    }
    let masks: Vec<&[u8]> = batch.iter().map(|r| r.loss_mask).collect();
    Ok(StepToolOutput { advantages: masked_whiten(&advs, &masks), returns })
}

fn check_len(field: &'static str, expected: usize, got: usize) -> Result<(), AdvantageError> {
    if expected == got {
        Ok(())
    } else {
        Err(AdvantageError::Length { field, expected, got })
    }
}

/// Critic-free StepTool advantages of one group: `(loss_mask, step_rewards)` per rollout.
pub fn critic_free_advantages(
    group: &[(&[u8], &[f64])],
    gamma: f64,
    upstream_weighting: bool,
) -> Result<Vec<Vec<f32>>, AdvantageError> {
    let mut runs = Vec::with_capacity(group.len());
    let mut step_returns = Vec::new();
    for (mask, steps) in group {
        let r = mask_runs(mask);
        if !r.is_empty() && r.len() != steps.len() {
            return Err(AdvantageError::StepCount { actions: r.len(), rewards: steps.len() });
        }
        let mut g = vec![0.0; r.len()];
        let mut acc = 0.0;
        for (i, s) in weighted_steps(steps, upstream_weighting).iter().enumerate().take(r.len()).rev() {
            acc = s + gamma * acc;
            g[i] = acc;
        }
        step_returns.extend(g);
        runs.push(r);
    }
    let normalised = center_scale(&step_returns, Some((nanstd(&step_returns), GRPO_EPS)));
    let mut next = normalised.into_iter();
    Ok(group
        .iter()
        .zip(&runs)
        .map(|((mask, _), r)| {
            let mut out = vec![0.0f32; mask.len()];
            for span in r {
                let a = next.next().unwrap_or(0.0) as f32;
                out[span.start..span.end].iter_mut().for_each(|x| *x = a);
            }
            out
        })
        .collect())
}
