//! `POST /v1/chat/completions` and `POST /v1/completions`: a request becomes
//! one [`Job`] per prompt on the batcher, and its completions become choices.
use crate::batcher::{Job, JobOutput};
use crate::chat::{assistant_message, completion_text, sampling_params, template_messages, template_tools, token_piece, MAX_TOP_LOGPROBS};
use crate::error::ApiError;
use crate::server::Shared;
use crate::sessions::{Auth, CallRecord, SampledCompletion};
use crate::stream::{self, Streamed};
use crate::wire::{self, ChatRequest, CompletionRequest, Prompt};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rlmesh_model::{Completion, SamplingParams};
use serde_json::{json, Value};

/// One prompt's sampled completions with their text.
pub(crate) struct Sampled {
    pub(crate) prompt_ids: Vec<u32>,
    pub(crate) out: JobOutput,
    /// Per completion: its text (stop token and stop string cut) and OpenAI finish reason.
    pub(crate) texts: Vec<(String, &'static str)>,
}

/// Runs one prompt on the batcher and decodes its completions.
async fn sample(s: &Shared, prompt_ids: Vec<u32>, n: usize, params: SamplingParams, seeded: bool, top: usize) -> Result<Sampled, ApiError> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let stops = params.stop_strings.clone();
    let job = Job { prompt: prompt_ids.clone(), n, params, seeded, top_logprobs: top, reply };
    s.batcher.submit(job).map_err(|_| ApiError::unavailable("the engine has shut down"))?;
    let out = answer.await.map_err(|_| ApiError::unavailable("the engine stopped before answering"))?.map_err(ApiError::internal)?;
    let texts = out.completions.iter().map(|c| completion_text(&s.tokenizer, c, &stops)).collect::<Result<_, _>>()?;
    Ok(Sampled { prompt_ids, out, texts })
}

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens})
}

