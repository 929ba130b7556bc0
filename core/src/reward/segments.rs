//! Segment and step scores of one trajectory: what SLCA-GRPO and StepTool train on.
//!
//! - Segments (SLCA-GRPO): the HierR process reward `p` of the tool calls, the
//!   judge's summary reward `q` of the final reply, the total `z` and the
//!   no-call flag `n` ([`super::hierr::hierr_reward`]).
//! - Steps (StepTool): one reward per assistant turn, in the order of the
//!   loss mask's runs of 1s — each turn the policy wrote is one run, because
//!   tool results (mask 0) separate them. A turn with calls gets
//!   `(SuccCalling + Contribution/5)/2` ([`super::steptool::annotate`]); the
//!   final reply gets IsSolved. A rollout that stopped on a call turn (out of
//!   turns or tokens) has no reply turn: IsSolved is added to its last call
//!   turn, so every run carries exactly one reward and the outcome is never
//!   dropped.
use super::hierr::{hierr_process, hierr_reward};
use super::judge::{Judge, JudgeStats};
use super::steptool::{annotate, StepAnnotation};
use super::{Scored, Transcript};
use crate::task::Task;
use crate::trajectory::Trajectory;
use serde::{Deserialize, Serialize};

/// The per-segment and per-step scores of one trajectory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SegmentScores {
    /// HierR process reward `p` (0 when `no_call`).
    pub process: f64,
    /// Summary reward `q` from the judge (0 when `no_call`).
    pub summary: f64,
    /// HierR total `z`: `p + q`, or −0.5 with `no_call`.
    pub total: f64,
    /// A tool-requiring task got no valid call.
    pub no_call: bool,
    /// One reward per assistant turn (per run of 1s in the loss mask), in order.
    pub step_rewards: Vec<f64>,
    /// SuccCalling of each call turn.
    pub succ_calling: Vec<f64>,
    /// Contribution (0..=5) of each call turn.
    pub contribution: Vec<f64>,
    /// IsSolved: 1, 0.5 (no expected answer) or 0.
    pub solved: f64,
}

/// Rewards of the turns: `actions` call turns, then the reply turn when there is one.
///
/// Annotated call turns beyond `actions` are dropped and missing ones score 0
/// (the transcript and the token record disagree only on malformed turns).
pub fn turn_rewards(a: &StepAnnotation, actions: usize, has_reply: bool) -> Vec<f64> {
    let mut out: Vec<f64> = a.step_rewards();
    out.pop();
    out.resize(actions, 0.0);
    match (has_reply, out.last_mut()) {
        (true, _) => out.push(a.solved),
        (false, Some(last)) => *last += a.solved,
        (false, None) => {}
    }
    out
}

/// The segment and step scores of `traj` on `task`, the summary judged by `judge`.
pub fn segment_scores(task: &Task, traj: &Trajectory, judge: &dyn Judge, stats: &JudgeStats) -> SegmentScores {
    let t = Transcript::from_trajectory(traj);
    let h = hierr_reward(task, &t, judge, stats);
    segments_of(task, traj, &t, &h)
}

/// [`segment_scores`] from the trajectory's transcript `t` and its HierR reward `h`
/// (already judged: a model judge is called once per trajectory).
pub fn segments_of(task: &Task, traj: &Trajectory, t: &Transcript, h: &Scored) -> SegmentScores {
    let no_call = h.component("no_call") == Some(1.0);
    let a = annotate(task, t);
    let actions = traj.segments.iter().filter(|s| !s.is_empty()).count();
    let has_reply = traj.summary.is_some_and(|s| !s.is_empty());
    SegmentScores {
        process: if no_call { 0.0 } else { hierr_process(task, t).process() },
        summary: h.component("summary").unwrap_or(0.0),
        total: h.total,
        no_call,
        step_rewards: turn_rewards(&a, actions, has_reply),
        succ_calling: a.succ_calling.clone(),
        contribution: a.contribution.clone(),
        solved: a.solved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_rewards_by_hand() {
        let a = StepAnnotation { succ_calling: vec![1.0, 0.0], contribution: vec![5.0, 2.0], solved: 1.0 };
        // (1 + 5/5)/2 = 1, (0 + 2/5)/2 = 0.2, then IsSolved 1
        assert_eq!(turn_rewards(&a, 2, true), vec![1.0, 0.2, 1.0]);
        // No reply turn: IsSolved joins the last call turn.
        assert_eq!(turn_rewards(&a, 2, false), vec![1.0, 1.2]);
        // A third call turn the annotator did not see scores 0; a reply alone gets IsSolved.
        assert_eq!(turn_rewards(&a, 3, true), vec![1.0, 0.2, 0.0, 1.0]);
        assert_eq!(turn_rewards(&a, 0, true), vec![1.0]);
        assert!(turn_rewards(&a, 0, false).is_empty());
    }
}
