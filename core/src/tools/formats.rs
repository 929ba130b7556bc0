//! Tool-call formats: how a model family writes calls in its turn, and the
//! parser for each (`[model] tool_format` in a recipe).
//!
//! - `hermes` (Qwen2.5, Hermes, SmolLM2 with a ChatML tool template):
//!   `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` blocks anywhere
//!   in the turn ([`super::parse`]).
//! - `llama3_json` (Llama 3.1–3.3): the turn *is* the call,
//!   `{"name": …, "parameters": {…}}` (also `"arguments"`), optionally after
//!   `<|python_tag|>`; several calls are separated by `;`.
//! - `mistral`: text, then `[TOOL_CALLS]` and a JSON array of
//!   `{"name": …, "arguments": {…}}` objects (or one object); the newer
//!   `[TOOL_CALLS]name[ARGS]{…}` form is read too.
//!
//! Every parser has the same contract: malformed output is data, never a panic;
//! each call becomes a [`ParsedCall`] with the reason it cannot run, if any.
//!
//! ```
//! use rlmesh_core::tools::{calculator, formats::ToolFormat};
//! let turn = ToolFormat::Llama3Json.parse(r#"{"name": "calculator", "parameters": {"operation": "add", "a": 1, "b": 2}}"#, &[calculator::tool()]);
//! assert_eq!(turn.calls[0].name, "calculator");
//! assert!(turn.calls[0].error.is_none());
//! ```
use super::parse::{call_from_json, malformed, parse_turn, ParsedCall, ParsedTurn};
use super::tool::Tool;
use serde_json::Value;

/// A model family's way of writing tool calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFormat {
    /// `<tool_call>{…}</tool_call>` blocks.
    #[default]
    Hermes,
    /// The whole turn is `{"name": …, "parameters": {…}}` (`;`-separated for several).
    Llama3Json,
    /// `[TOOL_CALLS]` then a JSON array of calls.
    Mistral,
}

/// Llama 3's code-interpreter tag, which may open a call turn.
const PYTHON_TAG: &str = "<|python_tag|>";
/// Mistral's marker before the calls.
const TOOL_CALLS: &str = "[TOOL_CALLS]";
/// Mistral's (v11+) marker between a call's name and its arguments.
const ARGS: &str = "[ARGS]";

impl ToolFormat {
    /// The formats, by the names a recipe spells.
    pub const ALL: [ToolFormat; 3] = [ToolFormat::Hermes, ToolFormat::Llama3Json, ToolFormat::Mistral];

    /// The name a recipe spells.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3Json => "llama3_json",
            ToolFormat::Mistral => "mistral",
        }
    }

    /// Splits an assistant turn (without its end-of-turn token) into content and
    /// calls, checking each call against `tools`.
    pub fn parse(self, text: &str, tools: &[Tool]) -> ParsedTurn {
        match self {
            ToolFormat::Hermes => parse_turn(text, tools),
            ToolFormat::Llama3Json => parse_llama3(text, tools),
            ToolFormat::Mistral => parse_mistral(text, tools),
        }
    }
}

/// Reads consecutive JSON values from `text`, separated by whitespace and `sep`
/// characters: each value with its raw text, and the error (with the rest) where
/// reading stops early.
fn json_values(text: &str, sep: char) -> (Vec<(Value, &str)>, Option<(String, &str)>) {
    let mut out = vec![];
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == sep);
        if rest.is_empty() {
            return (out, None);
        }
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v)) => {
                let end = stream.byte_offset();
                out.push((v, &rest[..end]));
                rest = &rest[end..];
            }
            Some(Err(e)) => return (out, Some((format!("invalid JSON: {e}"), rest))),
            None => return (out, None),
        }
    }
}

fn parse_llama3(text: &str, tools: &[Tool]) -> ParsedTurn {
    let (content, body) = match text.find(PYTHON_TAG) {
        Some(at) => (text[..at].trim_end().to_string(), &text[at + PYTHON_TAG.len()..]),
        // Without the tag a turn is a call only when it is JSON from its first character:
        // `{"` (a reply that merely starts with a brace stays a reply).
        None if text.trim_start().starts_with("{\"") => (String::new(), text),
        None => return ParsedTurn { content: text.to_string(), calls: vec![] },
    };
    let (values, error) = json_values(body, ';');
    let mut calls: Vec<ParsedCall> = values.into_iter().map(|(v, raw)| call_from_json(v, raw, tools, "parameters")).collect();
    if let Some((reason, rest)) = error {
        calls.push(malformed(rest, reason));
    }
    turn(text, content, calls)
}

