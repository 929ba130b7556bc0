//! From scored groups to what the learner trains on: one advantage per token,
//! by the recipe's estimator.
//!
//! - `grpo`, `dr_grpo`: the group-relative advantage of the scalar reward on every policy token;
//!   `rloo`: the leave-one-out advantage, likewise.
//! - `slca`: SLCA-GRPO's process advantage on the tool-call turns and summary
//!   advantage on the final reply, 0 elsewhere, from the reward actor's
//!   segment rewards (`p`, `q`, HierR's total `z`, the no-call flag).
//! - `steptool_critic_free`: the group-normalised step return of each turn on all its tokens.
//! - `steptool`: each turn's step reward on its last token, in `rewards`; the
//!   learner runs the value head and turns them into GAE advantages.
//!
//! The estimators themselves are plain functions of `rlmesh_core::advantage`;
//! this module only lays the scored data out for them.
use super::recipe::{EstimatorKind, Recipe};
use crate::learner::{TrainBatch, TrainSequence};
use crate::reward::ScoredGroup;
use rlmesh_core::advantage::grpo::{grpo_advantages, rloo_advantages, ScaleRewards};
use rlmesh_core::advantage::slca::{slca_advantages, SlcaParams, SlcaRollout};
use rlmesh_core::advantage::steptool::{critic_free_advantages, place_step_rewards};
use rlmesh_core::advantage::{broadcast, AdvantageError};

/// How advantages are made from scored groups.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Advantages {
    /// GRPO with this σ (Dr.GRPO: none).
    Grpo(ScaleRewards),
    /// REINFORCE leave-one-out.
    Rloo,
    /// SLCA-GRPO.
    Slca(SlcaParams),
    /// StepTool with a critic: per-token rewards for the learner's GAE.
    StepTool {
        /// Upstream `(K − 1 − i)` weighting of the step rewards.
        upstream_weighting: bool,
    },
    /// StepTool without a critic.
    CriticFree {
        /// Discount of the step returns.
        gamma: f64,
        /// Upstream `(K − 1 − i)` weighting of the step rewards.
        upstream_weighting: bool,
    },
}

impl Advantages {
    /// The recipe's estimator with its parameters (defaults filled in).
    pub fn of(recipe: &Recipe) -> Advantages {
        let e = &recipe.estimator;
        let upstream_weighting = e.upstream_weighting.unwrap_or(false);
        match e.name {
            EstimatorKind::Grpo | EstimatorKind::DrGrpo => Advantages::Grpo(recipe.scale_rewards().unwrap_or(ScaleRewards::Group)),
            EstimatorKind::Rloo => Advantages::Rloo,
            EstimatorKind::Slca => Advantages::Slca(SlcaParams {
                w_process: e.w_process.unwrap_or(1.0),
                w_summary: e.w_summary.unwrap_or(1.0),
                norm_by_std: e.norm_by_std.unwrap_or(true),
            }),
            EstimatorKind::Steptool => Advantages::StepTool { upstream_weighting },
            EstimatorKind::SteptoolCriticFree => Advantages::CriticFree { gamma: e.gamma.unwrap_or(0.99), upstream_weighting },
        }
    }
}

/// The sequence of one trajectory with its per-token advantages.
fn sequence(t: &rlmesh_core::Trajectory, advantages: Vec<f32>) -> TrainSequence {
    TrainSequence {
        token_ids: t.token_ids.clone(),
        loss_mask: t.loss_mask.clone(),
        advantages,
        behaviour_logprobs: t.logprobs.clone(),
        ..Default::default()
    }
}

/// The learner's batch for `groups` (trajectories in group order).
///
/// Errors only when a trajectory's step rewards do not match the turns in its
/// loss mask, which the reward actor never produces.
pub fn train_batch(groups: &[ScoredGroup], how: &Advantages) -> Result<TrainBatch, AdvantageError> {
    let mut sequences = Vec::with_capacity(groups.iter().map(|g| g.scores.len()).sum());
    let totals = || groups.iter().map(|g| g.scores.iter().map(|s| s.total).collect()).collect::<Vec<Vec<f64>>>();
    match how {
        Advantages::Grpo(_) | Advantages::Rloo => {
            let adv = match how {
                Advantages::Grpo(scale) => grpo_advantages(&totals(), *scale),
                _ => rloo_advantages(&totals()),
            };
            for (g, a) in groups.iter().zip(adv) {
                for (t, a) in g.group.trajectories.iter().zip(a) {
                    sequences.push(sequence(t, broadcast(&t.loss_mask, a)));
                }
            }
        }
        Advantages::Slca(params) => {
            for g in groups {
                let rollouts: Vec<SlcaRollout<'_>> = g
                    .group
                    .trajectories
                    .iter()
                    .zip(&g.scores)
                    .map(|(t, s)| SlcaRollout {
                        loss_mask: &t.loss_mask,
                        process: s.segments.process,
                        summary: s.segments.summary,
                        total: s.segments.total,
                        no_call: s.segments.no_call,
                    })
                    .collect();
                for (t, a) in g.group.trajectories.iter().zip(slca_advantages(&rollouts, params)) {
                    sequences.push(sequence(t, a));
                }
            }
        }
        Advantages::CriticFree { gamma, upstream_weighting } => {
            for g in groups {
                let steps: Vec<(&[u8], &[f64])> =
                    g.group.trajectories.iter().zip(&g.scores).map(|(t, s)| (t.loss_mask.as_slice(), s.segments.step_rewards.as_slice())).collect();
                for (t, a) in g.group.trajectories.iter().zip(critic_free_advantages(&steps, *gamma, *upstream_weighting)?) {
                    sequences.push(sequence(t, a));
                }
            }
        }
        Advantages::StepTool { upstream_weighting } => {
            for g in groups {
                for (t, s) in g.group.trajectories.iter().zip(&g.scores) {
                    let rewards = place_step_rewards(&t.loss_mask, &s.segments.step_rewards, *upstream_weighting)?;
                    let mut seq = sequence(t, vec![0.0; t.loss_mask.len()]);
                    seq.rewards = Some(rewards.into_iter().map(|r| r as f32).collect());
                    sequences.push(seq);
                }
            }
        }
    }
    Ok(TrainBatch { sequences })
}
