//! Group-relative scalar advantages: GRPO (TRL semantics), Dr.GRPO, RLOO.
//!
//! Input: one combined reward per rollout (see
//! [`crate::reward::combine::combine_rewards`]; NaN = unscorable), grouped by
//! prompt. GRPO: `μ = nanmean` over the group; `σ = nanstd` (Bessel) over the
//! group ([`ScaleRewards::Group`]) or over the whole batch
//! ([`ScaleRewards::Batch`]); `A = (r − μ)/(σ + 1e-4)`, or `A = r − μ` with
//! [`ScaleRewards::None`] — which is Dr.GRPO's advantage. NaN → 0.
//! RLOO: `A_i = r_i − mean of the other scorable rewards of the group` (0 when
//! there is none).
use super::center_scale;
use crate::reward::combine::nanstd;

/// The `eps` added to σ by GRPO's scaling.
pub const GRPO_EPS: f64 = 1e-4;

/// Which standard deviation divides GRPO's centred rewards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleRewards {
    /// σ of the group.
    Group,
    /// σ of the whole batch.
    Batch,
    /// No division (Dr.GRPO).
    None,
}

impl ScaleRewards {
    /// `"group" | "batch" | "none"`.
    pub fn parse(name: &str) -> Option<ScaleRewards> {
        match name {
            "group" => Some(ScaleRewards::Group),
            "batch" => Some(ScaleRewards::Batch),
            "none" => Some(ScaleRewards::None),
            _ => None,
        }
    }
}

/// GRPO advantage of every rollout, group by group.
pub fn grpo_advantages(groups: &[Vec<f64>], scale: ScaleRewards) -> Vec<Vec<f64>> {
    let batch: Vec<f64> = groups.iter().flatten().copied().collect();
    let batch_std = nanstd(&batch);
    groups
        .iter()
        .map(|g| match scale {
            ScaleRewards::Group => center_scale(g, Some((nanstd(g), GRPO_EPS))),
            ScaleRewards::Batch => center_scale(g, Some((batch_std, GRPO_EPS))),
            ScaleRewards::None => center_scale(g, None),
        })
        .collect()
}

/// RLOO advantage of every rollout, group by group.
pub fn rloo_advantages(groups: &[Vec<f64>]) -> Vec<Vec<f64>> {
    groups
        .iter()
        .map(|g| {
            let present: Vec<f64> = g.iter().copied().filter(|r| !r.is_nan()).collect();
            let sum: f64 = present.iter().sum();
            g.iter()
                .map(|&r| {
                    if r.is_nan() || present.len() < 2 {
                        0.0
                    } else {
                        r - (sum - r) / (present.len() - 1) as f64
                    }
                })
                .collect()
        })
        .collect()
}
