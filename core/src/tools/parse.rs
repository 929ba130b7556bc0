//! Parsing an assistant turn: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`
//! blocks (the Qwen2.5 / hermes format) into calls, and the rest into content.
//!
//! Malformed output is the normal case early in training: every block becomes
//! a [`ParsedCall`], with an error saying what is wrong when it cannot run
//! (malformed JSON, missing name, non-object arguments, an unclosed block, an
//! unknown tool, arguments that break the schema). The parser never panics.
//!
//! ```
//! use rlmesh_core::tools::{calculator, parse::parse_turn};
//! let raw = "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"operation\": \"multiply\", \"a\": 17, \"b\": 24}}\n</tool_call>";
//! let turn = parse_turn(raw, &[calculator::tool()]);
//! assert_eq!(turn.content, "Let me compute.");
//! assert_eq!(turn.calls[0].name, "calculator");
//! assert!(turn.calls[0].error.is_none());
//! ```
use super::schema::describe;
use super::tool::{CallError, Tool};
use crate::chat::{Message, ToolCallMsg};
use serde_json::Value;

/// Opening tag of a call block.
pub const OPEN: &str = "<tool_call>";
/// Closing tag of a call block.
pub const CLOSE: &str = "</tool_call>";

/// One `<tool_call>` block as the model wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    /// Tool name (empty when the block has no readable name).
    pub name: String,
    /// Arguments as written (`null` when the block has none readable).
    pub arguments: Value,
    /// The text between the tags (to the end of the text for an unclosed block).
    pub raw: String,
    /// Why the call cannot run (`None`: it can).
    pub error: Option<CallError>,
}

impl ParsedCall {
    /// True when the block is `{"name": <string>, "arguments": <object>}` JSON,
    /// whether or not the tool exists and the arguments fit its schema.
    pub fn is_well_formed(&self) -> bool {
        !matches!(self.error, Some(CallError::Format(_)))
    }
}

/// An assistant turn split into content and calls.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedTurn {
    /// The text outside well-formed blocks (the whole text when there are none;
    /// trailing whitespace before the calls dropped otherwise, as the chat template re-adds it).
    pub content: String,
    /// Every block, in order.
    pub calls: Vec<ParsedCall>,
}

impl ParsedTurn {
    /// The assistant [`Message`] in transformers' format: `content` plus one
    /// `tool_calls` entry per well-formed block (malformed blocks stay in the content).
    pub fn message(&self) -> Message {
        let calls: Vec<ToolCallMsg> = self
            .calls
            .iter()
            .filter(|c| c.is_well_formed())
            .map(|c| ToolCallMsg::new(c.name.clone(), c.arguments.clone()))
            .collect();
        Message { tool_calls: (!calls.is_empty()).then_some(calls), ..Message::assistant(self.content.clone()) }
    }
    /// The reason of every malformed block, in order.
    pub fn format_errors(&self) -> Vec<String> {
        self.calls.iter().filter(|c| !c.is_well_formed()).filter_map(|c| c.error.as_ref().map(|e| e.to_string())).collect()
    }
}

/// Splits the text of one assistant turn (without the end-of-turn token) into
/// content and calls, checking each call against `tools`.
pub fn parse_turn(text: &str, tools: &[Tool]) -> ParsedTurn {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(OPEN) {
        content.push_str(&rest[..open]);
        let after = &rest[open + OPEN.len()..];
        let Some(close) = after.find(CLOSE) else {
            let reason = format!("unclosed {OPEN} block: no {CLOSE} follows it");
            calls.push(ParsedCall { name: String::new(), arguments: Value::Null, raw: after.to_string(), error: Some(CallError::Format(reason)) });
            content.push_str(&rest[open..]);
            rest = "";
            break;
        };
        let call = parse_block(&after[..close], tools);
        if !call.is_well_formed() {
            content.push_str(&rest[open..open + OPEN.len() + close + CLOSE.len()]);
        }
        calls.push(call);
        rest = &after[close + CLOSE.len()..];
    }
    content.push_str(rest);
    if calls.iter().any(ParsedCall::is_well_formed) {
        content.truncate(content.trim_end().len());
    }
    ParsedTurn { content, calls }
}

