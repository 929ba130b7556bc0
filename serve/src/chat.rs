//! Chat requests to token prompts, and sampled tokens back to OpenAI's choices.
//!
//! OpenAI's messages become transformers' messages for the chat template:
//! content parts are joined into text, `developer` is `system`, an assistant's
//! `tool_calls[].function.arguments` (a JSON string on the wire) become objects
//! (as vLLM does before rendering), and a `tool` message gets the `name` of the
//! call it answers. The completion's text is split into content and tool calls
//! by the model's [`ToolFormat`].
use crate::error::ApiError;
use crate::wire::Sampling;
use rlmesh_core::tools::formats::ToolFormat;
use rlmesh_model::{Completion, FinishReason, SamplingParams, Tokenizer};
use serde_json::{json, Map, Value};

/// Most completions one request may ask for.
pub const MAX_N: u64 = 64;
/// `max_tokens` when a request sets none: the rest of the context, at most this
/// (the engine preallocates its KV cache for the longest completion a batch may reach).
pub const DEFAULT_MAX_TOKENS: usize = 2048;
/// Most `top_logprobs` (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// The text of a message's `content`: a string, null, or a list of text parts.
pub fn content_text(content: Option<&Value>, at: usize) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => return Err(ApiError::bad_request(format!("messages[{at}].content: only text parts are supported, got {part}"), Some("messages"))),
                }
            }
            Ok(text)
        }
        Some(other) => Err(ApiError::bad_request(format!("messages[{at}].content must be a string or a list of parts, got {other}"), Some("messages"))),
    }
}

/// OpenAI's messages as the chat template reads them (transformers' format).
pub fn template_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages must hold at least one message", Some("messages")));
    }
    let mut call_names: Map<String, Value> = Map::new();
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let Some(obj) = m.as_object() else { return Err(ApiError::bad_request(format!("messages[{i}] must be an object"), Some("messages"))) };
        let role = match obj.get("role").and_then(Value::as_str) {
            Some("developer") | Some("system") => "system",
            Some(r @ ("user" | "assistant" | "tool")) => r,
            Some(r) => return Err(ApiError::bad_request(format!("messages[{i}].role: unknown role {r:?} (system, developer, user, assistant, tool)"), Some("messages"))),
            None => return Err(ApiError::bad_request(format!("messages[{i}] has no role"), Some("messages"))),
        };
        let mut msg = Map::new();
        msg.insert("role".into(), role.into());
        msg.insert("content".into(), content_text(obj.get("content"), i)?.into());
        if let Some(name) = obj.get("name").filter(|v| v.is_string()) {
            msg.insert("name".into(), name.clone());
        }
        match role {
            "assistant" => {
                if let Some(calls) = obj.get("tool_calls").filter(|v| !v.is_null()) {
                    let calls = calls.as_array().ok_or_else(|| ApiError::bad_request(format!("messages[{i}].tool_calls must be a list"), Some("messages")))?;
                    let mut rendered = vec![];
                    for (j, c) in calls.iter().enumerate() {
                        let (name, arguments) = call_parts(c).map_err(|why| ApiError::bad_request(format!("messages[{i}].tool_calls[{j}]: {why}"), Some("messages")))?;
                        if let Some(id) = c.get("id").and_then(Value::as_str) {
                            call_names.insert(id.to_string(), name.clone().into());
                        }
                        let mut call = json!({"type": "function", "function": {"name": name, "arguments": arguments}});
                        if let Some(id) = c.get("id") {
                            call["id"] = id.clone();
                        }
                        rendered.push(call);
                    }
                    if !rendered.is_empty() {
                        msg.insert("tool_calls".into(), Value::Array(rendered));
                    }
                }
            }
            "tool" => {
                if let Some(id) = obj.get("tool_call_id").and_then(Value::as_str) {
                    msg.insert("tool_call_id".into(), id.into());
                    if let (false, Some(name)) = (msg.contains_key("name"), call_names.get(id)) {
                        msg.insert("name".into(), name.clone());
                    }
                }
            }
            _ => {}
        }
        out.push(Value::Object(msg));
    }
    Ok(out)
}

