//! Chat messages in the OpenAI format, checked, and a warm-up's conversations.
//!
//! A message is `{"role", "content"}`; an assistant message may carry
//! `tool_calls` (`[{"id", "type": "function", "function": {"name",
//! "arguments"}}]`, the arguments a JSON object or a string holding one), and
//! each call's result is a `tool` message after it (`tool_call_id` names the
//! call; `name` may be left out). `content` may be a string, `null` (an
//! assistant message that only calls tools) or a list of text parts
//! (`[{"type": "text", "text": …}]`). A system message may only come first.
//! The result is [`Message`]s, the shape the chat templates render; a tool
//! message gets the name of the call it answers.
//!
//! A warm-up file (`[sft] file = "sft.jsonl"`) is TRL's SFT format: one
//! conversation a line, `{"messages": [...]}` (or TRL's conversational
//! `{"prompt": [...], "completion": [...]}`), with an optional `tools` list of
//! function schemas:
//!
//! ```
//! use rlmesh_core::dataset::conversation::parse_sft_jsonl;
//! let line = r#"{"messages": [{"role": "user", "content": "17 * 24?"},
//!   {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
//!     "function": {"name": "calculator", "arguments": "{\"operation\": \"multiply\", \"a\": 17, \"b\": 24}"}}]},
//!   {"role": "tool", "tool_call_id": "c1", "content": "408"},
//!   {"role": "assistant", "content": "408"}]}"#;
//! let c = &parse_sft_jsonl(&line.replace('\n', ""), "sft.jsonl").unwrap()[0];
//! assert_eq!(c.id, "sft.jsonl:1");
//! assert_eq!(c.messages[1].tool_calls.as_ref().unwrap()[0].function.arguments["b"], 24);
//! assert_eq!(c.messages[2].name.as_deref(), Some("calculator"));
//! ```
use super::rows::{describe, read_jsonl, read_rows, MAX_LINE_BYTES};
use super::{file_name, misspelling_of, DatasetError, Ids, Location};
use crate::chat::{Message, ToolCallMsg};
use serde_json::{Map, Value};
use std::path::Path;

/// One warm-up conversation, from one row of an SFT file.
#[derive(Clone, Debug, PartialEq)]
pub struct Conversation {
    /// The row's `id`, else `<file name>:<line>`.
    pub id: String,
    /// The messages, checked (at least one is the assistant's).
    pub messages: Vec<Message>,
    /// The row's `tools` (function schemas, as given; empty when absent).
    pub tools: Vec<Value>,
}

const ROLES: &[&str] = &["system", "user", "assistant", "tool"];
const MESSAGE_KEYS: &[&str] = &["role", "content", "tool_calls", "tool_call_id", "name"];
const SFT_KEYS: &[&str] = &["id", "messages", "prompt", "completion", "tools"];