fn parse_block(inner: &str, tools: &[Tool]) -> ParsedCall {
    match serde_json::from_str::<Value>(inner.trim()) {
        Ok(value) => call_from_json(value, inner, tools, "arguments"),
        Err(e) => malformed(inner, format!("invalid JSON: {e}")),
    }
}

/// A block that is not JSON, or not a call at all.
pub(crate) fn malformed(raw: &str, reason: String) -> ParsedCall {
    ParsedCall { name: String::new(), arguments: Value::Null, raw: raw.to_string(), error: Some(CallError::Format(reason)) }
}

/// One call from its JSON `{"name": …, "<arguments>": {…}}` (the arguments under the key
/// `arguments`, which a format may name otherwise: Llama 3's `parameters`), checked against `tools`.
pub(crate) fn call_from_json(value: Value, raw: &str, tools: &[Tool], arguments_key: &str) -> ParsedCall {
    let inner = raw;
    let call = |name: String, arguments: Value, error: Option<CallError>| ParsedCall { name, arguments, raw: inner.to_string(), error };
    let format = |name: String, arguments: Value, reason: String| call(name, arguments, Some(CallError::Format(reason)));
    let mut obj = match value {
        Value::Object(obj) => obj,
        other => {
            let reason = format!("expected a JSON object {{\"name\": …, \"{arguments_key}\": {{…}}}}, got {}", describe(&other));
            return format(String::new(), Value::Null, reason);
        }
    };
    let arguments = obj.remove(arguments_key).or_else(|| obj.remove("arguments"));
    let name = match obj.remove("name") {
        Some(Value::String(s)) if !s.is_empty() => s,
        None => return format(String::new(), arguments.unwrap_or(Value::Null), "missing \"name\"".into()),
        Some(other) => {
            let reason = format!("\"name\" must be a non-empty string, got {}", describe(&other));
            return format(String::new(), arguments.unwrap_or(Value::Null), reason);
        }
    };
    let arguments = match arguments {
        Some(a @ Value::Object(_)) => a,
        None => return format(name, Value::Null, format!("missing \"{arguments_key}\"")),
        Some(other) => {
            let reason = format!("\"{arguments_key}\" must be a JSON object, got {}", describe(&other));
            return format(name, other, reason);
        }
    };
    let error = match tools.iter().find(|t| t.name() == name) {
        None => Some(CallError::UnknownTool {
            name: name.clone(),
            available: tools.iter().map(Tool::name).collect::<Vec<_>>().join(", "),
        }),
        Some(tool) => tool.spec.check_arguments(&arguments).err(),
    };
    call(name, arguments, error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::calculator;
    use serde_json::json;

    fn parse(text: &str) -> ParsedTurn {
        parse_turn(text, &[calculator::tool()])
    }

    fn block(json: &str) -> String {
        format!("<tool_call>\n{json}\n</tool_call>")
    }

    fn err(text: &str) -> String {
        parse(text).calls[0].error.as_ref().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn text_without_blocks_is_all_content() {
        let t = parse("408\n");
        assert_eq!(t.content, "408\n");
        assert!(t.calls.is_empty());
        assert_eq!(t.message(), Message::assistant("408\n"));
    }

    #[test]
    fn parallel_blocks_keep_order_and_message_lists_them() {
        let a = r#"{"name": "calculator", "arguments": {"operation": "add", "a": 1, "b": 2}}"#;
        let b = r#"{"name": "calculator", "arguments": {"operation": "power", "a": 2, "b": 3}}"#;
        let t = parse(&format!("{}\n{}", block(a), block(b)));
        assert_eq!(t.content, "");
        assert_eq!(t.calls.len(), 2);
        assert_eq!(t.calls[1].arguments, json!({"operation": "power", "a": 2, "b": 3}));
        let m = t.message();
        assert_eq!(m.tool_calls.as_ref().map(Vec::len), Some(2));
        assert_eq!(m.tool_calls.unwrap()[0].function.arguments, json!({"operation": "add", "a": 1, "b": 2}));
    }

    #[test]
    fn each_kind_of_malformed_block_names_its_reason() {
        assert!(err(&block("{\"name\": \"calculator\", ")).starts_with("malformed tool call: invalid JSON: EOF while parsing"));
        assert_eq!(err(&block("[1, 2]")), "malformed tool call: expected a JSON object {\"name\": …, \"arguments\": {…}}, got an array");
        assert_eq!(err(&block("{\"arguments\": {}}")), "malformed tool call: missing \"name\"");
        assert_eq!(err(&block("{\"name\": 3, \"arguments\": {}}")), "malformed tool call: \"name\" must be a non-empty string, got an integer (3)");
        assert_eq!(err(&block("{\"name\": \"calculator\"}")), "malformed tool call: missing \"arguments\"");
        assert_eq!(
            err(&block("{\"name\": \"calculator\", \"arguments\": \"{\\\"a\\\": 1}\"}")),
            "malformed tool call: \"arguments\" must be a JSON object, got a string (\"{\\\"a\\\": 1}\")"
        );
        assert_eq!(err("ok <tool_call>\n{\"name\": \"calculator\""), "malformed tool call: unclosed <tool_call> block: no </tool_call> follows it");
    }

    #[test]
    fn unknown_tools_and_schema_violations_are_well_formed_but_not_runnable() {
        let e = err(&block(r#"{"name": "search", "arguments": {"q": "x"}}"#));
        assert_eq!(e, "unknown tool \"search\" (available: calculator)");
        let e = err(&block(r#"{"name": "calculator", "arguments": {"operation": "add", "a": 1}}"#));
        assert_eq!(e, "invalid arguments for \"calculator\": missing required argument \"b\"");
        let e = err(&block(r#"{"name": "calculator", "arguments": {"operation": "add", "a": "1", "b": 2}}"#));
        assert_eq!(e, "invalid arguments for \"calculator\": argument \"a\": expected number, got a string (\"1\")");
        let e = err(&block(r#"{"name": "calculator", "arguments": {"operation": "mod", "a": 1, "b": 2}}"#));
        assert!(e.contains("argument \"operation\": expected one of [\"add\", \"subtract\", \"multiply\", \"divide\", \"power\"], got a string (\"mod\")"), "{e}");
        let t = parse(&block(r#"{"name": "search", "arguments": {"q": "x"}}"#));
        assert!(t.format_errors().is_empty());
        assert_eq!(t.message().tool_calls.unwrap()[0].function.name, "search");
    }

    #[test]
    fn malformed_blocks_stay_in_the_content_and_in_format_errors() {
        let good = block(r#"{"name": "calculator", "arguments": {"operation": "add", "a": 1, "b": 2}}"#);
        let bad = block("{oops}");
        let t = parse(&format!("Sure.\n{bad}\n{good}\nDone."));
        assert_eq!(t.content, format!("Sure.\n{bad}\n\nDone."));
        assert_eq!(t.format_errors().len(), 1);
        assert_eq!(t.message().tool_calls.unwrap().len(), 1);
        assert_eq!(t.calls.len(), 2);
    }

    #[test]
    fn stray_closing_tags_and_text_after_calls_are_content() {
        let good = block(r#"{"name": "calculator", "arguments": {"operation": "add", "a": 1, "b": 2}}"#);
        let t = parse(&format!("a </tool_call> b\n{good}"));
        assert_eq!(t.content, "a </tool_call> b");
        assert!(t.calls[0].error.is_none());
    }
}