/// A wire tool call's name and arguments (parsed from their JSON string).
fn call_parts(call: &Value) -> Result<(String, Value), String> {
    let f = call.get("function").ok_or("no `function`")?;
    let name = f.get("name").and_then(Value::as_str).ok_or("no `function.name`")?;
    let arguments = match f.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(s)) if s.trim().is_empty() => json!({}),
        Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| format!("`function.arguments` is not JSON: {e}"))?,
        Some(v @ Value::Object(_)) => v.clone(),
        Some(other) => return Err(format!("`function.arguments` must be a JSON string, got {other}")),
    };
    Ok((name.to_string(), arguments))
}

/// The tool schemas the template renders: none with `tool_choice: "none"`.
pub fn template_tools(tools: Option<&[Value]>, tool_choice: Option<&Value>) -> Result<Option<Vec<Value>>, ApiError> {
    let choice = match tool_choice {
        None | Some(Value::Null) => "auto",
        Some(Value::String(s)) if s == "auto" || s == "none" => s.as_str(),
        Some(other) => return Err(ApiError::bad_request(format!("tool_choice {other} is not supported: use \"auto\" or \"none\""), Some("tool_choice"))),
    };
    let Some(tools) = tools.filter(|t| !t.is_empty()) else { return Ok(None) };
    for (i, t) in tools.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") || t.pointer("/function/name").and_then(Value::as_str).is_none() {
            return Err(ApiError::bad_request(format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"), Some("tools")));
        }
    }
    Ok((choice == "auto").then(|| tools.to_vec()))
}

/// Sampling parameters for a request whose prompt has `prompt_len` tokens:
/// (params, n, seeded). Checks ranges and that prompt and completion fit the context.
pub fn sampling_params(s: &Sampling, prompt_len: usize, context: usize, stop_ids: &[u32]) -> Result<(SamplingParams, usize, bool), ApiError> {
    let temperature = s.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad_request(format!("temperature must be in [0, 2], got {temperature}"), Some("temperature")));
    }
    let top_p = s.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request(format!("top_p must be in (0, 1], got {top_p}"), Some("top_p")));
    }
    let n = s.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::bad_request(format!("n must be in [1, {MAX_N}], got {n}"), Some("n")));
    }
    if prompt_len == 0 {
        return Err(ApiError::bad_request("the prompt is empty", Some("prompt")));
    }
    if prompt_len >= context {
        return Err(ApiError::context_overflow(prompt_len, 1, context));
    }
    let max_new = match s.max_completion_tokens.or(s.max_tokens) {
        Some(0) => return Err(ApiError::bad_request("max_tokens must be at least 1", Some("max_tokens"))),
        Some(m) => usize::try_from(m).unwrap_or(usize::MAX),
        None => (context - prompt_len).min(DEFAULT_MAX_TOKENS),
    };
    if prompt_len.saturating_add(max_new) > context {
        return Err(ApiError::context_overflow(prompt_len, max_new, context));
    }
    let stops = s.stop.strings();
    if stops.len() > 4 {
        return Err(ApiError::bad_request(format!("stop holds at most 4 strings, got {}", stops.len()), Some("stop")));
    }
    let params = SamplingParams {
        max_new_tokens: max_new,
        temperature,
        top_p,
        top_k: s.top_k.filter(|&k| k > 0).unwrap_or(0),
        seed: s.seed.map_or(0, |x| x as u64),
        stop_token_ids: stop_ids.to_vec(),
        stop_strings: stops,
    };
    Ok((params, n as usize, s.seed.is_some()))
}

/// One completion's text and OpenAI finish reason: the stop token and anything
/// from a stop string on are not part of the text.
pub fn completion_text(tok: &Tokenizer, c: &Completion, stops: &[String]) -> Result<(String, &'static str), ApiError> {
    let ids = match c.finish {
        FinishReason::StopToken => &c.tokens[..c.tokens.len().saturating_sub(1)],
        _ => &c.tokens[..],
    };
    let mut text = tok.decode(ids, true).map_err(|e| ApiError::internal(e.to_string()))?;
    if c.finish == FinishReason::StopString {
        if let Some(at) = stops.iter().filter_map(|s| text.find(s.as_str())).min() {
            text.truncate(at);
        }
    }
    Ok((text, if c.finish == FinishReason::Length { "length" } else { "stop" }))
}

