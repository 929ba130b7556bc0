//! Reward functions: process-aware reward, HierR, StepTool annotators, judges, TRL-style combination.
//!
//! Every reward reads a [`Transcript`]: the assistant turns of one rollout, the
//! `<tool_call>` blocks of each turn (well-formed or not), the tool results
//! matched to the calls in order, and the final reply. A transcript is built
//! from a [`crate::Trajectory`] (its executed steps, format errors and final
//! answer), from a raw completion string, or from a transformers-format
//! messages list — so the same rule scores a live rollout and an offline
//! `launcher reward` line.
//!
//! - [`process`] — the seed's process-aware rubric (tool-required and no-tool)
//!   and the final-answer-only reward kept for comparison.
//! - [`hierr`] — SLCA-GRPO's hierarchical process reward (fmt, name, key,
//!   value, parallel) and the judge-scored summary reward.
//! - [`steptool`] — StepTool's per-action rewards from rule-based annotators.
//! - [`segments`] — a trajectory's segment rewards (process, summary) and its
//!   per-turn step rewards, aligned with the loss mask's runs.
//! - [`judge`] — the [`judge::Judge`] interface, the rule-based judge and the
//!   summary rubric (states the result, concise, grounded).
//! - [`combine`] — TRL's multi-reward combination (NaN-aware weighted sum,
//!   per-function statistics).
//! - [`functions`] — a rollout's total over named, weighted reward functions
//!   (rubric, verifiers, environment), where a function that fails makes the
//!   rollout unscorable rather than 0.
//! - [`answer`] — loose comparison of answers and argument values.
//!
//! Components that do not apply to a task are `None`, never 0.
use serde_json::{Map, Value};

pub mod answer;
pub mod combine;
pub mod functions;
pub mod hierr;
pub mod judge;
pub mod process;
pub mod segments;
pub mod steptool;
pub mod transcript;

pub use transcript::{Block, Call, Outcome, Transcript, Turn};

/// A scalar reward together with its named components (`None`: does not apply).
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    /// The reward.
    pub total: f64,
    /// Named components in a fixed order.
    pub components: Vec<(&'static str, Option<f64>)>,
}

impl Scored {
    /// The value of a component (`None` when it does not apply or is not part of this reward).
    pub fn component(&self, name: &str) -> Option<f64> {
        self.components.iter().find(|(n, _)| *n == name).and_then(|(_, v)| *v)
    }

    /// `{"total": …, "components": {name: value|null, …}}` as `launcher reward` prints it.
    pub fn to_json(&self) -> Value {
        let components: Map<String, Value> =
            self.components.iter().map(|(n, v)| (n.to_string(), v.map_or(Value::Null, Value::from))).collect();
        serde_json::json!({ "total": self.total, "components": components })
    }
}

/// `Σ weight · component` over the components that apply.
fn weighted_sum(parts: &[(f64, Option<f64>)]) -> f64 {
    parts.iter().filter_map(|(w, v)| v.map(|v| w * v)).sum()
}

/// 1.0 for true, 0.0 for false.
fn indicator(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}
