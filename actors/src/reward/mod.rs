//! The reward actor: scores trajectories by component, by segment and by
//! step (and the held-out verdict), and writes the error-analysis row of
//! each rollout.
//!
//! Per trajectory it returns the scalar the recipe's `reward` names (what
//! GRPO trains on) and, whatever the recipe, the [`SegmentScores`]: SLCA's
//! process and summary rewards (HierR, the summary judged by the rule
//! rubric) and StepTool's reward per turn. Scoring is plain functions of
//! `rlmesh_core::reward` on plain data; the actor only moves groups in and
//! scored groups out.
pub mod judge;

use crate::controller::recipe::RewardKind;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rlmesh_core::analysis::{analysis_row, trajectory_outcome, AnalysisRow, TrajectoryOutcome};
use rlmesh_core::reward::hierr::hierr_reward;
use rlmesh_core::reward::judge::{JudgeStats, SummaryRubric};
use rlmesh_core::reward::process::{final_only_reward, process_reward};
use rlmesh_core::reward::segments::{segment_scores, SegmentScores};
use rlmesh_core::reward::Transcript;
use rlmesh_core::Group;
use serde::{Deserialize, Serialize};

/// The reward of one trajectory with its components and verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoredTrajectory {
    /// The scalar reward trained on.
    pub total: f64,
    /// Named components (`None`: does not apply).
    pub components: Vec<(String, Option<f64>)>,
    /// Segment rewards (SLCA) and per-turn step rewards (StepTool).
    #[serde(default)]
    pub segments: SegmentScores,
    /// The held-out verdict (success, tool use).
    pub outcome: TrajectoryOutcome,
    /// The error-analysis row.
    pub row: AnalysisRow,
}

/// A group with the scores of its trajectories (same order).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoredGroup {
    /// The group.
    pub group: Group,
    /// One score per trajectory.
    pub scores: Vec<ScoredTrajectory>,
}

/// Score every trajectory of a group with `kind`.
pub fn score_group(group: Group, kind: RewardKind) -> ScoredGroup {
    let stats = JudgeStats::default();
    let scores = group
        .trajectories
        .iter()
        .map(|traj| {
            let t = Transcript::from_trajectory(traj);
            let s = match kind {
                RewardKind::Process => process_reward(&group.task, &t),
                RewardKind::FinalOnly => final_only_reward(&group.task, &t),
                RewardKind::Hierr => hierr_reward(&group.task, &t, &SummaryRubric, &stats),
            };
            let segments = segment_scores(&group.task, traj, &SummaryRubric, &stats);
            // The table always carries the process components, whatever is trained on.
            let table = process_reward(&group.task, &t);
            let mut row = analysis_row(&group.task, traj, &table);
            row.total_reward = s.total;
            row.process_segment_reward = Some(segments.process);
            row.summary_segment_reward = Some(segments.summary);
            row.step_rewards = Some(segments.step_rewards.clone());
            ScoredTrajectory {
                total: s.total,
                components: s.components.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
                segments,
                outcome: trajectory_outcome(&group.task, traj),
                row,
            }
        })
        .collect();
    ScoredGroup { group, scores }
}

/// Messages of the reward actor.
pub enum RewardMsg {
    /// Score groups.
    Score(Vec<Group>, RpcReplyPort<Vec<ScoredGroup>>),
}

// In-process only: never serialised (ractor's `cluster` feature asks every message type to say so).
impl ractor::Message for RewardMsg {}

/// The reward actor.
pub struct RewardActor;

impl Actor for RewardActor {
    type Msg = RewardMsg;
    type State = RewardKind;
    type Arguments = RewardKind;

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, kind: RewardKind) -> Result<RewardKind, ActorProcessingErr> {
        Ok(kind)
    }

    async fn handle(&self, _myself: ActorRef<Self::Msg>, msg: Self::Msg, kind: &mut RewardKind) -> Result<(), ActorProcessingErr> {
        match msg {
            RewardMsg::Score(groups, reply) => {
                let kind = *kind;
                let scored = tokio::task::spawn_blocking(move || groups.into_iter().map(|g| score_group(g, kind)).collect()).await?;
                let _ = reply.send(scored);
            }
        }
        Ok(())
    }
}
