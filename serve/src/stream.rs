//! `stream: true`: the choices as server-sent events, as OpenAI sends them —
//! a first chunk with the role, content deltas (each with its tokens'
//! log-probs and ids), tool calls, a chunk with the finish reason, the usage
//! if asked, then `data: [DONE]`.
//!
//! The engine returns a batch when it is done, so the chunks of a completion
//! are sent together once it is sampled; a client reads them as it would a
//! live stream.
use crate::complete::{chat_logprobs, text_logprobs, Sampled};
use crate::server::Shared;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use rlmesh_model::Tokenizer;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::ops::Range;

/// What a chat stream is made of.
pub(crate) struct Streamed<'a> {
    pub(crate) s: &'a Shared,
    pub(crate) id: &'a str,
    pub(crate) sampled: &'a Sampled,
    pub(crate) logprobs: bool,
    pub(crate) token_ids: bool,
    pub(crate) usage: Option<Value>,
}

/// Splits `text` (the decoding of `tokens`, possibly cut short) into deltas,
/// each with the tokens that produced it; a token that ends inside a character
/// waits for the next.
pub fn deltas(tok: &Tokenizer, tokens: &[u32], text: &str) -> Vec<(String, Range<usize>)> {
    let mut out = vec![];
    let (mut emitted, mut first) = (0usize, 0usize);
    for k in 0..tokens.len() {
        let Ok(prefix) = tok.decode(&tokens[..=k], true) else { continue };
        if prefix.ends_with('\u{fffd}') {
            continue;
        }
        let mut end = prefix.len().min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if end > emitted {
            out.push((text[emitted..end].to_string(), first..k + 1));
            (emitted, first) = (end, k + 1);
        }
    }
    if emitted < text.len() || first < tokens.len() {
        out.push((text[emitted..].to_string(), first..tokens.len()));
    }
    out
}

fn sse(chunks: Vec<Value>) -> Response {
    let events = chunks.into_iter().map(|c| Event::default().data(c.to_string())).chain(std::iter::once(Event::default().data("[DONE]")));
    Sse::new(futures_util::stream::iter(events.map(Ok::<_, Infallible>))).into_response()
}

/// The chat stream of `replies` (each choice's message and finish reason).
pub(crate) fn chat(st: &Streamed<'_>, replies: &[(Value, &'static str)]) -> Response {
    let (s, sampled) = (st.s, st.sampled);
    let chunk = |choices: Vec<Value>| json!({"id": st.id, "object": "chat.completion.chunk", "created": s.created, "model": s.config.model_name, "choices": choices});
    let mut chunks = vec![];
    for (i, (message, finish)) in replies.iter().enumerate() {
        let c = &sampled.out.completions[i];
        let mut first = chunk(vec![json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null})]);
        if st.token_ids && i == 0 {
            first["prompt_token_ids"] = json!(sampled.prompt_ids);
        }
        chunks.push(first);
        let piece = |delta: Value, range: Range<usize>| {
            let logprobs = st.logprobs.then(|| json!({"content": chat_logprobs(s, sampled, i, range.clone())}));
            let mut choice = json!({"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": null});
            if st.token_ids {
                choice["token_ids"] = json!(c.tokens[range].to_vec());
            }
            chunk(vec![choice])
        };
        match message.get("tool_calls").and_then(Value::as_array).filter(|calls| !calls.is_empty()) {
            Some(calls) => {
                // Content and calls whole: the text around the calls is not the decoding of a token range.
                if let Some(content) = message.get("content").and_then(Value::as_str) {
                    chunks.push(piece(json!({"content": content}), 0..0));
                }
                let calls: Vec<Value> = calls.iter().enumerate().map(|(j, call)| json!({"index": j, "id": call["id"], "type": "function", "function": call["function"]})).collect();
                chunks.push(piece(json!({"tool_calls": calls}), 0..c.tokens.len()));
            }
            None => {
                let text = message.get("content").and_then(Value::as_str).unwrap_or("");
                for (delta, range) in deltas(&s.tokenizer, &c.tokens, text) {
                    chunks.push(piece(json!({"content": delta}), range));
                }
            }
        }
        chunks.push(chunk(vec![json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": finish, "stop_reason": null})]));
    }
    if let Some(usage) = &st.usage {
        let mut last = chunk(vec![]);
        last["usage"] = usage.clone();
        chunks.push(last);
    }
    sse(chunks)
}

/// The text-completion stream of one or more prompts' results.
pub(crate) fn text(s: &Shared, id: &str, results: &[Sampled], echoes: &[String], logprobs: bool, token_ids: bool, usage: Option<Value>) -> Response {
    let chunk = |choices: Vec<Value>| json!({"id": id, "object": "text_completion", "created": s.created, "model": s.config.model_name, "choices": choices});
    let mut chunks = vec![];
    let mut index = 0;
    for (p, r) in results.iter().enumerate() {
        for (i, (text, finish)) in r.texts.iter().enumerate() {
            let c = &r.out.completions[i];
            let mut offset = 0;
            if !echoes[p].is_empty() {
                chunks.push(chunk(vec![json!({"index": index, "text": echoes[p], "logprobs": null, "finish_reason": null})]));
                offset = echoes[p].len();
            }
            for (k, (delta, range)) in deltas(&s.tokenizer, &c.tokens, text).into_iter().enumerate() {
                let lp = logprobs.then(|| text_logprobs(s, r, i, range.clone(), offset));
                offset += delta.len();
                let mut choice = json!({"index": index, "text": delta, "logprobs": lp, "finish_reason": null});
                if token_ids {
                    choice["token_ids"] = json!(c.tokens[range].to_vec());
                    if k == 0 {
                        choice["prompt_token_ids"] = json!(r.prompt_ids);
                    }
                }
                chunks.push(chunk(vec![choice]));
            }
            chunks.push(chunk(vec![json!({"index": index, "text": "", "logprobs": null, "finish_reason": finish, "stop_reason": null})]));
            index += 1;
        }
    }
    if let Some(usage) = usage {
        let mut last = chunk(vec![]);
        last["usage"] = usage;
        chunks.push(last);
    }
    sse(chunks)
}
