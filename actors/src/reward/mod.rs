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
use rlmesh_core::reward::judge::{Judge, JudgeStats, SummaryRubric};
use rlmesh_core::reward::process::{final_only_reward, process_reward};
use rlmesh_core::reward::segments::{segments_of, SegmentScores};
use rlmesh_core::reward::Transcript;
use rlmesh_core::Group;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// What scoring it cost.
    #[serde(default)]
    pub judge: JudgeCost,
}

/// The judge of the summaries.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum JudgeSpec {
    /// The rule rubric ([`SummaryRubric`]: states the result, concise, grounded).
    #[default]
    Rule,
    /// A frozen model in an HF directory, on its own thread ([`judge::ModelJudge`]).
    Model {
        /// The model directory (the same path on every host).
        dir: std::path::PathBuf,
    },
}

/// What a reward actor scores with: the trained scalar and the summary judge.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RewardSpec {
    /// The scalar reward trained on by the GRPO family.
    pub kind: RewardKind,
    /// The judge of the summaries (SLCA's `q`, HierR's total).
    #[serde(default)]
    pub judge: JudgeSpec,
}

/// What judging a group cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JudgeCost {
    /// Judge calls made.
    pub calls: u64,
    /// Calls that failed (scored 0).
    pub failures: u64,
    /// Wall seconds spent scoring the group (the judge's calls included).
    pub seconds: f64,
}

/// A reward function with its judge, ready to score groups.
pub struct Scorer {
    kind: RewardKind,
    judge: Arc<dyn Judge>,
}

/// A model judge waits this long for one answer before it counts a failure.
pub const MODEL_JUDGE_TIMEOUT: Duration = Duration::from_secs(30);

impl Scorer {
    /// The scorer of `spec`: a model judge is loaded onto its own thread.
    pub fn new(spec: &RewardSpec) -> Result<Scorer, String> {
        let judge: Arc<dyn Judge> = match &spec.judge {
            JudgeSpec::Rule => Arc::new(SummaryRubric),
            JudgeSpec::Model { dir } => {
                Arc::new(judge::ModelJudge::load(dir, MODEL_JUDGE_TIMEOUT).map_err(|e| format!("the model judge in {}: {e}", dir.display()))?)
            }
        };
        Ok(Scorer { kind: spec.kind, judge })
    }

    /// Scores every trajectory of a group.
    pub fn score(&self, group: Group) -> ScoredGroup {
        let start = Instant::now();
        let stats = JudgeStats::default();
        let scores = group
            .trajectories
            .iter()
            .map(|traj| {
                let t = Transcript::from_trajectory(traj);
                // HierR judges the summary once; the segments reuse it.
                let h = hierr_reward(&group.task, &t, self.judge.as_ref(), &stats);
                let s = match self.kind {
                    RewardKind::Process => process_reward(&group.task, &t),
                    RewardKind::FinalOnly => final_only_reward(&group.task, &t),
                    RewardKind::Hierr => h.clone(),
                };
                let segments = segments_of(&group.task, traj, &t, &h);
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
        let judge = JudgeCost { calls: stats.calls(), failures: stats.failures(), seconds: start.elapsed().as_secs_f64() };
        ScoredGroup { group, scores, judge }
    }
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
    type State = Arc<Scorer>;
    type Arguments = RewardSpec;

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, spec: RewardSpec) -> Result<Arc<Scorer>, ActorProcessingErr> {
        Ok(Arc::new(Scorer::new(&spec)?))
    }

    async fn handle(&self, _myself: ActorRef<Self::Msg>, msg: Self::Msg, scorer: &mut Arc<Scorer>) -> Result<(), ActorProcessingErr> {
        match msg {
            RewardMsg::Score(groups, reply) => {
                let scorer = scorer.clone();
                let scored = tokio::task::spawn_blocking(move || groups.into_iter().map(|g| scorer.score(g)).collect()).await?;
                let _ = reply.send(scored);
            }
        }
        Ok(())
    }
}
