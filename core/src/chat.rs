//! Chat messages in the shape transformers' `apply_chat_template` takes.
//!
//! ```
//! use rlmesh_core::Message;
//! let m = Message::user("Use the calculator to compute 17 * 24.");
//! assert_eq!(serde_json::to_value(&m).unwrap()["role"], "user");
//! ```
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One function call inside an assistant message (`{"name", "arguments"}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Tool name.
    pub name: String,
    /// Arguments (a JSON object for well-formed calls).
    #[serde(with = "crate::wire::json_value")]
    pub arguments: Value,
}

/// A tool call as transformers stores it on an assistant message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallMsg {
    /// Always `"function"`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// The call itself.
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".to_string()
}

impl ToolCallMsg {
    /// A function call with `type = "function"`.
    pub fn new(name: impl Into<String>, arguments: Value) -> Self {
        ToolCallMsg { kind: function_type(), function: FunctionCall { name: name.into(), arguments } }
    }
}

/// A chat message (`system`, `user`, `assistant` or `tool`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text content (may be empty for an assistant message that only calls tools).
    #[serde(default)]
    pub content: String,
    /// Tool calls of an assistant message.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallMsg>>,
    /// Tool name of a `tool` message.
    #[serde(default)]
    pub name: Option<String>,
}

impl Message {
    fn plain(role: &str, content: impl Into<String>) -> Self {
        Message { role: role.to_string(), content: content.into(), tool_calls: None, name: None }
    }
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::plain("system", content)
    }
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::plain("user", content)
    }
    /// An assistant message with text only.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::plain("assistant", content)
    }
    /// A tool result message.
    pub fn tool(name: impl Into<String>, content: impl Into<String>) -> Self {
        Message { name: Some(name.into()), ..Self::plain("tool", content) }
    }
}