/// Chat's `logprobs.content` entries of tokens `range` of completion `i`.
pub(crate) fn chat_logprobs(s: &Shared, sampled: &Sampled, i: usize, range: std::ops::Range<usize>) -> Vec<Value> {
    let c = &sampled.out.completions[i];
    let top = sampled.out.top.get(i);
    range
        .map(|k| {
            let (token, bytes) = token_piece(&s.tokenizer, c.tokens[k]);
            let alternatives: Vec<Value> = top
                .and_then(|t| t.get(k))
                .map(|alts| {
                    alts.iter()
                        .map(|&(id, lp)| {
                            let (token, bytes) = token_piece(&s.tokenizer, id);
                            json!({"token": token, "logprob": lp, "bytes": bytes})
                        })
                        .collect()
                })
                .unwrap_or_default();
            json!({"token": token, "logprob": c.logprobs[k], "bytes": bytes, "top_logprobs": alternatives})
        })
        .collect()
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat(s: &Shared, body: &[u8], key: &str) -> Result<Response, ApiError> {
    let req: ChatRequest = wire::parse(body)?;
    s.check_model(&req.model)?;
    let messages = template_messages(&req.messages)?;
    let tools = template_tools(req.tools.as_deref(), req.tool_choice.as_ref())?;
    let top = match (req.logprobs, req.top_logprobs) {
        (_, Some(k)) if k > MAX_TOP_LOGPROBS => return Err(ApiError::bad_request(format!("top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {k}"), Some("top_logprobs"))),
        (false, Some(k)) if k > 0 => return Err(ApiError::bad_request("top_logprobs needs logprobs: true", Some("top_logprobs"))),
        (_, k) => k.unwrap_or(0) as usize,
    };
    let context = s.context()?;
    let text = s
        .tokenizer
        .render(&messages, tools.as_deref(), true)
        .map_err(|e| ApiError::bad_request(format!("the chat template cannot render these messages: {e}"), Some("messages")))?;
    let prompt_ids = s.tokenizer.encode(&text).map_err(|e| ApiError::internal(e.to_string()))?;
    let (mut params, n, seeded) = sampling_params(&req.sampling, prompt_ids.len(), context, s.tokenizer.stop_token_ids())?;
    s.adjust(key, &mut params);
    let sampled = sample(s, prompt_ids, n, params, seeded, top).await?;
    let offered = tools.is_some();
    let mut call_id = || s.next_id("call_");
    let replies: Vec<(Value, &'static str)> =
        sampled.texts.iter().map(|(text, finish)| assistant_message(text.clone(), finish, offered, s.config.tool_format, &mut call_id)).collect();
    if let Auth::Sessions(sessions) = &s.config.auth {
        let completions = sampled
            .out
            .completions
            .iter()
            .zip(&replies)
            .map(|(c, (message, _))| SampledCompletion { tokens: c.tokens.clone(), logprobs: c.logprobs.clone(), finish: c.finish, message: message.clone() })
            .collect();
        let call = CallRecord { prompt_ids: sampled.prompt_ids.clone(), messages, tools, version: sampled.out.version, completions };
        sessions.record(key, call).map_err(ApiError::unauthorized)?;
    }
    let id = s.next_id("chatcmpl-");
    let completion_tokens: usize = sampled.out.completions.iter().map(|c| c.tokens.len()).sum();
    let usage = usage(sampled.prompt_ids.len(), completion_tokens);
    if req.sampling.stream {
        let include_usage = req.sampling.stream_options.as_ref().is_some_and(|o| o.include_usage);
        let streamed = Streamed { s, id: &id, sampled: &sampled, logprobs: req.logprobs, token_ids: req.sampling.return_token_ids, usage: include_usage.then_some(usage) };
        return Ok(stream::chat(&streamed, &replies));
    }
    let choices: Vec<Value> = replies
        .iter()
        .enumerate()
        .map(|(i, (message, finish))| {
            let c = &sampled.out.completions[i];
            let logprobs = req.logprobs.then(|| json!({"content": chat_logprobs(s, &sampled, i, 0..c.tokens.len())}));
            let mut choice = json!({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish, "stop_reason": null});
            if req.sampling.return_token_ids {
                choice["token_ids"] = json!(c.tokens);
            }
            choice
        })
        .collect();
    let mut response = json!({"id": id, "object": "chat.completion", "created": s.created, "model": s.config.model_name, "choices": choices, "usage": usage});
    if req.sampling.return_token_ids {
        response["prompt_token_ids"] = json!(sampled.prompt_ids);
    }
    Ok(Json(response).into_response())
}

/// A text completion's legacy `logprobs` object for tokens `range` of completion `i`.
pub(crate) fn text_logprobs(s: &Shared, sampled: &Sampled, i: usize, range: std::ops::Range<usize>, offset: usize) -> Value {
    let c: &Completion = &sampled.out.completions[i];
    let (mut tokens, mut token_logprobs, mut top_logprobs, mut offsets) = (vec![], vec![], vec![], vec![]);
    let mut at = offset;
    for k in range {
        let (token, _) = token_piece(&s.tokenizer, c.tokens[k]);
        offsets.push(at);
        at += token.len();
        tokens.push(token);
        token_logprobs.push(c.logprobs[k]);
        let alts: serde_json::Map<String, Value> = sampled
            .out
            .top
            .get(i)
            .and_then(|t| t.get(k))
            .map(|alts| alts.iter().map(|&(id, lp)| (token_piece(&s.tokenizer, id).0, json!(lp))).collect())
            .unwrap_or_default();
        top_logprobs.push(Value::Object(alts));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets})
}

/// `POST /v1/completions`.
pub(crate) async fn text(s: &Shared, body: &[u8], key: &str) -> Result<Response, ApiError> {
    let req: CompletionRequest = wire::parse(body)?;
    s.check_model(&req.model)?;
    let top = match req.logprobs {
        Some(k) if k > MAX_TOP_LOGPROBS => return Err(ApiError::bad_request(format!("logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {k}"), Some("logprobs"))),
        Some(k) => k as usize,
        None => 0,
    };
    let context = s.context()?;
    let prompts: Vec<Vec<u32>> = match &req.prompt {
        Prompt::Text(t) => vec![s.tokenizer.encode(t).map_err(|e| ApiError::internal(e.to_string()))?],
        Prompt::Texts(ts) => ts.iter().map(|t| s.tokenizer.encode(t)).collect::<Result<_, _>>().map_err(|e| ApiError::internal(e.to_string()))?,
        Prompt::Ids(ids) => vec![ids.clone()],
        Prompt::IdLists(lists) => lists.clone(),
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_request("prompt holds no prompt", Some("prompt")));
    }
    let vocab = s.tokenizer.vocab_size();
    if let Some(bad) = prompts.iter().flatten().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad_request(format!("token id {bad} is outside the vocabulary of {vocab}"), Some("prompt")));
    }
    let mut jobs = vec![];
    for p in &prompts {
        let (mut params, n, seeded) = sampling_params(&req.sampling, p.len(), context, s.tokenizer.stop_token_ids())?;
        s.adjust(key, &mut params);
        jobs.push(sample(s, p.clone(), n, params, seeded, top));
    }
    // Submitted together, so the batcher can put them in one engine call.
    let results = futures_util::future::join_all(jobs).await.into_iter().collect::<Result<Vec<Sampled>, ApiError>>()?;
    if let Auth::Sessions(sessions) = &s.config.auth {
        for r in &results {
            let completions = r
                .out
                .completions
                .iter()
                .zip(&r.texts)
                .map(|(c, (text, _))| SampledCompletion { tokens: c.tokens.clone(), logprobs: c.logprobs.clone(), finish: c.finish, message: json!({"text": text}) })
                .collect();
            sessions.record(key, CallRecord { prompt_ids: r.prompt_ids.clone(), messages: vec![], tools: None, version: r.out.version, completions }).map_err(ApiError::unauthorized)?;
        }
    }
    let id = s.next_id("cmpl-");
    let prompt_tokens: usize = results.iter().map(|r| r.prompt_ids.len()).sum();
    let completion_tokens: usize = results.iter().flat_map(|r| &r.out.completions).map(|c| c.tokens.len()).sum();
    let usage = usage(prompt_tokens, completion_tokens);
    let echoes: Vec<String> = if req.echo {
        results.iter().map(|r| s.tokenizer.decode(&r.prompt_ids, false)).collect::<Result<_, _>>().map_err(|e| ApiError::internal(e.to_string()))?
    } else {
        vec![String::new(); results.len()]
    };
    if req.sampling.stream {
        let include_usage = req.sampling.stream_options.as_ref().is_some_and(|o| o.include_usage);
        return Ok(stream::text(s, &id, &results, &echoes, req.logprobs.is_some(), req.sampling.return_token_ids, include_usage.then_some(usage)));
    }
    let mut choices = vec![];
    for (p, r) in results.iter().enumerate() {
        for (i, (text, finish)) in r.texts.iter().enumerate() {
            let c = &r.out.completions[i];
            let echo = &echoes[p];
            let logprobs = req.logprobs.is_some().then(|| text_logprobs(s, r, i, 0..c.tokens.len(), echo.len()));
            let mut choice = json!({"index": choices.len(), "text": format!("{echo}{text}"), "logprobs": logprobs, "finish_reason": finish, "stop_reason": null});
            if req.sampling.return_token_ids {
                choice["prompt_token_ids"] = json!(r.prompt_ids);
                choice["token_ids"] = json!(c.tokens);
            }
            choices.push(choice);
        }
    }
    let response = json!({"id": id, "object": "text_completion", "created": s.created, "model": s.config.model_name, "choices": choices, "usage": usage});
    Ok(Json(response).into_response())
}