/// The assistant message of a chat choice and its finish reason: with tools
/// offered, well-formed calls become `tool_calls` (finish `tool_calls`).
pub fn assistant_message(text: String, finish: &'static str, tools_offered: bool, format: ToolFormat, call_ids: &mut impl FnMut() -> String) -> (Value, &'static str) {
    if tools_offered {
        let turn = format.parse(&text, &[]);
        let calls: Vec<Value> = turn
            .calls
            .iter()
            .filter(|c| c.is_well_formed())
            .map(|c| json!({"id": call_ids(), "type": "function", "function": {"name": c.name, "arguments": c.arguments.to_string()}}))
            .collect();
        if !calls.is_empty() {
            let content = if turn.content.is_empty() { Value::Null } else { Value::String(turn.content) };
            return (json!({"role": "assistant", "content": content, "tool_calls": calls}), if finish == "length" { finish } else { "tool_calls" });
        }
    }
    (json!({"role": "assistant", "content": text, "tool_calls": []}), finish)
}

/// OpenAI's `token` and `bytes` of one token id.
pub fn token_piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let text = tok.decode(&[id], false).unwrap_or_default();
    let bytes = text.as_bytes().to_vec();
    (text, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_tool_calls_become_template_calls_and_tool_messages_get_the_call_name() {
        let wire = vec![
            json!({"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]}),
            json!({"role": "user", "content": "3 + 4?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{\"a\": 3, \"b\": 4}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "7"}),
        ];
        let m = template_messages(&wire).unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], json!({"a": 3, "b": 4}));
        assert_eq!(m[2]["content"], "");
        assert_eq!(m[3]["name"], "calculator");
        let bad = [json!({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]})];
        assert!(template_messages(&bad).unwrap_err().message.contains("not JSON"));
        assert_eq!(template_messages(&[json!({"role": "wizard", "content": ""})]).unwrap_err().status, axum::http::StatusCode::BAD_REQUEST);
    }

    #[test]
    fn sampling_fields_are_range_checked_and_the_context_bounds_the_completion() {
        let ok = Sampling { max_tokens: Some(10), ..Default::default() };
        let (p, n, seeded) = sampling_params(&ok, 5, 100, &[2]).unwrap();
        assert_eq!((p.max_new_tokens, p.temperature, n, seeded, p.stop_token_ids), (10, 1.0, 1, false, vec![2]));
        let (p, ..) = sampling_params(&Sampling::default(), 5, 100, &[2]).unwrap();
        assert_eq!(p.max_new_tokens, 95, "default: the rest of the context");
        let over = sampling_params(&Sampling { max_tokens: Some(96), ..Default::default() }, 5, 100, &[2]).unwrap_err();
        assert_eq!(over.code, Some("context_length_exceeded"));
        for bad in [Sampling { temperature: Some(-0.1), ..Default::default() }, Sampling { top_p: Some(0.0), ..Default::default() }, Sampling { n: Some(0), ..Default::default() }] {
            assert_eq!(sampling_params(&bad, 5, 100, &[2]).unwrap_err().status, axum::http::StatusCode::BAD_REQUEST);
        }
        let (_, _, seeded) = sampling_params(&Sampling { seed: Some(3), ..Default::default() }, 5, 100, &[2]).unwrap();
        assert!(seeded);
    }

    #[test]
    fn calls_in_the_model_format_become_tool_calls_and_malformed_ones_stay_text() {
        let mut ids = 0;
        let mut next = || {
            ids += 1;
            format!("call_{ids}")
        };
        let text = "Sure.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"a\": 1}}\n</tool_call>".to_string();
        let (m, finish) = assistant_message(text, "stop", true, ToolFormat::Hermes, &mut next);
        assert_eq!(finish, "tool_calls");
        assert_eq!(m["content"], "Sure.");
        assert_eq!(m["tool_calls"][0]["function"]["name"], "calculator");
        assert_eq!(serde_json::from_str::<Value>(m["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).unwrap(), json!({"a": 1}));
        let broken = "<tool_call>\n{\"name\": \n</tool_call>".to_string();
        let (m, finish) = assistant_message(broken.clone(), "stop", true, ToolFormat::Hermes, &mut next);
        assert_eq!((m["content"].as_str().unwrap(), finish), (broken.as_str(), "stop"));
        let (m, finish) = assistant_message("{\"name\": \"calculator\", \"parameters\": {}}".into(), "stop", false, ToolFormat::Llama3Json, &mut next);
        assert_eq!((m["tool_calls"].as_array().unwrap().len(), finish), (0, "stop"), "no tools offered: no calls parsed");
    }
}