/// Parses a list of OpenAI-format messages. `at` names the value in errors
/// (`field "messages"`); each error says which message and key.
pub fn parse_messages(v: &Value, at: &str) -> Result<Vec<Message>, String> {
    let list = v.as_array().ok_or_else(|| format!("{at}: expected a list of messages, got {}", describe(v)))?;
    if list.is_empty() {
        return Err(format!("{at}: expected at least one message, got an empty list"));
    }
    let mut out: Vec<Message> = Vec::with_capacity(list.len());
    // The calls the latest assistant message made (id, name), and how many tool messages answered them so far.
    let mut open_calls: Vec<(Option<String>, String)> = Vec::new();
    let mut answered = 0;
    for (i, m) in list.iter().enumerate() {
        let here = format!("{at}[{i}]");
        let obj = m.as_object().ok_or_else(|| format!("{here}: expected a message object, got {}", describe(m)))?;
        for key in obj.keys() {
            if let Some(k) = misspelling_of(key, MESSAGE_KEYS) {
                return Err(format!("{here}: unknown key \"{key}\"; did you mean \"{k}\"?"));
            }
        }
        let role = match obj.get("role") {
            Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.as_str(),
            Some(Value::String(r)) => return Err(format!("{here}.role: expected one of {}, got \"{r}\"", ROLES.join(", "))),
            Some(other) => return Err(format!("{here}.role: expected a string, got {}", describe(other))),
            None => return Err(format!("{here}: missing \"role\"")),
        };
        let content = content_text(obj.get("content")).map_err(|e| format!("{here}.content: {e}"))?;
        if role == "system" && i > 0 {
            return Err(format!("{here}: a system message may only come first"));
        }
        if role != "assistant" && obj.get("tool_calls").is_some_and(|c| !c.is_null()) {
            return Err(format!("{here}.tool_calls: only an assistant message may call tools"));
        }
        let mut message = Message { role: role.to_string(), content: content.clone().unwrap_or_default(), tool_calls: None, name: None };
        match role {
            "assistant" => {
                let calls = match obj.get("tool_calls") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(v) => parse_tool_calls(v, &format!("{here}.tool_calls"))?,
                };
                if content.is_none() && calls.is_empty() {
                    return Err(format!("{here}: an assistant message needs \"content\" or \"tool_calls\""));
                }
                open_calls = calls.iter().map(|(id, c)| (id.clone(), c.function.name.clone())).collect();
                answered = 0;
                if !calls.is_empty() {
                    message.tool_calls = Some(calls.into_iter().map(|(_, c)| c).collect());
                }
            }
            "tool" => {
                if content.is_none() {
                    return Err(format!("{here}: missing \"content\" (the tool's result)"));
                }
                if answered >= open_calls.len() {
                    return Err(format!("{here}: a tool message must answer a call of the assistant message before it ({} call(s), all answered)", open_calls.len()));
                }
                message.name = Some(tool_name(obj, &open_calls, answered, &here)?);
                answered += 1;
            }
            _ => {
                if content.is_none() {
                    return Err(format!("{here}: missing \"content\""));
                }
                open_calls.clear();
            }
        }
        out.push(message);
    }
    Ok(out)
}

/// A message's text: a string, `null`/absent (`None`), or a list of text parts joined.
fn content_text(v: Option<&Value>) -> Result<Option<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text") | None, Some(t)) => text.push_str(t),
                    _ => return Err(format!("[{j}]: expected a text part {{\"type\": \"text\", \"text\": …}}, got {}", describe(p))),
                }
            }
            Ok(Some(text))
        }
        Some(other) => Err(format!("expected a string, null or a list of text parts, got {}", describe(other))),
    }
}

/// An assistant message's `tool_calls`: each with its `id` (if given).
fn parse_tool_calls(v: &Value, at: &str) -> Result<Vec<(Option<String>, ToolCallMsg)>, String> {
    let list = v.as_array().ok_or_else(|| format!("{at}: expected a list of calls, got {}", describe(v)))?;
    let mut calls = Vec::with_capacity(list.len());
    for (j, c) in list.iter().enumerate() {
        let here = format!("{at}[{j}]");
        let shape = "{\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}";
        let obj = c.as_object().ok_or_else(|| format!("{here}: expected a call {shape}, got {}", describe(c)))?;
        match obj.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) if t == "function" => {}
            Some(t) => return Err(format!("{here}.type: expected \"function\", got {}", describe(t))),
        }
        let id = match obj.get("id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => return Err(format!("{here}.id: expected a string, got {}", describe(other))),
        };
        let f = match obj.get("function") {
            Some(Value::Object(f)) => f,
            Some(other) => return Err(format!("{here}.function: expected an object {{\"name\", \"arguments\"}}, got {}", describe(other))),
            None => return Err(format!("{here}: missing \"function\" (a call is {shape})")),
        };
        let name = match f.get("name") {
            Some(Value::String(n)) if !n.trim().is_empty() => n.clone(),
            Some(Value::String(_)) => return Err(format!("{here}.function.name: must not be empty")),
            Some(other) => return Err(format!("{here}.function.name: expected a string, got {}", describe(other))),
            None => return Err(format!("{here}.function: missing \"name\"")),
        };
        let arguments = match f.get("arguments") {
            Some(Value::Object(a)) => Value::Object(a.clone()),
            Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(a)) => Value::Object(a),
                Ok(other) => return Err(format!("{here}.function.arguments: the string holds {}, not a JSON object", describe(&other))),
                Err(e) => return Err(format!("{here}.function.arguments: the string is not JSON ({e})")),
            },
            Some(other) => {
                return Err(format!("{here}.function.arguments: expected a JSON object or a string holding one, got {}", describe(other)))
            }
            None => return Err(format!("{here}.function: missing \"arguments\"")),
        };
        calls.push((id, ToolCallMsg::new(name, arguments)));
    }
    Ok(calls)
}