fn parse_mistral(text: &str, tools: &[Tool]) -> ParsedTurn {
    let Some(at) = text.find(TOOL_CALLS) else { return ParsedTurn { content: text.to_string(), calls: vec![] } };
    let content = text[..at].trim_end().to_string();
    let body = &text[at + TOOL_CALLS.len()..];
    let mut calls = vec![];
    if body.trim_start().starts_with(['[', '{']) {
        let (values, error) = json_values(body, ',');
        for (v, raw) in values {
            match v {
                Value::Array(items) => calls.extend(items.into_iter().map(|item| call_from_json(item, raw, tools, "arguments"))),
                other => calls.push(call_from_json(other, raw, tools, "arguments")),
            }
        }
        if let Some((reason, rest)) = error {
            calls.push(malformed(rest, reason));
        }
    } else {
        // `name[ARGS]{…}`, repeated after further [TOOL_CALLS] markers.
        for piece in body.split(TOOL_CALLS) {
            let Some((name, args)) = piece.split_once(ARGS) else {
                calls.push(malformed(piece, format!("expected a JSON array of calls or name{ARGS}{{…}} after {TOOL_CALLS}")));
                continue;
            };
            let name = name.split("[CALL_ID]").next().unwrap_or("").trim();
            match serde_json::from_str::<Value>(args.trim()) {
                Ok(arguments) => calls.push(call_from_json(serde_json::json!({"name": name, "arguments": arguments}), piece, tools, "arguments")),
                Err(e) => calls.push(malformed(piece, format!("invalid JSON: {e}"))),
            }
        }
    }
    turn(text, content, calls)
}

/// The turn: `content` before the calls when one is well formed, else the whole text.
fn turn(text: &str, content: String, calls: Vec<ParsedCall>) -> ParsedTurn {
    let content = if calls.iter().any(ParsedCall::is_well_formed) { content } else { text.to_string() };
    ParsedTurn { content, calls }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::calculator;
    use serde_json::json;

    fn tools() -> Vec<Tool> {
        vec![calculator::tool()]
    }

    const ADD: &str = r#"{"operation": "add", "a": 1, "b": 2}"#;

    #[test]
    fn llama3_calls_with_parameters_or_arguments_after_the_tag_or_alone() {
        for text in [
            format!(r#"{{"name": "calculator", "parameters": {ADD}}}"#),
            format!(r#"<|python_tag|>{{"name": "calculator", "arguments": {ADD}}}"#),
        ] {
            let t = ToolFormat::Llama3Json.parse(&text, &tools());
            assert_eq!(t.calls.len(), 1, "{text}");
            assert!(t.calls[0].error.is_none(), "{:?}", t.calls[0].error);
            assert_eq!(t.calls[0].arguments, json!({"operation": "add", "a": 1, "b": 2}));
            assert_eq!(t.content, "");
        }
        let two = format!(r#"{{"name": "calculator", "parameters": {ADD}}}; {{"name": "calculator", "parameters": {ADD}}}"#);
        assert_eq!(ToolFormat::Llama3Json.parse(&two, &tools()).calls.len(), 2);
        let plain = ToolFormat::Llama3Json.parse("The answer is 3. {not json}", &tools());
        assert!(plain.calls.is_empty());
        assert_eq!(plain.content, "The answer is 3. {not json}");
        let bad = ToolFormat::Llama3Json.parse(r#"{"name": "calculator", "parameters": {"a": "#, &tools());
        assert_eq!(bad.format_errors().len(), 1);
        assert!(bad.format_errors()[0].contains("invalid JSON"), "{:?}", bad.format_errors());
        let missing = ToolFormat::Llama3Json.parse(r#"{"name": "calculator"}"#, &tools());
        assert_eq!(missing.format_errors(), vec!["malformed tool call: missing \"parameters\"".to_string()]);
    }

    #[test]
    fn mistral_calls_as_an_array_an_object_or_name_args() {
        let text = format!(r#"Let me add. [TOOL_CALLS] [{{"name": "calculator", "arguments": {ADD}, "id": "a1b2c3d4e"}}, {{"name": "calculator", "arguments": {ADD}}}]"#);
        let t = ToolFormat::Mistral.parse(&text, &tools());
        assert_eq!(t.content, "Let me add.");
        assert_eq!(t.calls.len(), 2);
        assert!(t.calls.iter().all(|c| c.error.is_none()), "{:?}", t.calls);
        let t = ToolFormat::Mistral.parse(&format!("[TOOL_CALLS]calculator[ARGS]{ADD}[TOOL_CALLS]calculator[ARGS]{ADD}"), &tools());
        assert_eq!(t.calls.len(), 2);
        assert!(t.calls.iter().all(|c| c.error.is_none()), "{:?}", t.calls);
        let t = ToolFormat::Mistral.parse("[TOOL_CALLS] [{\"name\": \"calculator\", \"arguments\": ", &tools());
        assert_eq!(t.format_errors().len(), 1);
        assert_eq!(ToolFormat::Mistral.parse("no calls", &tools()).content, "no calls");
        let t = ToolFormat::Mistral.parse("[TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {}}]", &tools());
        assert!(t.format_errors().is_empty() && t.calls[0].error.is_some(), "an unknown tool is well formed but cannot run");
    }

    /// Any text at all: every parser returns, and every call is either runnable or carries its reason.
    #[test]
    fn no_input_makes_a_parser_panic() {
        let pieces = ["{", "}", "[", "]", "\"name\"", ":", ";", ",", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "calculator", ADD, "\u{fffd}", "{\"name\": \"calculator\", \"parameters\": "];
        let mut s: u64 = 7;
        for _ in 0..3000 {
            let mut text = String::new();
            for _ in 0..(s % 7) {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                text.push_str(pieces[(s >> 33) as usize % pieces.len()]);
            }
            s = s.wrapping_add(1);
            for f in ToolFormat::ALL {
                let t = f.parse(&text, &tools());
                for c in &t.calls {
                    assert!(c.error.is_some() || (!c.name.is_empty() && c.arguments.is_object()), "{f:?} on {text:?}: {c:?}");
                }
            }
        }
    }
}
