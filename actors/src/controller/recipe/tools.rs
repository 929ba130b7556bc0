//! `[[tool_server]]` and `[tool_limits]`: tools from MCP servers, and the
//! limits every tool call runs under.
//!
//! ```toml
//! [[tool_server]]
//! name = "files"
//! command = ["python3", "tools.py"]   # relative to the recipe's directory
//! session = "per_rollout"             # or "shared"
//! reset_tool = "reset"                # called with the task's env_state; hidden
//! reward_tool = "get_reward"          # its number is reward function "env:files"; hidden
//! timeout_s = 30
//!
//! [tool_limits]
//! timeout_s = 2
//! max_output_bytes = 2048
//! max_calls_per_turn = 4
//! ```
use super::checks::{at_least, at_most, positive};
use super::source::Invalid;
use rlmesh_core::tools::ExecLimits;
pub use rlmesh_mcp::ServerSpec;
use serde::{Deserialize, Serialize};

/// `[tool_limits]`: what one tool call may take.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolLimits {
    /// Seconds one call may run (default 2; an MCP server's own `timeout_s` bounds its calls too).
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Bytes of a tool's output the model sees; the rest is cut (default 2048).
    #[serde(default = "default_output")]
    pub max_output_bytes: usize,
    /// Calls executed per assistant turn; further calls fail (default 4).
    #[serde(default = "default_calls")]
    pub max_calls_per_turn: usize,
}

fn default_timeout_s() -> f64 {
    2.0
}
fn default_output() -> usize {
    2048
}
fn default_calls() -> usize {
    4
}

impl Default for ToolLimits {
    fn default() -> Self {
        ToolLimits { timeout_s: default_timeout_s(), max_output_bytes: default_output(), max_calls_per_turn: default_calls() }
    }
}

impl ToolLimits {
    /// The executor's limits.
    pub fn exec(&self) -> ExecLimits {
        ExecLimits {
            timeout_ms: (self.timeout_s * 1000.0).round() as u64,
            max_output_bytes: self.max_output_bytes,
            max_calls_per_turn: self.max_calls_per_turn,
        }
    }

    pub(super) fn validate(&self) -> Result<(), Invalid> {
        positive("tool_limits.timeout_s", self.timeout_s)?;
        at_most("tool_limits.timeout_s", self.timeout_s, 3600.0, "a rollout waits for its calls")?;
        at_least("tool_limits.max_output_bytes", self.max_output_bytes as f64, 1.0)?;
        at_most("tool_limits.max_output_bytes", self.max_output_bytes as f64, (1u64 << 24) as f64, "tool output enters the context")?;
        at_least("tool_limits.max_calls_per_turn", self.max_calls_per_turn as f64, 1.0)?;
        at_most("tool_limits.max_calls_per_turn", self.max_calls_per_turn as f64, 256.0, "calls of a turn run one after another")
    }
}

/// Checks each server's description and that names are distinct; the error
/// names `tool_server[i].field`.
pub(super) fn validate_servers(servers: &[ServerSpec], builtin: &[String]) -> Result<(), Invalid> {
    for (i, s) in servers.iter().enumerate() {
        s.validate().map_err(|e| {
            let (field, reason) = e.split_once(": ").unwrap_or(("", e.as_str()));
            Invalid::new(format!("tool_server[{i}].{}", field.split(", ").next().unwrap_or(field)), reason.to_string())
        })?;
        if servers[..i].iter().any(|o| o.name == s.name) || builtin.contains(&s.name) {
            return Err(Invalid::new(format!("tool_server[{i}].name"), format!("\"{}\" is already the name of another tool source", s.name)));
        }
    }
    Ok(())
}
