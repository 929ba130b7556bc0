//! A rollout's reward from several reward functions: the built-in rubric,
//! external verifiers and an environment's reward, each with a weight.
//!
//! Each function gives a [`Score`] per rollout:
//! - a value;
//! - [`Score::NotApplicable`]: the function does not apply (TRL's `None`); it
//!   is left out of the sum, and a rollout no function applies to totals NaN,
//!   which the advantage estimators turn into a zero advantage;
//! - [`Score::Unscorable`]: the function *could not* score (a verifier crashed,
//!   timed out, answered garbage or said `error`). Then the rollout has no
//!   total at all: it is [`Unscorable`], never 0, and its group must not enter
//!   group statistics.
//!
//! The sum itself is [`combine_rewards`] (TRL's NaN-aware weighted sum), so
//! live runs and `launcher reward` add the same way.
//!
//! ```
//! use rlmesh_core::reward::functions::{combine_scores, RewardFunction, Score};
//! let fs = [RewardFunction::new("process", 1.0), RewardFunction::new("verifier:math", 2.0)];
//! let rows = vec![
//!     vec![Score::Value(0.5), Score::Value(1.0)],
//!     vec![Score::Value(0.5), Score::NotApplicable],
//!     vec![Score::Value(0.5), Score::Unscorable { reason: "timed out after 30 s".into() }],
//! ];
//! let c = combine_scores(&fs, &rows);
//! assert_eq!(c.totals[0].as_ref().unwrap(), &2.5);
//! assert_eq!(c.totals[1].as_ref().unwrap(), &0.5);
//! assert_eq!(c.totals[2].as_ref().unwrap_err().to_string(), "reward function \"verifier:math\" could not score: timed out after 30 s");
//! assert_eq!(c.unscorable(), 1);
//! ```
use super::combine::{combine_rewards, per_function_stats, FunctionStats};
use serde::{Deserialize, Serialize};

/// A reward function's name and weight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RewardFunction {
    /// Its name, as metrics and the ledger show it (`process`, `verifier:math`, `env:files`).
    pub name: String,
    /// Its weight in the sum.
    pub weight: f64,
}

impl RewardFunction {
    /// A function `name` with `weight`.
    pub fn new(name: impl Into<String>, weight: f64) -> Self {
        RewardFunction { name: name.into(), weight }
    }
}

/// What one reward function said about one rollout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Score {
    /// A value (NaN counts as [`Score::NotApplicable`], as in TRL).
    Value(f64),
    /// The function does not apply to this rollout.
    NotApplicable,
    /// The function could not score it; the rollout is unscorable.
    Unscorable {
        /// Why (the verifier's error, a timeout, a crash, a bad line).
        reason: String,
    },
}

impl Score {
    /// `Some(value)` or `None` (not applicable) — TRL's per-function value;
    /// `None` as well for [`Score::Unscorable`].
    pub fn value(&self) -> Option<f64> {
        match self {
            Score::Value(v) if !v.is_nan() => Some(*v),
            _ => None,
        }
    }

    /// Whether the function failed.
    pub fn is_unscorable(&self) -> bool {
        matches!(self, Score::Unscorable { .. })
    }
}

impl From<Option<f64>> for Score {
    fn from(v: Option<f64>) -> Self {
        v.map_or(Score::NotApplicable, Score::Value)
    }
}

/// Why a rollout has no total: the first function that could not score it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("reward function \"{function}\" could not score: {reason}")]
pub struct Unscorable {
    /// The function's name.
    pub function: String,
    /// Its reason.
    pub reason: String,
}

/// The totals of a batch of rollouts, and each function's statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Combined {
    /// Per rollout: its total (NaN when no function applies), or why it has none.
    pub totals: Vec<Result<f64, Unscorable>>,
    /// Per function: mean and std of its values over the batch (what
    /// `rlmesh_reward_mean{function}` and `rlmesh_reward_std{function}` show).
    pub stats: Vec<FunctionStats>,
}

impl Combined {
    /// How many rollouts are unscorable.
    pub fn unscorable(&self) -> usize {
        self.totals.iter().filter(|t| t.is_err()).count()
    }
}

/// One rollout's total over `functions` (its `scores`, in the same order).
/// An infinite value makes the rollout unscorable as well.
///
/// # Panics
/// When `scores` and `functions` differ in length.
pub fn combine_row(functions: &[RewardFunction], scores: &[Score]) -> Result<f64, Unscorable> {
    assert_eq!(functions.len(), scores.len(), "one score per reward function");
    for (f, s) in functions.iter().zip(scores) {
        let reason = match s {
            Score::Unscorable { reason } => reason.clone(),
            Score::Value(v) if v.is_infinite() => format!("not a finite number ({v})"),
            _ => continue,
        };
        return Err(Unscorable { function: f.name.clone(), reason });
    }
    let weights: Vec<f64> = functions.iter().map(|f| f.weight).collect();
    Ok(combine_rewards(&[scores.iter().map(Score::value).collect()], &weights)[0])
}

/// The totals of a batch (`rows[i]`: rollout i's scores, one per function)
/// and each function's statistics over the values it gave.
pub fn combine_scores(functions: &[RewardFunction], rows: &[Vec<Score>]) -> Combined {
    let totals = rows.iter().map(|r| combine_row(functions, r)).collect();
    let matrix: Vec<Vec<Option<f64>>> =
        rows.iter().map(|r| r.iter().map(|s| s.value().filter(|v| v.is_finite())).collect()).collect();
    let mut stats = per_function_stats(&matrix);
    stats.resize(functions.len(), FunctionStats { mean: f64::NAN, std: f64::NAN });
    Combined { totals, stats }
}
