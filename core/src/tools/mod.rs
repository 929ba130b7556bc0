//! Tools: schemas, the calculator, stateful environments, execution, and the tool-call parsers
//! (`<tool_call>` blocks and the other families' [`formats`]).
//!
//! A rollout drives tools through a [`ToolSession`] opened on its task by the
//! run's [`ToolRegistry`]:
//!
//! 1. `registry.session(&task)` — a fresh environment instance (if the task
//!    names one), reset on the task; `session.observation()` goes after the
//!    prompt and `session.schemas()` into the chat template's `tools=`.
//! 2. After each assistant turn: `let turn = session.parse(&text)` splits the
//!    text into content and `<tool_call>` blocks ([`parse`]);
//!    `turn.message()` is the assistant message, `turn.format_errors()` the
//!    malformed blocks.
//! 3. `session.execute(turn_index, &turn.calls)` runs every block in order
//!    under the [`ExecLimits`] and returns one [`Step`](crate::Step) per
//!    block; each step's `result` is the content of its `tool` message
//!    (`{"error": "…"}` when it failed).
//! 4. At the end, `session.grades()` are the sources' own grades (an
//!    environment's `get_reward`, a tool server's reward tool).
//!
//! Besides the built-in tools and environments, a registry holds external
//! [`ToolSource`]s (e.g. MCP servers, from `rlmesh-mcp`), opened on every
//! rollout: `registry.add_source(...)`; `registry.health()` says when one can
//! no longer serve.
//!
//! Tools are typed: an argument struct made with [`tool_args!`](crate::tool_args)
//! yields the parameter schema transformers' `get_json_schema` would produce
//! for the equivalent Python function ([`schema`]).
pub mod calculator;
pub mod environment;
pub mod execute;
pub mod formats;
pub mod inventory;
pub mod parse;
pub mod registry;
pub mod schema;
pub mod source;
pub mod tool;

pub use environment::{Environment, Method};
pub use execute::ExecLimits;
pub use formats::ToolFormat;
pub use parse::{parse_turn, ParsedCall, ParsedTurn};
pub use registry::{RegistryError, ToolRegistry, ToolSession};
pub use schema::{SchemaType, ToolArgs};
pub use source::{Grader, SourceSession, ToolSource};
pub use tool::{CallError, Tool, ToolError, ToolSpec};
