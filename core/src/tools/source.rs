//! Tool sources: tools bound once per rollout, with an optional observation
//! and grade. A built-in [`Environment`](super::Environment) is one; a tool
//! server outside this crate (an MCP server of `rlmesh-mcp`) is another.
//!
//! The registry keeps a source's specs for the prompt and calls
//! [`ToolSource::open`] for every rollout; the returned [`SourceSession`]'s
//! tools are plain [`Tool`]s, run by the executor like any other. Closing a
//! session is dropping it (its tools and grader hold whatever it needs).
use super::execute::ExecLimits;
use super::tool::{Tool, ToolSpec};
use crate::task::Task;
use std::sync::Arc;

/// A source's grade of a finished rollout: `Ok(None)` when it gives none,
/// `Err` when it could not grade (the rollout is then unscorable, never 0).
pub type Grader = Arc<dyn Fn() -> Result<Option<f64>, String> + Send + Sync>;

/// One rollout's view of a source: its bound tools, the text to append to the
/// prompt, and its grader.
pub struct SourceSession {
    /// The tools, bound to this rollout's state.
    pub tools: Vec<Tool>,
    /// Appended to the prompt (e.g. what a reset said).
    pub observation: Option<String>,
    /// Grades the rollout's final state.
    pub grader: Option<Grader>,
}

/// Something that offers tools per rollout; the registry owns it and opens a
/// [`SourceSession`] on every rollout's task. Implementations bound their own
/// waits (`open` and the grader are called without a time limit).
pub trait ToolSource: Send + Sync {
    /// Its name, in configs, errors and reward names (`env:<name>`).
    fn name(&self) -> &str;
    /// The tools every session offers (names, descriptions, schemas), in order.
    fn specs(&self) -> Vec<ToolSpec>;
    /// Checks that a task can run here (e.g. its `env_state`); used when loading tasks.
    fn check_task(&self, _task: &Task) -> Result<(), String> {
        Ok(())
    }
    /// Opens a rollout on `task` (a fresh state, reset on the task).
    fn open(&self, task: &Task, limits: &ExecLimits) -> Result<SourceSession, String>;
    /// `Err` once the source can no longer serve (e.g. a tool server past its
    /// restart budget): the run should stop at a checkpoint.
    fn health(&self) -> Result<(), String> {
        Ok(())
    }
    /// Whether every [`open`](Self::open) starts a process (a per-rollout
    /// tool server): then a session costs about a second, and bulk work that
    /// opens one per task (the tiny model's tokenizer corpus) samples tasks.
    fn starts_a_process_per_session(&self) -> bool {
        false
    }
}
