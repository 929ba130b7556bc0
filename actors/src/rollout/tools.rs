//! The tools of a process that runs rollouts: the built-in tools named in
//! the recipe and the MCP servers of its `[[tool_server]]` tables, which each
//! such process starts (or reaches) for itself.
use rlmesh_core::tools::{ExecLimits, ToolFormat, ToolRegistry};
use rlmesh_mcp::{McpServer, ServerSpec};
use std::sync::Arc;

/// A registry and the servers behind it (dropping them stops their processes).
pub struct Tools {
    /// Built-in tools and the servers' tools.
    pub registry: ToolRegistry,
    /// The started servers.
    pub servers: Vec<Arc<McpServer>>,
}

/// Builds the registry: built-in `names`, then every server in `servers`
/// (started together; the first that fails is the error, naming it and
/// quoting the end of its stderr).
pub fn open_tools(names: &[String], servers: &[ServerSpec], limits: ExecLimits, format: ToolFormat) -> Result<Tools, String> {
    let mut registry = ToolRegistry::from_names(names, limits).map_err(|e| e.to_string())?.with_format(format);
    let servers = if servers.is_empty() { Vec::new() } else { rlmesh_mcp::register(&mut registry, servers).map_err(|e| e.to_string())? };
    Ok(Tools { registry, servers })
}
