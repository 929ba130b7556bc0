//! An agent program's session as trajectories (the recipe's `[agent]`).
//!
//! The endpoint recorded every call the program made with its rollout's key:
//! the prompt's ids, the sampled ids, their log-probs and the policy version.
//! [`assemble`] turns those calls into what the learner trains:
//!
//! - **prefix** — every call's prompt extends the previous call's prompt plus
//!   its sampled ids (the program kept its history as the model wrote it): one
//!   sequence. The tokens between calls (template glue, tool results, new user
//!   turns) are environment tokens, loss mask 0; the sampled ids are the
//!   policy's, with their log-probs and versions.
//! - **segments** — some call's prompt does not extend the previous one (the
//!   harness rewrote the history): one trajectory per call, its prompt then its
//!   sampled ids, each trained with the rollout's advantage. Nothing is
//!   re-tokenized either way, so no sampled id is ever replaced.
//!
//! A session with no call is not a rollout ([`AgentFailure::NoCall`]).
use rlmesh_core::{Message, Span, StopReason, Task, Trajectory};
use rlmesh_model::{FinishReason, Tokenizer};
use rlmesh_serve::sessions::CallRecord;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How a session became trajectories (`rlmesh_agent_sessions_total{shape}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionShape {
    /// One sequence: each call extended the previous one.
    Prefix,
    /// One trajectory per call.
    Segments,
}

impl SessionShape {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            SessionShape::Prefix => "prefix",
            SessionShape::Segments => "segments",
        }
    }
}

/// A session made trainable.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentSession {
    /// Which shape it has.
    pub shape: SessionShape,
    /// One trajectory (prefix) or one per call (segments), in call order.
    pub trajectories: Vec<Trajectory>,
    /// The final conversation: the last call's messages and its reply (what rewards score).
    pub messages: Vec<Message>,
}

/// Why a session is not a rollout: its group is dropped (`failed_agent`) and replaced, never scored 0.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AgentFailure {
    /// The program made no call.
    #[error("the agent program made no call to the endpoint")]
    NoCall,
    /// The program exited non-zero.
    #[error("the agent program exited with code {code}: {stderr}")]
    Exited {
        /// Its exit code.
        code: i32,
        /// The end of its stderr.
        stderr: String,
    },
    /// The program ran past `[agent] timeout_s` (it and its children were killed).
    #[error("the agent program ran past its timeout of {0} s and was killed")]
    TimedOut(u64),
    /// The program could not be started.
    #[error("the agent program could not start: {0}")]
    NotStarted(String),
}

/// `[agent]`: the program trained as it is, one process per rollout, in the
/// recipe's directory unless `cwd` says otherwise.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// The program and its arguments, e.g. `["python3", "agent.py"]`.
    pub command: Vec<String>,
    /// Wall seconds a rollout's program may run (it and its children are then killed).
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Its working directory (set to the recipe's directory when the recipe is read).
    #[serde(default)]
    pub cwd: Option<String>,
}

fn default_timeout_s() -> f64 {
    120.0
}

impl AgentSpec {
    /// Checks the command and the timeout; the error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.command.first().is_none_or(|p| p.trim().is_empty()) {
            return Err(("command", "expected a program and its arguments, e.g. [\"python3\", \"agent.py\"]".into()));
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return Err(("timeout_s", format!("must be a positive number of seconds, got {}", self.timeout_s)));
        }
        Ok(())
    }
}

/// Whether each call's prompt extends the previous call's prompt and sampled ids.
pub fn shape_of(calls: &[CallRecord]) -> SessionShape {
    let extends = calls.windows(2).all(|w| {
        let before: Vec<u32> = w[0].prompt_ids.iter().chain(&w[0].completions[0].tokens).copied().collect();
        w[1].prompt_ids.len() > before.len() && w[1].prompt_ids.starts_with(&before)
    });
    if extends {
        SessionShape::Prefix
    } else {
        SessionShape::Segments
    }
}

/// The session's calls (the first completion of each) as trajectories of `task`'s rollout `sample_index`.
pub fn assemble(task: &Task, sample_index: usize, calls: &[CallRecord], tokenizer: &Tokenizer) -> Result<AgentSession, AgentFailure> {
    let calls: Vec<&CallRecord> = calls.iter().filter(|c| !c.completions.is_empty()).collect();
    let Some(last) = calls.last() else { return Err(AgentFailure::NoCall) };
    let owned: Vec<CallRecord> = calls.iter().map(|c| (*c).clone()).collect();
    let shape = shape_of(&owned);
    let mut messages: Vec<Message> = last.messages.iter().filter_map(|m| serde_json::from_value(m.clone()).ok()).collect();
    let reply = reply_message(&last.completions[0].message);
    let final_answer = reply.content.clone();
    messages.push(reply);
    let stop = match last.completions[0].finish {
        FinishReason::Length => StopReason::TokenBudget,
        _ => StopReason::Answered,
    };
    let trajectories = match shape {
        SessionShape::Prefix => {
            let mut t = sequence(task, sample_index, &calls[0].prompt_ids, tokenizer);
            for c in &calls {
                let glue = &c.prompt_ids[t.token_ids.len()..];
                push(&mut t, glue, None, 0, false);
                push(&mut t, &c.completions[0].tokens, Some(&c.completions[0].logprobs), c.version, called(c));
            }
            vec![t]
        }
        SessionShape::Segments => calls
            .iter()
            .map(|c| {
                let mut t = sequence(task, sample_index, &c.prompt_ids, tokenizer);
                push(&mut t, &c.completions[0].tokens, Some(&c.completions[0].logprobs), c.version, called(c));
                t
            })
            .collect(),
    };
    let trajectories = trajectories
        .into_iter()
        .map(|mut t| {
            let response = &t.token_ids[t.prompt_len..];
            t.completion = tokenizer.decode(response, false).unwrap_or_default();
            t.summary = last_policy_run(&t.loss_mask);
            t.final_answer = final_answer.clone();
            t.messages = messages.clone();
            t.stop_reason = stop;
            t
        })
        .collect();
    Ok(AgentSession { shape, trajectories, messages })
}

/// An empty trajectory holding only `prompt`.
pub(super) fn sequence(task: &Task, sample_index: usize, prompt: &[u32], tokenizer: &Tokenizer) -> Trajectory {
    Trajectory {
        task_id: task.id.clone(),
        sample_index,
        prompt_len: prompt.len(),
        rendered_prompt: tokenizer.decode(prompt, false).unwrap_or_default(),
        token_ids: prompt.to_vec(),
        loss_mask: vec![0; prompt.len()],
        logprobs: vec![0.0; prompt.len()],
        versions: vec![0; prompt.len()],
        segments: vec![],
        summary: None,
        steps: vec![],
        format_errors: vec![],
        messages: vec![],
        completion: String::new(),
        final_answer: String::new(),
        stop_reason: StopReason::Answered,
        grades: Vec::new(),
    }
}

/// Appends tokens: the policy's (with log-probs, mask 1, `version`) or the environment's.
fn push(t: &mut Trajectory, ids: &[u32], logprobs: Option<&[f32]>, version: u64, called: bool) {
    let start = t.token_ids.len();
    t.token_ids.extend_from_slice(ids);
    match logprobs {
        Some(lp) => {
            t.loss_mask.extend(std::iter::repeat_n(1, ids.len()));
            t.logprobs.extend_from_slice(lp);
            t.versions.extend(std::iter::repeat_n(version, ids.len()));
            // A policy turn that called tools is an action segment (what SLCA and StepTool read).
            if called && !ids.is_empty() {
                t.segments.push(Span { start, end: start + ids.len() });
            }
        }
        None => {
            t.loss_mask.extend(std::iter::repeat_n(0, ids.len()));
            t.logprobs.extend(std::iter::repeat_n(0.0, ids.len()));
            t.versions.extend(std::iter::repeat_n(0, ids.len()));
        }
    }
}

/// Whether a call's (first) reply called tools.
fn called(c: &CallRecord) -> bool {
    c.completions[0].message.get("tool_calls").and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

/// The last maximal run of policy tokens.
fn last_policy_run(mask: &[u8]) -> Option<Span> {
    let end = mask.iter().rposition(|&m| m != 0)? + 1;
    let start = mask[..end].iter().rposition(|&m| m == 0).map_or(0, |i| i + 1);
    Some(Span { start, end })
}

/// The endpoint's reply (OpenAI's shape: arguments as a JSON string) as a transformers-format message.
fn reply_message(reply: &Value) -> Message {
    rlmesh_serve::chat::template_messages(std::slice::from_ref(reply))
        .ok()
        .and_then(|mut m| m.pop())
        .and_then(|m| serde_json::from_value(m).ok())
        .unwrap_or_else(|| Message::assistant(reply.get("content").and_then(Value::as_str).unwrap_or("")))
}
