//! The view of a rollout that every reward reads: turns, `<tool_call>` blocks, results, final reply.
//!
//! Three sources give the same view:
//! - [`Transcript::from_trajectory`]: the executed steps (one block per call,
//!   as the hermes template renders them), one malformed block per format
//!   error, and the recorded final answer;
//! - [`Transcript::from_completion`]: raw text. `<tool_response>` regions are
//!   the tool results (matched to the calls in order) and separate the
//!   assistant turns; chat-template tokens (`<|im_start|>user`, `<|im_end|>`)
//!   are dropped; the final reply is the last turn's text outside any block;
//! - [`Transcript::from_messages`]: transformers-format messages. An assistant
//!   message is a turn; its calls come from `<tool_call>` blocks in its content
//!   when there are any, else from its `tool_calls` (one block each); `tool`
//!   messages are the results in order.
//!
//! A block's text must be a JSON object, or a list of objects, each with a
//! string `name` and an object `arguments`; anything else is
//! [`Block::Malformed`]. Malformed text never fails: it is data.
use crate::chat::Message;
use crate::trajectory::Trajectory;
use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const RESPONSE_OPEN: &str = "<tool_response>";
const RESPONSE_CLOSE: &str = "</tool_response>";

/// What running a call returned.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The text handed back to the model.
    pub result: String,
    /// True when the tool ran without error.
    pub success: bool,
}

/// One call as the model wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// Tool name.
    pub name: String,
    /// Arguments (a JSON object).
    pub arguments: Value,
    /// Its result, when the call was run.
    pub outcome: Option<Outcome>,
}

/// One `<tool_call>` block.
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    /// A well-shaped block: one call, or a list of calls written together.
    Calls(Vec<Call>),
    /// A block whose text is not a well-shaped call (the reason).
    Malformed(String),
}

/// One assistant turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Turn {
    /// Its `<tool_call>` blocks in order.
    pub blocks: Vec<Block>,
}

impl Turn {
    /// The well-shaped calls of this turn in order.
    pub fn calls(&self) -> impl Iterator<Item = &Call> {
        self.blocks.iter().flat_map(|b| match b {
            Block::Calls(c) => c.as_slice(),
            Block::Malformed(_) => &[],
        })
    }
}

/// A rollout as the rewards see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Transcript {
    /// Assistant turns in order.
    pub turns: Vec<Turn>,
    /// Number of `<tool_call>` opening tags.
    pub open_tags: usize,
    /// Number of `</tool_call>` closing tags.
    pub close_tags: usize,
    /// Number of tool results seen.
    pub tool_responses: usize,
    /// The text of the last assistant turn, outside any block, trimmed.
    pub final_answer: String,
}

impl Transcript {
    /// All well-shaped calls in order.
    pub fn calls(&self) -> impl Iterator<Item = &Call> {
        self.turns.iter().flat_map(Turn::calls)
    }

    /// All blocks in order.
    pub fn blocks(&self) -> impl Iterator<Item = &Block> {
        self.turns.iter().flat_map(|t| t.blocks.iter())
    }

    /// True when a call has the same name and JSON-equal arguments as an earlier one.
    pub fn has_repeated_call(&self) -> bool {
        let calls: Vec<&Call> = self.calls().collect();
        calls.iter().enumerate().any(|(i, c)| calls[..i].iter().any(|p| p.name == c.name && p.arguments == c.arguments))
    }

    /// The view of a recorded trajectory.
    pub fn from_trajectory(traj: &Trajectory) -> Transcript {
        let mut turns: Vec<(usize, Turn)> = Vec::new();
        for step in &traj.steps {
            let call = Call {
                name: step.name.clone(),
                arguments: step.arguments.clone(),
                outcome: Some(Outcome { result: step.result.clone(), success: step.success }),
            };
            match turns.last_mut() {
                Some((turn, t)) if *turn == step.turn => t.blocks.push(Block::Calls(vec![call])),
                _ => turns.push((step.turn, Turn { blocks: vec![Block::Calls(vec![call])] })),
            }
        }
        let mut turns: Vec<Turn> = turns.into_iter().map(|(_, t)| t).collect();
        if !traj.format_errors.is_empty() {
            if turns.is_empty() {
                turns.push(Turn::default());
            }
            let last = turns.last_mut().expect("a turn was just ensured");
            last.blocks.extend(traj.format_errors.iter().map(|e| Block::Malformed(e.clone())));
        }
        let n_blocks = traj.steps.len() + traj.format_errors.len();
        Transcript {
            turns,
            open_tags: n_blocks,
            close_tags: n_blocks,
            tool_responses: traj.steps.len(),
            final_answer: traj.final_answer.trim().to_string(),
        }
    }

