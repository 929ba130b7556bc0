//! # rlmesh-mcp: tools from MCP servers
//!
//! The Model Context Protocol has thousands of ready tool servers; this crate
//! makes any of them a source of tools for rlmesh's rollouts. A server is
//! described as data ([`ServerSpec`], a recipe's `[[tool_server]]`), so every
//! process that runs tools, on any host, starts or reaches its own: a child
//! process speaking MCP on stdio, or a server at a Streamable HTTP URL. It is
//! built on the official Rust SDK, `rmcp`, and knows nothing about RL beyond
//! rlmesh-core's tool interface.
//!
//! Starting a server initializes it and reads `tools/list`: each tool becomes
//! a [`ToolSpec`](rlmesh_core::tools::ToolSpec) (its `inputSchema` is the
//! parameters, checked by rlmesh-core's validator before a call is sent), except
//! the hidden reset and reward tools, which only the runtime calls. A
//! [`McpServer`] is a [`ToolSource`](rlmesh_core::tools::ToolSource):
//! [`register`] adds servers to a [`ToolRegistry`](rlmesh_core::tools::ToolRegistry),
//! which opens a session per rollout, one shared session for a stateless
//! server, or a fresh one (its own child, or its own HTTP session) reset with
//! the task's `env_state` for a stateful one, TRL's `environment_factory`
//! as a language-neutral contract. A call's text content is the tool message;
//! `isError` makes it a tool error.
//!
//! Failures are counted, never faked. A server that cannot start, lists no
//! tools or clashes with another's names is refused with its name and the end
//! of its stderr. A call that times out or finds its server dead becomes an
//! error for the model, and the session is restarted after an exponential
//! back-off; past the server's restart budget the server is given up and
//! [`McpServer::health`] (and the registry's `health`) reports
//! [`McpError::BudgetExhausted`], so the run can stop at a checkpoint. A
//! rollout whose session was restarted has lost its state, so its reward is
//! an error (unscorable), not a number.
//!
//! No child outlives its owner: each leads its own process group, killed when
//! its session is dropped, and is armed to die with this process.
//!
//! rlmesh-core's tool handlers are synchronous and run on the executor's tool
//! threads; calls go to this crate's own tokio runtime and the calling thread
//! waits, so no tokio worker is ever blocked.
//!
//! ```no_run
//! use rlmesh_core::tools::{ExecLimits, ToolRegistry};
//! use rlmesh_mcp::{register, ServerSpec, SessionMode};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let task: rlmesh_core::Task = serde_json::from_str(r#"{"requires_tool": true, "env_state": {"start": 1}}"#)?;
//! let files = ServerSpec {
//!     session: SessionMode::PerRollout,
//!     reset_tool: Some("reset".into()),
//!     reward_tool: Some("get_reward".into()),
//!     prestart: 8, // the group size: rollouts open without waiting for a process
//!     ..ServerSpec::stdio("files", ["python3", "tools.py"])
//! };
//! let mut registry = ToolRegistry::from_names(&["calculator"], ExecLimits::default())?;
//! let _servers = register(&mut registry, &[files])?; // refused here: exit 2 with the error
//! let mut session = registry.session(&task)?; // a fresh server, reset with task.env_state
//! let turn = session.parse("<tool_call>\n{\"name\": \"increment\", \"arguments\": {}}\n</tool_call>");
//! let steps = session.execute(0, &turn.calls);
//! for (source, grade) in session.grades() {
//!     // ("files", Ok(Some(1.0))): reward function "env:files"; Err: the rollout is unscorable
//! }
//! registry.health()?; // Err once a server is past its restart budget: stop at a checkpoint
//! # Ok(()) }
//! ```
//!
//! - [`spec`]: the server description, validated field by field.
//! - [`server`]: a started server, its sessions, restarts, and [`register`].
//! - [`error`]: [`McpError`], naming the server (and quoting its stderr).
//! - `connection`: one MCP session over stdio or Streamable HTTP, and a result's text.
//! - `child`: a stdio server's child, in its own process group, dying with its owner.
//! - `health`: the restart budget and back-off.
//! - `runtime`: the crate's tokio runtime, bridging synchronous handlers.
#![warn(missing_docs)]

mod child;
mod connection;
pub mod error;
mod health;
mod runtime;
pub mod server;
pub mod spec;

pub use error::McpError;
pub use server::{parse_reward, register, McpServer, McpSession};
pub use spec::{ServerSpec, SessionMode, Transport};
