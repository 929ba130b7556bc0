//! `[tasks]`: the training and held-out tasks, from the user's file or the
//! seed's generator.
//!
//! ```toml
//! [tasks]
//! file = "train.jsonl"          # JSONL, or Parquet by extension; relative to the recipe
//! held_out = 50                 # rows split off with the recipe's seed (or held_out_file = "…")
//! [tasks.columns]               # other shapes: TRL-, verl- and verifiers-shaped files
//! prompt = "question"
//! info = "extra_info"
//! ```
use super::checks::{at_least, at_most, unit};
use super::source::Invalid;
use super::bounds;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The tasks: a file of the user's, or the seed's generator, split into
/// training and held-out tasks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskMix {
    /// The tasks' file (JSONL, or Parquet by extension; relative to the
    /// recipe). Without it, tasks are generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Held-out tasks from their own file (same columns) instead of `held_out` rows of `file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out_file: Option<String>,
    /// Where each task field comes from in the file (`prompt = "question"`,
    /// `answer = "reward_model.ground_truth"`, `info = "extra_info"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub columns: BTreeMap<String, String>,
    /// Number of generated training tasks (required without `file`; with it,
    /// at most this many of the file's rows are trained on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<usize>,
    /// Held-out evaluation tasks: generated (at least 100; default 200), or
    /// rows of `file` split off with the recipe's seed (default 0 with
    /// `held_out_file`, else 200 or a fifth of the file, whichever is fewer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out: Option<usize>,
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

/// Held-out tasks generated when `held_out` is not given.
pub const DEFAULT_HELD_OUT: usize = 200;

fn half() -> f64 {
    0.5
}

impl TaskMix {
    /// Checks ranges; the error names the offending field.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        let t = self;
        let held = "tasks are held in memory";
        if let Some(size) = t.size {
            at_least("tasks.size", size as f64, 1.0)?;
            at_most("tasks.size", size as f64, bounds::TASKS as f64, held)?;
        }
        if let Some(n) = t.held_out {
            at_most("tasks.held_out", n as f64, bounds::TASKS as f64, held)?;
        }
        if t.file.is_none() {
            if t.size.is_none() {
                return Err(Invalid::new("tasks.size", "generated tasks need a size (or name a file: [tasks] file = \"train.jsonl\")"));
            }
            at_least("tasks.held_out", self.held_out_count() as f64, 100.0)?;
            for (k, set) in [("held_out_file", t.held_out_file.is_some()), ("columns", !t.columns.is_empty())] {
                if set {
                    return Err(Invalid::new(format!("tasks.{k}"), "only tasks from a file use it: add [tasks] file = \"…\""));
                }
            }
        } else if t.held_out_file.is_some() && t.held_out.is_some_and(|n| n > 0) {
            return Err(Invalid::new("tasks.held_out", "give held_out_file or held_out rows of the file, not both"));
        }
        unit("tasks.tool_fraction", t.tool_fraction)?;
        unit("tasks.multi_step_fraction", t.multi_step_fraction)?;
        unit("tasks.three_step_fraction", t.three_step_fraction)?;
        Ok(())
    }
}

impl TaskMix {
    /// Whether the tasks come from a file.
    pub fn from_file(&self) -> bool {
        self.file.is_some()
    }

    /// Generated training tasks (`size`; files: unused).
    pub fn size(&self) -> usize {
        self.size.unwrap_or(0)
    }

    /// Held-out tasks to generate, or rows of the file to hold out (`None`:
    /// the file's default, 200 or a fifth of it).
    pub fn held_out_count(&self) -> usize {
        self.held_out.unwrap_or(DEFAULT_HELD_OUT)
    }
}
