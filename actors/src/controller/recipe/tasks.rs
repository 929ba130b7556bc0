//! `[tasks]`: the generated task mix, split into training and held-out tasks.
use super::checks::{at_least, at_most, unit};
use super::source::Invalid;
use super::bounds;
use serde::{Deserialize, Serialize};

/// The task mix: the seed's generator, split into training and held-out tasks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskMix {
    /// Number of training tasks.
    pub size: usize,
    /// Number of held-out evaluation tasks (at least 100; default 200).
    #[serde(default = "default_held_out")]
    pub held_out: usize,
    /// Share of tasks that need a tool, in `[0, 1]` (default 0.5).
    #[serde(default = "half")]
    pub tool_fraction: f64,
    /// Share of tool tasks needing two or more steps, in `[0, 1]` (default 0).
    #[serde(default)]
    pub multi_step_fraction: f64,
    /// Whether multi-step tasks include inventory tasks (needs the `inventory` tool; default false).
    #[serde(default)]
    pub inventory: bool,
    /// Share of the multi-step calculator tasks that need three dependent calls
    /// (`((a + b) * c) - d`) rather than two, in `[0, 1]` (default 0).
    #[serde(default)]
    pub three_step_fraction: f64,
    /// Seed of the generator (default 0).
    #[serde(default)]
    pub seed: u64,
}

fn default_held_out() -> usize {
    200
}
fn half() -> f64 {
    0.5
}

impl TaskMix {
    /// Checks ranges; the error names the offending field.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        let t = self;
        at_least("tasks.size", t.size as f64, 1.0)?;
        at_least("tasks.held_out", t.held_out as f64, 100.0)?;
        let held = "tasks are generated and held in memory";
        at_most("tasks.size", t.size as f64, bounds::TASKS as f64, held)?;
        at_most("tasks.held_out", t.held_out as f64, bounds::TASKS as f64, held)?;
        unit("tasks.tool_fraction", t.tool_fraction)?;
        unit("tasks.multi_step_fraction", t.multi_step_fraction)?;
        unit("tasks.three_step_fraction", t.three_step_fraction)?;
        Ok(())
    }
}