/// The tool a `tool` message answers: its `name`, else the call its
/// `tool_call_id` names, else the next unanswered call.
fn tool_name(obj: &Map<String, Value>, calls: &[(Option<String>, String)], next: usize, here: &str) -> Result<String, String> {
    let by_id = match obj.get("tool_call_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => match calls.iter().find(|(cid, _)| cid.as_deref() == Some(id)) {
            Some((_, name)) => Some(name.clone()),
            None if calls.iter().all(|(cid, _)| cid.is_none()) => None,
            None => return Err(format!("{here}.tool_call_id: \"{id}\" names no call of the assistant message before it")),
        },
        Some(other) => return Err(format!("{here}.tool_call_id: expected a string, got {}", describe(other))),
    };
    match obj.get("name") {
        None | Some(Value::Null) => Ok(by_id.unwrap_or_else(|| calls[next].1.clone())),
        Some(Value::String(n)) => Ok(n.clone()),
        Some(other) => Err(format!("{here}.name: expected a string, got {}", describe(other))),
    }
}

/// One SFT row as a conversation (`id` is used when the row has none).
fn sft_row(obj: Map<String, Value>, id: String, noun: &str) -> Result<Conversation, String> {
    for key in obj.keys() {
        if let Some(k) = misspelling_of(key, SFT_KEYS) {
            return Err(format!("unknown {noun} \"{key}\"; did you mean \"{k}\"? (other unknown {noun}s are ignored)"));
        }
    }
    let messages = match (obj.get("messages"), obj.get("prompt"), obj.get("completion")) {
        (Some(m), _, _) => parse_messages(m, &format!("{noun} \"messages\""))?,
        (None, Some(p), Some(c)) => {
            let mut all = p.as_array().cloned().ok_or_else(|| format!("{noun} \"prompt\": expected a list of messages, got {}", describe(p)))?;
            all.extend(c.as_array().cloned().ok_or_else(|| format!("{noun} \"completion\": expected a list of messages, got {}", describe(c)))?);
            parse_messages(&Value::Array(all), &format!("{noun}s \"prompt\" + \"completion\""))?
        }
        _ => return Err(format!("missing {noun} \"messages\" (or \"prompt\" and \"completion\")")),
    };
    if !messages.iter().any(|m| m.role == "assistant") {
        return Err(format!("{noun} \"messages\": no assistant message, so nothing to learn"));
    }
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(t)) => {
            if let Some((i, bad)) = t.iter().enumerate().find(|(_, x)| !x.is_object()) {
                return Err(format!("{noun} \"tools\"[{i}]: expected a function schema object, got {}", describe(bad)));
            }
            t.clone()
        }
        Some(other) => return Err(format!("{noun} \"tools\": expected a list of function schemas, got {}", describe(other))),
    };
    let id = match obj.get("id") {
        None | Some(Value::Null) => id,
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => return Err(format!("{noun} \"id\": expected a non-empty string, got {}", describe(other))),
    };
    Ok(Conversation { id, messages, tools })
}

/// The conversations of the rows `read` yields, with unique ids.
fn conversations(
    file: &str,
    read: impl FnOnce(&mut dyn FnMut(Location, Map<String, Value>) -> Result<(), String>) -> Result<usize, DatasetError>,
) -> Result<Vec<Conversation>, DatasetError> {
    let short = file_name(file);
    let mut ids = Ids::default();
    let mut out = Vec::new();
    read(&mut |at, obj| {
        let c = sft_row(obj, format!("{short}:{}", at.number()), at.noun())?;
        ids.claim(&c.id, at)?;
        out.push(c);
        Ok(())
    })?;
    Ok(out)
}

/// Reads a warm-up file (JSONL, or Parquet by extension) of conversations.
pub fn load_sft_file(path: &Path) -> Result<Vec<Conversation>, DatasetError> {
    conversations(&path.display().to_string(), |each| read_rows(path, MAX_LINE_BYTES, each))
}

/// Parses SFT JSONL text (`file` names it in errors and ids).
pub fn parse_sft_jsonl(text: &str, file: &str) -> Result<Vec<Conversation>, DatasetError> {
    conversations(file, |each| read_jsonl(text.as_bytes(), file, MAX_LINE_BYTES, each))
}
