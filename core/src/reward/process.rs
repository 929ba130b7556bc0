//! The seed's process-aware reward and the final-answer-only reward.
//!
//! Tool-required (and multi-step) task:
//! `0.10·format_ok + 0.20·correct_tool + 0.20·correct_arguments
//! + 0.20·execution_success + 0.30·final_correct − 0.25·repeated_call`.
//! No-tool task: `0.20·format_ok + 0.30·no_call + 0.50·final_correct`.
//! Components that do not apply are `None` and add nothing.
//!
//! Component rules:
//! - `format_ok`: every `<tool_call>` block is well-shaped, opening and
//!   closing tags balance, and there is a non-empty final reply;
//! - `correct_tool`: the set of called names equals the set of gold names
//!   (without gold calls: at least one call and every name allowed);
//! - `correct_arguments`: every gold call is matched by a distinct call of the
//!   same name whose arguments have the same keys with [`loose_eq`] values
//!   (`None` without gold calls);
//! - `execution_success`: at least one call, and every call ran without error;
//! - `final_correct`: [`answers_match`] (`None` without an expected answer);
//! - `repeated_call`: a call repeats an earlier one (same name and arguments);
//! - `no_call`: no `<tool_call>` block at all.
use super::answer::{answers_match, loose_eq};
use super::transcript::{Block, Call, Transcript};
use super::{indicator, weighted_sum, Scored};
use crate::task::Task;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Component names of [`process_reward`], in output order.
pub const PROCESS_COMPONENTS: [&str; 7] =
    ["format_ok", "correct_tool", "correct_arguments", "execution_success", "final_correct", "repeated_call", "no_call"];

/// Component names of [`final_only_reward`].
pub const FINAL_ONLY_COMPONENTS: [&str; 2] = ["format_ok", "final_correct"];

/// A recipe's `[reward_weights]` for the rubric: a component's weight in place
/// of its default, wherever the rubric uses that component (`final_correct =
/// 0.5` sets it for tool and no-tool tasks alike).
///
/// ```
/// use rlmesh_core::reward::process::{process_reward_weighted, RubricWeights};
/// use rlmesh_core::reward::Transcript;
/// let task: rlmesh_core::Task = serde_json::from_str(r#"{"requires_tool": false, "expected_answer": "4"}"#).unwrap();
/// let t = Transcript::from_completion("4");
/// let only_answer = RubricWeights::new([("format_ok", 0.0), ("no_call", 0.0), ("final_correct", 1.0)]);
/// assert_eq!(process_reward_weighted(&task, &t, &only_answer).total, 1.0);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RubricWeights(pub BTreeMap<String, f64>);

impl RubricWeights {
    /// Weights for the named components.
    pub fn new<S: Into<String>>(w: impl IntoIterator<Item = (S, f64)>) -> Self {
        RubricWeights(w.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
    /// The weight of `name`: the override, or `default`.
    pub fn get(&self, name: &str, default: f64) -> f64 {
        self.0.get(name).copied().unwrap_or(default)
    }
}

/// The seed's process-aware reward.
pub fn process_reward(task: &Task, t: &Transcript) -> Scored {
    process_reward_weighted(task, t, &RubricWeights::default())
}

/// The process-aware reward with `w`'s component weights in place of the defaults.
pub fn process_reward_weighted(task: &Task, t: &Transcript, w: &RubricWeights) -> Scored {
    let format_ok = Some(format_ok(t));
    let final_correct = final_correct(task, t);
    let calls: Vec<&Call> = t.calls().collect();
    if task.requires_tool {
        let correct_tool = Some(correct_tool(task, &calls));
        let correct_arguments = correct_arguments(task, &calls);
        let execution = Some(indicator(!calls.is_empty() && calls.iter().all(|c| c.outcome.as_ref().is_some_and(|o| o.success))));
        let repeated = Some(indicator(t.has_repeated_call()));
        let total = weighted_sum(&[
            (w.get("format_ok", 0.10), format_ok),
            (w.get("correct_tool", 0.20), correct_tool),
            (w.get("correct_arguments", 0.20), correct_arguments),
            (w.get("execution_success", 0.20), execution),
            (w.get("final_correct", 0.30), final_correct),
            (w.get("repeated_call", -0.25), repeated),
        ]);
        scored(total, [format_ok, correct_tool, correct_arguments, execution, final_correct, repeated, None])
    } else {
        let no_call = Some(indicator(t.blocks().next().is_none()));
        let total = weighted_sum(&[(w.get("format_ok", 0.20), format_ok), (w.get("no_call", 0.30), no_call), (w.get("final_correct", 0.50), final_correct)]);
        scored(total, [format_ok, None, None, None, final_correct, None, no_call])
    }
}

/// The final-answer-only reward kept for comparison: `0.10·format_ok + 0.90·final_correct`.
pub fn final_only_reward(task: &Task, t: &Transcript) -> Scored {
    final_only_reward_weighted(task, t, &RubricWeights::default())
}

/// The final-answer-only reward with `w`'s component weights.
pub fn final_only_reward_weighted(task: &Task, t: &Transcript, w: &RubricWeights) -> Scored {
    let format_ok = Some(format_ok(t));
    let final_correct = final_correct(task, t);
    Scored {
        total: weighted_sum(&[(w.get("format_ok", 0.10), format_ok), (w.get("final_correct", 0.90), final_correct)]),
        components: vec![("format_ok", format_ok), ("final_correct", final_correct)],
    }
}

fn scored(total: f64, values: [Option<f64>; 7]) -> Scored {
    Scored { total, components: PROCESS_COMPONENTS.iter().copied().zip(values).collect() }
}

fn format_ok(t: &Transcript) -> f64 {
    indicator(
        t.open_tags == t.close_tags
            && t.blocks().all(|b| matches!(b, Block::Calls(_)))
            && !t.final_answer.is_empty(),
    )
}

fn final_correct(task: &Task, t: &Transcript) -> Option<f64> {
    task.expected_answer.as_ref().map(|e| indicator(answers_match(&t.final_answer, e)))
}

fn correct_tool(task: &Task, calls: &[&Call]) -> f64 {
    let called: BTreeSet<&str> = calls.iter().map(|c| c.name.as_str()).collect();
    let gold: BTreeSet<&str> = task.gold_calls_flat().map(|g| g.name.as_str()).collect();
    if gold.is_empty() {
        let allowed = |n: &str| task.allowed_tools.is_empty() || task.allowed_tools.iter().any(|a| a == n);
        indicator(!called.is_empty() && called.iter().all(|n| allowed(n)))
    } else {
        indicator(called == gold)
    }
}

fn correct_arguments(task: &Task, calls: &[&Call]) -> Option<f64> {
    let gold: Vec<_> = task.gold_calls_flat().collect();
    if gold.is_empty() {
        return None;
    }
    let mut used = vec![false; calls.len()];
    let all_matched = gold.iter().all(|g| {
        let found = calls
            .iter()
            .enumerate()
            .find(|(i, c)| !used[*i] && c.name == g.name && same_arguments(&c.arguments, &g.arguments));
        if let Some((i, _)) = found {
            used[i] = true;
        }
        found.is_some()
    });
    Some(indicator(all_matched))
}

/// Same keys, and [`loose_eq`] values key by key.
fn same_arguments(predicted: &Value, gold: &Value) -> bool {
    match (predicted.as_object(), gold.as_object()) {
        (Some(p), Some(g)) => p.len() == g.len() && g.iter().all(|(k, gv)| p.get(k).is_some_and(|pv| loose_eq(pv, gv))),
        _ => false,
    }
}