    /// The view of a raw completion string.
    pub fn from_completion(text: &str) -> Transcript {
        let (pieces, results) = split_responses(text);
        let mut out = Transcript { tool_responses: results.len(), ..Transcript::default() };
        let mut last_text = String::new();
        for piece in pieces {
            let cleaned = strip_template(&piece);
            if cleaned.trim().is_empty() {
                continue;
            }
            let parsed = parse_blocks(&cleaned);
            out.open_tags += parsed.open_tags;
            out.close_tags += parsed.close_tags;
            last_text = parsed.outside;
            out.turns.push(Turn { blocks: parsed.blocks });
        }
        out.final_answer = last_text.trim().to_string();
        attach_results(&mut out.turns, results);
        out
    }

    /// The view of a transformers-format messages list (messages before the first assistant turn are ignored).
    pub fn from_messages(messages: &[Message]) -> Transcript {
        let mut out = Transcript::default();
        let mut results = Vec::new();
        let mut last_text = String::new();
        for m in messages {
            match m.role.as_str() {
                "assistant" => {
                    let parsed = parse_blocks(&m.content);
                    let mut turn = Turn { blocks: parsed.blocks };
                    out.open_tags += parsed.open_tags;
                    out.close_tags += parsed.close_tags;
                    if parsed.open_tags + parsed.close_tags == 0 {
                        for tc in m.tool_calls.iter().flatten() {
                            let args = match &tc.function.arguments {
                                Value::String(s) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
                                v => v.clone(),
                            };
                            let call = serde_json::json!({ "name": tc.function.name, "arguments": args });
                            turn.blocks.push(block_from_json(&call));
                            out.open_tags += 1;
                            out.close_tags += 1;
                        }
                    }
                    last_text = parsed.outside;
                    out.turns.push(turn);
                }
                "tool" if !out.turns.is_empty() => results.push(m.content.clone()),
                _ => {}
            }
        }
        out.tool_responses = results.len();
        out.final_answer = last_text.trim().to_string();
        attach_results(&mut out.turns, results);
        out
    }
}

/// Whether a tool result reports an error: a JSON object with an `error` key, or text starting with "error".
pub fn result_is_error(result: &str) -> bool {
    let t = result.trim();
    match serde_json::from_str::<Value>(t) {
        Ok(Value::Object(m)) => m.contains_key("error"),
        _ => t.to_lowercase().starts_with("error"),
    }
}

/// Hands the i-th result to the i-th well-shaped call.
fn attach_results(turns: &mut [Turn], results: Vec<String>) {
    let calls = turns.iter_mut().flat_map(|t| t.blocks.iter_mut()).flat_map(|b| match b {
        Block::Calls(c) => c.as_mut_slice(),
        Block::Malformed(_) => &mut [],
    });
    for (call, result) in calls.zip(results) {
        call.outcome = Some(Outcome { success: !result_is_error(&result), result });
    }
}

/// Splits text at `<tool_response>` regions: the text pieces between them and the region contents.
fn split_responses(text: &str) -> (Vec<String>, Vec<String>) {
    let mut pieces = Vec::new();
    let mut results = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(RESPONSE_OPEN) {
        pieces.push(rest[..i].to_string());
        let after = &rest[i + RESPONSE_OPEN.len()..];
        let end = after.find(RESPONSE_CLOSE).unwrap_or(after.len());
        results.push(after[..end].trim().to_string());
        rest = after.get(end + RESPONSE_CLOSE.len()..).unwrap_or("");
    }
    pieces.push(rest.to_string());
    (pieces, results)
}

/// Drops chat-template tokens `<|…|>`, and the role line after `<|im_start|>`.
fn strip_template(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("<|") {
        out.push_str(&rest[..i]);
        let Some(j) = rest[i..].find("|>") else {
            rest = &rest[i..];
            break;
        };
        let token = &rest[i..i + j + 2];
        rest = &rest[i + j + 2..];
        if token == "<|im_start|>" {
            let line_end = rest.find('\n').map_or(rest.len(), |k| k + 1);
            if rest[..line_end].trim().chars().all(|c| c.is_ascii_alphabetic()) {
                rest = &rest[line_end..];
            }
        }
    }
    out.push_str(rest);
    out
}

