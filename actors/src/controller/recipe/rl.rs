//! `[rl]`: the RL loop: steps, groups, sampling, the overlap mode and its staleness bound.
use super::checks::{at_least, at_most, positive};
use super::source::Invalid;
use super::bounds;
use serde::{Deserialize, Serialize};

/// The RL loop.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rl {
    /// Optimizer steps (default 40).
    #[serde(default = "default_rl_steps")]
    pub steps: u64,
    /// Learning rate (default 1e-4).
    #[serde(default = "default_rl_lr")]
    pub lr: f64,
    /// Rollouts per prompt, G (at least 2; default 8).
    #[serde(default = "default_group_size")]
    pub group_size: usize,
    /// Prompt groups per optimizer step (default 8).
    #[serde(default = "default_groups_per_step")]
    pub groups_per_step: usize,
    /// Sampling temperature (> 0; default 1).
    #[serde(default = "one")]
    pub temperature: f64,
    /// Assistant turns per rollout, tool turns included (default 4).
    #[serde(default = "default_max_turns")]
    pub max_turns: usize,
    /// Generated tokens per turn (default 64).
    #[serde(default = "default_max_new_tokens")]
    pub max_new_tokens: usize,
    /// Overlap of generation and training (default `one_step_off`).
    #[serde(default = "default_mode")]
    pub mode: ModeName,
    /// Staleness bound k for `async` (default 2); `sync` implies 0, `one_step_off` 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_staleness: Option<u64>,
    /// Write a checkpoint every this many RL steps (default 25; one is also
    /// written after the warm-up and at the end). `launcher up --resume`
    /// restarts from the newest.
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: u64,
    /// DAPO's dynamic sampling (default off): a scored group whose advantages
    /// are all zero (every rollout scored alike) teaches nothing, so it is
    /// dropped (ledger and `rlmesh_groups_dropped_total{reason="uniform"}`)
    /// and another group is drawn in its place.
    #[serde(default)]
    pub dynamic_sampling: bool,
    /// With `dynamic_sampling`, at most this many groups are drawn per group a
    /// step trains (default 4, [`Rl::max_draws`]); past that budget, uniform
    /// groups are trained as they come, so a solved task mix cannot stall the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_draws: Option<usize>,
}

/// The mode as a recipe spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeName {
    /// On-policy.
    Sync,
    /// One step of overlap.
    OneStepOff,
    /// Bounded by `max_staleness`.
    Async,
}

/// The `async` bound when the recipe gives none.
pub const DEFAULT_ASYNC_STALENESS: u64 = 2;

fn one() -> f64 {
    1.0
}
fn default_checkpoint_every() -> u64 {
    25
}
/// `rl.max_draws` when the recipe gives none.
pub const DEFAULT_MAX_DRAWS: usize = 4;

impl Rl {
    /// Groups drawn at most per group a step trains, with dynamic sampling.
    pub fn max_draws(&self) -> usize {
        self.max_draws.unwrap_or(DEFAULT_MAX_DRAWS)
    }
}

fn default_rl_steps() -> u64 {
    40
}
fn default_rl_lr() -> f64 {
    1e-4
}
fn default_group_size() -> usize {
    8
}
fn default_groups_per_step() -> usize {
    8
}
fn default_max_turns() -> usize {
    4
}
fn default_max_new_tokens() -> usize {
    64
}
fn default_mode() -> ModeName {
    ModeName::OneStepOff
}

impl Default for Rl {
    fn default() -> Self {
        Rl {
            steps: default_rl_steps(),
            lr: default_rl_lr(),
            group_size: default_group_size(),
            groups_per_step: default_groups_per_step(),
            temperature: 1.0,
            max_turns: default_max_turns(),
            max_new_tokens: default_max_new_tokens(),
            mode: default_mode(),
            max_staleness: None,
            checkpoint_every: default_checkpoint_every(),
            dynamic_sampling: false,
            max_draws: None,
        }
    }
}

impl Rl {
    /// Checks ranges and the mode's staleness bound; the error names the offending field.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        let r = self;
        positive("rl.lr", r.lr)?;
        at_least("rl.group_size", r.group_size as f64, 2.0)?;
        at_least("rl.groups_per_step", r.groups_per_step as f64, 1.0)?;
        at_least("rl.checkpoint_every", r.checkpoint_every as f64, 1.0)?;
        if let Some(d) = r.max_draws {
            if !r.dynamic_sampling {
                return Err(Invalid::new("rl.max_draws", "only dynamic_sampling = true uses it; set that or remove this"));
            }
            at_least("rl.max_draws", d as f64, 1.0)?;
            at_most("rl.max_draws", d as f64, bounds::MAX_DRAWS as f64, "uniform groups dropped in one step are generated for nothing")?;
        }
        positive("rl.temperature", r.temperature)?;
        at_least("rl.max_turns", r.max_turns as f64, 1.0)?;
        at_least("rl.max_new_tokens", r.max_new_tokens as f64, 1.0)?;
        at_most("rl.group_size", r.group_size as f64, bounds::GROUP_SIZE as f64, "a group is generated as one batch")?;
        at_most("rl.groups_per_step", r.groups_per_step as f64, bounds::GROUPS_PER_STEP as f64, "a step's groups are held in memory")?;
        at_most("rl.max_turns", r.max_turns as f64, bounds::MAX_TURNS as f64, "each turn is a generation and a tool call")?;
        at_most("rl.max_new_tokens", r.max_new_tokens as f64, bounds::MAX_NEW_TOKENS as f64, "the longest context of the models rlmesh loads")?;
        at_most("rl.steps", r.steps as f64, bounds::STEPS as f64, "past a year of steps")?;
        if let Some(k) = r.max_staleness {
            at_most("rl.max_staleness", k as f64, bounds::MAX_STALENESS as f64, "every policy version a buffered group may come from is kept")?;
        }
        match (r.mode, r.max_staleness) {
            (ModeName::Sync, Some(k)) if k != 0 => Err(Invalid::new("rl.max_staleness", format!("mode \"sync\" means 0, got {k}"))),
            (ModeName::OneStepOff, Some(k)) if k != 1 => {
                Err(Invalid::new("rl.max_staleness", format!("mode \"one_step_off\" means 1, got {k}")))
            }
            (ModeName::Async, Some(0)) => Err(Invalid::new("rl.max_staleness", "mode \"async\" needs at least 1 (0 is \"sync\")")),
            _ => Ok(()),
        }
    }
}
