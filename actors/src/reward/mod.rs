//! The reward actor: scores trajectories by component, by segment and by
//! step (and the held-out verdict), and writes the error-analysis row of
//! each rollout.
//!
//! Per trajectory it returns the scalar GRPO trains on — the rubric the
//! recipe's `reward` names, weighted by `[reward_weights]`, plus the
//! environments' rewards (`env:<server>`) and the external verifiers
//! (`verifier:<name>`, [`rlmesh_verifiers`]), combined as TRL does — and,
//! whatever the recipe, the [`SegmentScores`]: SLCA's
//! process and summary rewards (HierR, the summary judged by the rule
//! rubric) and StepTool's reward per turn. Scoring is plain functions of
//! `rlmesh_core::reward` on plain data; the actor only moves groups in and
//! scored groups out.
//!
//! A rollout a function could not score (a verifier's error, timeout, crash or
//! garbage; a tool server that lost its state) has no total: its group is
//! marked [`ScoredGroup::unscorable`] and the controller drops it, so
//! infrastructure failures never enter group statistics.
pub mod judge;

use crate::controller::recipe::rewards::{env_sources, reward_functions, rubric_weights, RewardFunctionSpec};
use crate::controller::recipe::{JudgeName, Recipe, RewardKind};
use std::path::{Path, PathBuf};
use rlmesh_core::reward::functions::{combine_row, RewardFunction, Score};
use rlmesh_core::reward::process::{final_only_reward_weighted, process_reward_weighted, RubricWeights};
use rlmesh_verifiers::{Request, Verifier};
use std::collections::BTreeMap;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rlmesh_core::analysis::{analysis_row, trajectory_outcome, AnalysisRow, TrajectoryOutcome};
use rlmesh_core::reward::hierr::hierr_reward;
use rlmesh_core::reward::judge::{Judge, JudgeStats, SummaryRubric};
use rlmesh_core::reward::process::process_reward;
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
    /// Each reward function's value (`None`: does not apply or could not score).
    #[serde(default)]
    pub functions: Vec<(String, Option<f64>)>,
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
    /// Why a rollout of it has no reward, if one has none: the group is dropped, never trained.
    #[serde(default)]
    pub unscorable: Option<String>,
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
    /// `[reward_weights]`: the rubric's component weights and the functions' weights.
    #[serde(default)]
    pub weights: BTreeMap<String, f64>,
    /// Grade sources that are reward functions: tool servers' reward tools
    /// (`env:<name>`) and an agent program's own reward (`agent`).
    #[serde(default)]
    pub env_functions: Vec<String>,
    /// `[[reward_function]]`: external verifiers.
    #[serde(default)]
    pub verifiers: Vec<RewardFunctionSpec>,
}

impl RewardSpec {
    /// The rubric alone, with its default weights.
    pub fn rubric(kind: RewardKind, judge: JudgeSpec) -> Self {
        RewardSpec { kind, judge, weights: BTreeMap::new(), env_functions: Vec::new(), verifiers: Vec::new() }
    }

    /// What `recipe` scores with (the live run's reward actors and `launcher
    /// reward --recipe` alike); a model judge without `judge_model` is `model_dir`.
    pub fn of(recipe: &Recipe, model_dir: &Path) -> Self {
        RewardSpec {
            kind: recipe.reward,
            judge: match recipe.judge {
                JudgeName::Rule => JudgeSpec::Rule,
                JudgeName::Model => JudgeSpec::Model { dir: recipe.judge_model.as_ref().map_or_else(|| model_dir.to_path_buf(), PathBuf::from) },
            },
            weights: recipe.reward_weights.clone(),
            env_functions: env_sources(&recipe.tool_servers).into_iter().chain(recipe.agent.as_ref().map(|_| crate::rollout::agent_host::AGENT_FUNCTION.to_string())).collect(),
            verifiers: recipe.reward_functions.clone(),
        }
    }
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
    rubric: RubricWeights,
    /// The functions summed, in order: the rubric, `env:` functions, verifiers.
    functions: Vec<RewardFunction>,
    /// The `env:` functions' sources (same order as in `functions`, after the rubric).
    env_sources: Vec<String>,
    verifiers: Vec<Verifier>,
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
        let functions = reward_functions(spec.kind, &spec.weights, &spec.env_functions, &spec.verifiers);
        let verifiers = spec.verifiers.iter().map(|v| Verifier::start(v.verifier()).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
        Ok(Scorer { kind: spec.kind, judge, rubric: rubric_weights(&spec.weights), functions, env_sources: spec.env_functions.clone(), verifiers })
    }

    /// The reward functions summed, in order.
    pub fn functions(&self) -> &[RewardFunction] {
        &self.functions
    }

    /// Every function's score of each trajectory of `group` (rows: trajectories).
    fn function_scores(&self, group: &Group, rubric: &[f64]) -> Vec<Vec<Score>> {
        let prompts: Vec<Vec<rlmesh_core::Message>> = group
            .trajectories
            .iter()
            .map(|t| crate::rollout::prompt_messages(&group.task, None, None).into_iter().chain(t.messages.iter().cloned()).collect())
            .collect();
        let requests: Vec<Request<'_>> = group
            .trajectories
            .iter()
            .zip(&prompts)
            .map(|(t, messages)| Request { task: &group.task, messages, completion: &t.final_answer })
            .collect();
        let verified: Vec<Vec<Score>> = self.verifiers.iter().map(|v| v.score_all(&requests)).collect();
        group
            .trajectories
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut row = vec![Score::Value(rubric[i])];
                for source in &self.env_sources {
                    row.push(t.grades.iter().find(|(n, _)| n == source).map_or(Score::NotApplicable, |(_, s)| s.clone()));
                }
                row.extend(verified.iter().map(|v| v[i].clone()));
                row
            })
            .collect()
    }

    /// Scores every trajectory of a group.
    pub fn score(&self, group: Group) -> ScoredGroup {
        let start = Instant::now();
        let stats = JudgeStats::default();
        let mut scores: Vec<ScoredTrajectory> = group
            .trajectories
            .iter()
            .map(|traj| {
                let t = Transcript::from_trajectory(traj);
                // HierR judges the summary once; the segments reuse it.
                let h = hierr_reward(&group.task, &t, self.judge.as_ref(), &stats);
                let s = match self.kind {
                    RewardKind::Process => process_reward_weighted(&group.task, &t, &self.rubric),
                    RewardKind::FinalOnly => final_only_reward_weighted(&group.task, &t, &self.rubric),
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
                    functions: Vec::new(),
                    segments,
                    outcome: trajectory_outcome(&group.task, traj),
                    row,
                }
            })
            .collect();
        // The total over the reward functions (the rubric alone: its own total, exactly).
        let rubric: Vec<f64> = scores.iter().map(|s| s.total).collect();
        let rows = self.function_scores(&group, &rubric);
        let mut unscorable = None;
        for (s, row) in scores.iter_mut().zip(&rows) {
            s.functions = self.functions.iter().zip(row).map(|(f, v)| (f.name.clone(), v.value())).collect();
            match combine_row(&self.functions, row) {
                Ok(total) => s.total = total,
                Err(e) => {
                    s.total = f64::NAN;
                    unscorable.get_or_insert(e.to_string());
                }
            }
            s.row.total_reward = s.total;
        }
        let judge = JudgeCost { calls: stats.calls(), failures: stats.failures(), seconds: start.elapsed().as_secs_f64() };
        ScoredGroup { group, scores, judge, unscorable }
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
