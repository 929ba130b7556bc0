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

/// Whether training on `group` can move the policy: some token has a
/// non-zero advantage. A group whose rollouts all scored alike gives GRPO,
/// RLOO, SLCA-GRPO and critic-free StepTool zero advantages everywhere (DAPO's
/// dynamic sampling drops it); StepTool with a critic always counts, since its
/// value head makes advantages of equal rewards.
pub fn informative(group: &ScoredGroup, how: &Advantages) -> Result<bool, AdvantageError> {
    if let Advantages::StepTool { .. } = how {
        return Ok(true);
    }
    let batch = train_batch(std::slice::from_ref(group), how)?;
    Ok(batch.sequences.iter().any(|s| s.advantages.iter().any(|a| a.abs() > UNIFORM_EPS)))
}

/// Advantages at most this large count as zero in [`informative`]: equal
/// rewards can leave a rounding residue of about 1e-16, which GRPO's
/// `σ + 1e-4` turns into 1e-12, not 0; a real difference of rewards in
/// [0, 1] that is worth a gradient is many orders above it.
pub const UNIFORM_EPS: f32 = 1e-6;

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

impl Advantages {
    /// Whether it trains an agent's earlier segments (one advantage per
    /// rollout: GRPO and RLOO); the others score steps within one sequence.
    pub fn takes_segments(&self) -> bool {
        matches!(self, Advantages::Grpo(_) | Advantages::Rloo)
    }
}

/// The learner's batch for `groups` (trajectories in group order, then each
/// group's earlier agent segments; `group_sizes` set).
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
                for (t, &a) in g.group.trajectories.iter().zip(&a) {
                    sequences.push(sequence(t, broadcast(&t.loss_mask, a)));
                }
                // An agent's earlier segments, each with its rollout's advantage.
                for s in &g.group.earlier_segments {
                    let a = g.group.trajectories.iter().zip(&a).find(|(t, _)| t.sample_index == s.sample_index).map_or(0.0, |(_, &a)| a);
                    sequences.push(sequence(s, broadcast(&s.loss_mask, a)));
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
    // Every estimator gives one sequence per trajectory, group by group (then
    // the group's earlier segments: only sequence-level estimators get any).
    let group_sizes: Vec<usize> = groups.iter().map(|g| g.group.trajectories.len().min(g.scores.len()) + g.group.earlier_segments.len()).collect();
    debug_assert_eq!(group_sizes.iter().sum::<usize>(), sequences.len());
    Ok(TrainBatch { sequences, group_sizes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::recipe::RewardKind;
    use crate::reward::{JudgeSpec, RewardSpec, Scorer};
    use rlmesh_core::advantage::slca::SlcaParams;
    use rlmesh_core::{GoldCall, Group, Span, Step, StopReason, Task, Trajectory};
    use serde_json::json;

    fn task() -> Task {
        Task {
            id: "add".into(),
            prompt: "Use the calculator to compute 2 + 3.".into(),
            requires_tool: true,
            allowed_tools: vec!["calculator".into()],
            gold_tool_calls: vec![vec![GoldCall { name: "calculator".into(), arguments: json!({"operation": "add", "a": 2, "b": 3}) }]],
            expected_answer: Some("5".into()),
            environment: None,
            env_state: None,
            ..Default::default()
        }
    }

    /// A call turn (`add(2, b)`) and a reply turn stating its result: 2
    /// prompt tokens, 2 call tokens, 2 of tool result, 2 of reply.
    fn rollout(i: usize, b: i64) -> Trajectory {
        let result = (2 + b).to_string();
        let step = Step {
            turn: 0,
            index: 0,
            name: "calculator".into(),
            arguments: json!({"operation": "add", "a": 2, "b": b}),
            result: result.clone(),
            success: true,
            error: None,
            latency_ms: 0.1,
            repeated: false,
        };
        Trajectory {
            task_id: "add".into(),
            sample_index: i,
            prompt_len: 2,
            rendered_prompt: String::new(),
            token_ids: vec![1; 8],
            loss_mask: vec![0, 0, 1, 1, 0, 0, 1, 1],
            logprobs: vec![0.0, 0.0, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5],
            versions: vec![0; 8],
            segments: vec![Span { start: 2, end: 4 }],
            summary: Some(Span { start: 6, end: 8 }),
            steps: vec![step],
            format_errors: vec![],
            messages: vec![],
            completion: format!("The answer is {result}."),
            final_answer: format!("The answer is {result}."),
            stop_reason: StopReason::Answered,
            grades: Vec::new(),
        }
    }

    /// The reward actor's own scores of a group whose rollouts call `add(2, b)` with these `b`.
    fn scored(bs: &[i64]) -> ScoredGroup {
        let scorer = Scorer::new(&RewardSpec::rubric(RewardKind::Process, JudgeSpec::Rule)).unwrap();
        scorer.score(Group { group_id: 7, task: task(), trajectories: bs.iter().enumerate().map(|(i, &b)| rollout(i, b)).collect(), failed: None, earlier_segments: vec![] })
    }

    const ESTIMATORS: [Advantages; 4] = [
        Advantages::Grpo(ScaleRewards::Group),
        Advantages::Grpo(ScaleRewards::None),
        Advantages::Rloo,
        Advantages::Slca(SlcaParams { w_process: 1.0, w_summary: 1.0, norm_by_std: true }),
    ];

    #[test]
    fn a_group_scored_alike_is_uninformative_and_one_that_differs_is_not() {
        let right = scored(&[3, 3, 3, 3]);
        let wrong = scored(&[4, 4, 4, 4]);
        let mixed = scored(&[3, 4, 3, 3]);
        assert!(mixed.scores[0].total > mixed.scores[1].total, "the reward tells the right call from the wrong one");
        assert!(mixed.scores[0].segments.process > mixed.scores[1].segments.process, "and so do the segment rewards");
        for how in ESTIMATORS {
            assert!(!informative(&right, &how).unwrap(), "{how:?}: all right");
            assert!(!informative(&wrong, &how).unwrap(), "{how:?}: all wrong alike");
            assert!(informative(&mixed, &how).unwrap(), "{how:?}: one wrong call");
        }
        // Critic-free StepTool normalises the discounted step returns over every
        // turn of the group (here 1 + 0.99 and 1), so the turns move the policy
        // even when all rollouts are alike; StepTool's value head makes
        // advantages of equal rewards.
        let critic_free = Advantages::CriticFree { gamma: 0.99, upstream_weighting: false };
        assert_eq!(right.scores[0].segments.step_rewards, vec![1.0, 1.0]);
        assert!(informative(&right, &critic_free).unwrap());
        assert!(informative(&mixed, &critic_free).unwrap());
        assert!(informative(&right, &Advantages::StepTool { upstream_weighting: false }).unwrap());
    }

    #[test]
    fn a_rounding_residue_of_equal_rewards_is_not_a_signal() {
        // 0.1 + 0.2 ≠ 0.3 in f64: rewards equal up to rounding give GRPO a residue
        // of about 1e-16 / (σ + 1e-4) ≈ 1e-12, below UNIFORM_EPS.
        let mut g = scored(&[3, 3, 3]);
        let totals = [0.1 + 0.2, 0.3, 0.3];
        for (s, t) in g.scores.iter_mut().zip(totals) {
            s.total = t;
        }
        assert_ne!(totals[0], totals[1]);
        assert!(!informative(&g, &Advantages::Grpo(ScaleRewards::Group)).unwrap());
        g.scores[0].total = 0.31;
        assert!(informative(&g, &Advantages::Grpo(ScaleRewards::Group)).unwrap());
    }
}
