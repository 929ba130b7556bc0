//! Tasks: a prompt plus the data needed to grade a rollout on it.
use crate::chat::Message;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One expected tool call (name and arguments).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GoldCall {
    /// Tool name.
    pub name: String,
    /// Expected arguments (a JSON object).
    #[serde(default = "empty_object", with = "crate::wire::json_value")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// The kind of a task, as the error-analysis table names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskType {
    /// Needs exactly the gold tool calls, then a final answer.
    ToolRequired,
    /// Must be answered without any tool call.
    NoTool,
    /// Needs two or more steps of calls and a final summary.
    MultiStep,
}

impl TaskType {
    /// The snake_case name used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskType::ToolRequired => "tool_required",
            TaskType::NoTool => "no_tool",
            TaskType::MultiStep => "multi_step",
        }
    }
}

/// A prompt plus its grading data. Generated tasks and tasks read from a file
/// ([`crate::dataset::task_file`]) are this same type.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Stable identifier (unique within a dataset).
    #[serde(default)]
    pub id: String,
    /// The user prompt (with [`Task::messages`], the text of their last user message).
    #[serde(default)]
    pub prompt: String,
    /// Whether a correct rollout must call a tool.
    pub requires_tool: bool,
    /// Tools the model may call; empty on a tool task: any tool.
    #[serde(default)]
    pub allowed_tools: Vec<String>,
    /// Expected calls, one list per step (parallel calls share a step).
    #[serde(default)]
    pub gold_tool_calls: Vec<Vec<GoldCall>>,
    /// Expected final answer (compared loosely, see the reward module).
    #[serde(default)]
    pub expected_answer: Option<String>,
    /// Stateful environment this task runs in (`None`: stateless tools only).
    #[serde(default)]
    pub environment: Option<String>,
    /// Initial state handed to the environment's `reset`.
    #[serde(default, with = "crate::wire::json_value_opt")]
    pub env_state: Option<Value>,
    /// The prompt as chat messages, when a task file gave a list (a system
    /// message and earlier turns allowed; it ends with the user's turn). Empty:
    /// [`Task::prompt`] is the one user message.
    #[serde(default)]
    pub messages: Vec<Message>,
    /// Any JSON a task file's row carries for verifiers (`info`; verl's `extra_info`).
    #[serde(default, with = "crate::wire::json_value_opt")]
    pub info: Option<Value>,
}

impl Task {
    /// The task's kind, derived from its grading data.
    pub fn task_type(&self) -> TaskType {
        if !self.requires_tool {
            TaskType::NoTool
        } else if self.gold_tool_calls.len() >= 2 {
            TaskType::MultiStep
        } else {
            TaskType::ToolRequired
        }
    }
    /// All gold calls flattened over steps.
    pub fn gold_calls_flat(&self) -> impl Iterator<Item = &GoldCall> {
        self.gold_tool_calls.iter().flatten()
    }
}
