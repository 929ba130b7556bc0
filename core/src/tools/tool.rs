//! A tool: name, description, parameter schema and a handler that returns text
//! or an error.
use super::schema::{validate, ToolArgs};
use serde_json::{json, Value};
use std::sync::Arc;

/// What a tool tells the model when it cannot do the job (`Err` of a call).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    /// A tool error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        ToolError(message.into())
    }
}

/// Why a tool call did not produce a result; its text becomes the tool
/// message `{"error": "<text>"}`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CallError {
    /// The `<tool_call>` block is not `{"name": <string>, "arguments": <object>}` JSON.
    #[error("malformed tool call: {0}")]
    Format(String),
    /// The name is not one of the rollout's tools.
    #[error("unknown tool \"{name}\" (available: {available})")]
    UnknownTool {
        /// Name as written by the model.
        name: String,
        /// The rollout's tool names, comma-separated.
        available: String,
    },
    /// The arguments do not match the tool's schema.
    #[error("invalid arguments for \"{tool}\": {reason}")]
    Arguments {
        /// Tool name.
        tool: String,
        /// What was expected and found.
        reason: String,
    },
    /// More calls than the per-turn cap; this one was not executed.
    #[error("call not executed: at most {0} tool calls run per turn")]
    CallLimit(usize),
    /// The tool ran and reported an error.
    #[error("{0}")]
    Tool(#[from] ToolError),
    /// The tool panicked.
    #[error("tool \"{tool}\" crashed: {message}")]
    Panicked {
        /// Tool name.
        tool: String,
        /// The panic message.
        message: String,
    },
    /// The tool did not return within the time limit.
    #[error("tool \"{tool}\" timed out after {ms} ms")]
    TimedOut {
        /// Tool name.
        tool: String,
        /// The limit in milliseconds.
        ms: u64,
    },
}

impl CallError {
    /// True for failures of the call's form (format, unknown tool, arguments)
    /// rather than of its execution.
    pub fn is_parse_failure(&self) -> bool {
        matches!(self, CallError::Format(_) | CallError::UnknownTool { .. } | CallError::Arguments { .. })
    }
}

/// The tool message content of a failed call: `{"error": "<message>"}`.
pub fn error_result(message: &str) -> String {
    format!("{{\"error\": {}}}", Value::String(message.to_string()))
}

/// Name, description and parameter schema of a tool.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// Tool name (what the model writes in `"name"`).
    pub name: String,
    /// One-paragraph description shown to the model.
    pub description: String,
    /// The `"parameters"` schema object.
    pub parameters: Value,
}

impl ToolSpec {
    /// The spec of a tool whose arguments are `A`.
    pub fn new<A: ToolArgs>(name: impl Into<String>, description: impl Into<String>) -> Self {
        ToolSpec { name: name.into(), description: description.into(), parameters: A::parameters() }
    }
    /// The schema in transformers' `get_json_schema` shape:
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub fn json_schema(&self) -> Value {
        json!({
            "type": "function",
            "function": { "name": self.name, "description": self.description, "parameters": self.parameters }
        })
    }
    /// Checks arguments against the schema (an object, required present, types and enums right).
    pub fn check_arguments(&self, arguments: &Value) -> Result<(), CallError> {
        if !arguments.is_object() {
            return Err(CallError::Arguments { tool: self.name.clone(), reason: "arguments must be a JSON object".into() });
        }
        validate(&self.parameters, arguments).map_err(|reason| CallError::Arguments { tool: self.name.clone(), reason })
    }
}

/// The code behind a tool: JSON arguments in, text or an error out.
pub type Handler = Arc<dyn Fn(&Value) -> Result<String, CallError> + Send + Sync>;

/// A callable tool: its spec and its handler. Cheap to clone.
#[derive(Clone)]
pub struct Tool {
    /// Name, description and schema.
    pub spec: Arc<ToolSpec>,
    handler: Handler,
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool").field("spec", &self.spec).finish_non_exhaustive()
    }
}

impl Tool {
    /// A stateless tool from a typed function of its arguments.
    pub fn new<A, F>(name: impl Into<String>, description: impl Into<String>, f: F) -> Self
    where
        A: ToolArgs,
        F: Fn(A) -> Result<String, ToolError> + Send + Sync + 'static,
    {
        let spec = ToolSpec::new::<A>(name, description);
        let tool = spec.name.clone();
        Tool::from_handler(spec, Arc::new(move |args: &Value| Ok(f(typed_args(&tool, args)?)?)))
    }
    /// A tool from a spec and an untyped handler (environments bind their methods this way).
    pub fn from_handler(spec: ToolSpec, handler: Handler) -> Self {
        Tool { spec: Arc::new(spec), handler }
    }
    /// Tool name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }
    /// Runs the tool on the calling thread, with no time limit (the executor adds one).
    pub fn call(&self, arguments: &Value) -> Result<String, CallError> {
        (self.handler)(arguments)
    }
}

/// Deserialises a call's arguments into the tool's argument struct.
pub fn typed_args<A: ToolArgs>(tool: &str, arguments: &Value) -> Result<A, CallError> {
    A::deserialize(arguments).map_err(|e| CallError::Arguments { tool: tool.to_string(), reason: e.to_string() })
}
