//! # rlmesh-core — the data model and the algorithms
//!
//! rlmesh trains tool-calling language-model agents with reinforcement
//! learning. This crate holds everything that is *plain data and plain
//! functions*: it never touches libtorch, sockets or actors, so every rule in
//! it can be tested with hand-computed vectors.
//!
//! The nouns:
//! - [`task::Task`] — a prompt plus what is needed to grade it (does it need a
//!   tool, which calls per step, which answer).
//! - [`chat::Message`] — a chat message in the transformers format
//!   (`role`, `content`, `tool_calls`, `name`).
//! - [`trajectory::Trajectory`] — one rollout: token ids, loss mask (1 only on
//!   policy-generated tokens), behaviour log-probs, the policy version of each
//!   token, the tool-call *segments*, the executed *steps*, the final answer.
//! - [`trajectory::Group`] — the G trajectories sampled for one task: the unit
//!   of GRPO normalisation, of dispatch and of the ledger.
//!
//! The verbs live in their own modules: [`tools`] (tool schemas, the
//! calculator, stateful environments, the `<tool_call>` parser), [`reward`]
//! (process-aware reward, HierR, StepTool annotators, TRL-style combination)
//! and [`advantage`] (GRPO, Dr.GRPO, RLOO, SLCA-GRPO, StepTool GAE).
#![warn(missing_docs)]

pub mod advantage;
pub mod analysis;
pub mod chat;
pub mod dataset;
pub mod offline;
pub mod reward;
pub mod task;
pub mod tools;
pub mod trajectory;
pub mod wire;

pub use chat::{FunctionCall, Message, ToolCallMsg};
pub use task::{GoldCall, Task, TaskType};
pub use trajectory::{Group, Span, Step, StopReason, Trajectory};
