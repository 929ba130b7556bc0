//! StepTool's per-action rewards from rule-based annotators.
//!
//! An *action* is an assistant turn with at least one `<tool_call>` block. For
//! action t: `r_t = (SuccCalling_t + Contribution_t / 5) / 2`, where
//! - SuccCalling = 1 when every block of the turn is well-shaped and every
//!   call ran without error, else 0;
//! - Contribution = round(5 · [`overlap`] of the turn's successful results with
//!   the final reply), in 0..=5.
//!
//! The final reward is IsSolved: 1 when the reply gives the expected answer,
//! 0.5 (unsure) without an expected answer, else 0. The step rewards are the
//! action rewards followed by IsSolved (K = actions + 1 values), ready for the
//! StepTool estimator, which puts each on the last token of its action.
use super::answer::answers_match;
use super::judge::overlap;
use super::transcript::{Block, Transcript};
use super::{indicator, Scored};
use crate::task::Task;

/// What the annotators said about one rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct StepAnnotation {
    /// SuccCalling per action (0 or 1).
    pub succ_calling: Vec<f64>,
    /// Contribution per action (0..=5).
    pub contribution: Vec<f64>,
    /// IsSolved: 1 solved, 0.5 unsure, 0 unsolved.
    pub solved: f64,
}

impl StepAnnotation {
    /// `(SuccCalling + Contribution/5)/2` per action, then IsSolved.
    pub fn step_rewards(&self) -> Vec<f64> {
        self.succ_calling
            .iter()
            .zip(&self.contribution)
            .map(|(s, c)| (s + c / 5.0) / 2.0)
            .chain(std::iter::once(self.solved))
            .collect()
    }
}

/// The rule-based annotation of a rollout.
pub fn annotate(task: &Task, t: &Transcript) -> StepAnnotation {
    let mut succ_calling = Vec::new();
    let mut contribution = Vec::new();
    for turn in t.turns.iter().filter(|turn| !turn.blocks.is_empty()) {
        let well_shaped = turn.blocks.iter().all(|b| matches!(b, Block::Calls(_)));
        let ran = turn.calls().all(|c| c.outcome.as_ref().is_some_and(|o| o.success));
        succ_calling.push(indicator(well_shaped && ran && turn.calls().next().is_some()));
        let results: Vec<&str> =
            turn.calls().filter_map(|c| c.outcome.as_ref()).filter(|o| o.success).map(|o| o.result.as_str()).collect();
        contribution.push((5.0 * overlap(&results.join(" "), &t.final_answer)).round());
    }
    let solved = match &task.expected_answer {
        None => 0.5,
        Some(e) => indicator(answers_match(&t.final_answer, e)),
    };
    StepAnnotation { succ_calling, contribution, solved }
}

/// Element-wise mean of the step rewards of several annotator runs (`None` when empty or of unequal lengths).
pub fn average_runs(runs: &[Vec<f64>]) -> Option<Vec<f64>> {
    let first = runs.first()?;
    if runs.iter().any(|r| r.len() != first.len()) {
        return None;
    }
    Some((0..first.len()).map(|i| runs.iter().map(|r| r[i]).sum::<f64>() / runs.len() as f64).collect())
}

/// StepTool as one scalar: the mean of the step rewards, with components
/// `succ_calling` and `contribution` (means over actions, `None` without an action) and `is_solved`.
pub fn steptool_reward(task: &Task, t: &Transcript) -> Scored {
    let a = annotate(task, t);
    let mean = |xs: &[f64]| (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64);
    let steps = a.step_rewards();
    Scored {
        total: steps.iter().sum::<f64>() / steps.len() as f64,
        components: vec![
            ("succ_calling", mean(&a.succ_calling)),
            ("contribution", mean(&a.contribution)),
            ("is_solved", Some(a.solved)),
        ],
    }
}