struct ParsedBlocks {
    blocks: Vec<Block>,
    open_tags: usize,
    close_tags: usize,
    outside: String,
}

/// Finds the `<tool_call>` blocks of one turn's text.
fn parse_blocks(text: &str) -> ParsedBlocks {
    let open_tags = text.matches(OPEN).count();
    let close_tags = text.matches(CLOSE).count();
    let mut blocks = Vec::new();
    let mut outside = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(OPEN) {
        outside.push_str(&rest[..i]);
        let body = &rest[i + OPEN.len()..];
        let next_open = body.find(OPEN);
        match body.find(CLOSE) {
            Some(j) if next_open.is_none_or(|k| j < k) => {
                blocks.push(block_from_text(&body[..j]));
                rest = &body[j + CLOSE.len()..];
            }
            _ => {
                let end = next_open.unwrap_or(body.len());
                blocks.push(Block::Malformed(format!("{OPEN} without {CLOSE}")));
                rest = &body[end..];
            }
        }
    }
    outside.push_str(rest);
    ParsedBlocks { blocks, open_tags, close_tags, outside: outside.replace(CLOSE, "") }
}

fn block_from_text(body: &str) -> Block {
    match serde_json::from_str::<Value>(body.trim()) {
        Ok(v) => block_from_json(&v),
        Err(e) => Block::Malformed(format!("invalid JSON: {e}")),
    }
}

/// A block from its JSON: an object, or a non-empty list of objects, each `{"name": string, "arguments": object}`.
fn block_from_json(v: &Value) -> Block {
    let items: Vec<&Value> = match v {
        Value::Array(a) if !a.is_empty() => a.iter().collect(),
        Value::Array(_) => return Block::Malformed("empty list of calls".into()),
        other => vec![other],
    };
    let mut calls = Vec::with_capacity(items.len());
    for item in items {
        let Some(obj) = item.as_object() else {
            return Block::Malformed("expected a JSON object {\"name\", \"arguments\"}".into());
        };
        let Some(name) = obj.get("name").and_then(Value::as_str) else {
            return Block::Malformed("expected a string \"name\"".into());
        };
        let Some(arguments) = obj.get("arguments").filter(|a| a.is_object()) else {
            return Block::Malformed("expected an object \"arguments\"".into());
        };
        calls.push(Call { name: name.to_string(), arguments: arguments.clone(), outcome: None });
    }
    Block::Calls(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN: &str = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17*24\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\nThe answer is 408.<|im_end|>";

    #[test]
    fn qwen_rendered_completion() {
        let t = Transcript::from_completion(QWEN);
        assert_eq!(t.turns.len(), 2);
        assert_eq!((t.open_tags, t.close_tags, t.tool_responses), (1, 1, 1));
        let calls: Vec<&Call> = t.calls().collect();
        assert_eq!(calls[0].name, "calculator");
        assert_eq!(calls[0].outcome.as_ref().map(|o| (o.result.as_str(), o.success)), Some(("408", true)));
        assert_eq!(t.final_answer, "The answer is 408.");
    }

    #[test]
    fn malformed_blocks_are_data() {
        let t = Transcript::from_completion("<tool_call>\n{not json\n</tool_call> <tool_call> {\"name\": 3} ");
        assert_eq!((t.open_tags, t.close_tags), (2, 1));
        assert!(t.blocks().all(|b| matches!(b, Block::Malformed(_))));
        assert_eq!(t.calls().count(), 0);
    }

    #[test]
    fn messages_with_tool_calls_field() {
        let mut a = Message::assistant("");
        a.tool_calls = Some(vec![crate::ToolCallMsg::new("calculator", serde_json::json!({"expression": "2+2"}))]);
        let msgs = vec![Message::user("2+2?"), a, Message::tool("calculator", "{\"error\": \"bad\"}"), Message::assistant("4")];
        let t = Transcript::from_messages(&msgs);
        assert_eq!(t.turns.len(), 2);
        assert_eq!(t.calls().next().and_then(|c| c.outcome.as_ref()).map(|o| o.success), Some(false));
        assert_eq!(t.final_answer, "4");
    }

    #[test]
    fn repeated_call_detected() {
        let block = "<tool_call>{\"name\":\"f\",\"arguments\":{\"x\":1}}</tool_call>";
        assert!(Transcript::from_completion(&format!("{block}<tool_response>1</tool_response>{block}")).has_repeated_call());
        assert!(!Transcript::from_completion(block).has_repeated_call());
    }
}
