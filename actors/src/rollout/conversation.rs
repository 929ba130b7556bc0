//! One rollout under construction: its tools, its token record and the
//! conversation that record renders.
use super::RolloutError;
use rlmesh_core::tools::{ParsedCall, ToolRegistry, ToolSession};
use rlmesh_core::reward::functions::Score;
use rlmesh_core::{Message, Span, Step, StopReason, Task, Trajectory};
use rlmesh_model::{Completion, FinishReason, ModelError, Tokenizer};
use serde_json::Value;

/// The state of one rollout between turns.
pub(super) struct Conversation {
    task_id: String,
    sample_index: usize,
    session: ToolSession,
    /// Tool schemas for the template (`None` when the rollout has no tools).
    tools: Option<Vec<Value>>,
    /// The prompt messages (system, user) as template input.
    prompt: Vec<Value>,
    rendered_prompt: String,
    prompt_len: usize,
    ids: Vec<u32>,
    mask: Vec<u8>,
    logprobs: Vec<f32>,
    versions: Vec<u64>,
    segments: Vec<Span>,
    summary: Option<Span>,
    steps: Vec<Step>,
    format_errors: Vec<String>,
    messages: Vec<Message>,
    turns: usize,
    /// The stop token that ended the last turn (`None`: a stop string ended it).
    ended_by: Option<u32>,
    /// Why the rollout ended; `None` while it is live.
    pub(super) stop: Option<StopReason>,
}

fn to_values(messages: &[Message]) -> impl Iterator<Item = Value> + '_ {
    messages.iter().map(|m| serde_json::to_value(m).expect("a Message serialises to JSON"))
}

/// A task's prompt: its messages (a task file's list, system message
/// allowed) or its one user prompt, after `system_prompt` unless the task
/// brings its own; the environment's reset observation ends the last user message.
pub fn prompt_messages(task: &Task, observation: Option<&str>, system_prompt: Option<&str>) -> Vec<Message> {
    let mut msgs = if task.messages.is_empty() { vec![Message::user(task.prompt.clone())] } else { task.messages.clone() };
    if let Some(obs) = observation {
        if let Some(last) = msgs.iter_mut().rev().find(|m| m.role == "user") {
            last.content = format!("{}\n\n{obs}", last.content);
        }
    }
    match system_prompt {
        Some(sys) if msgs.first().is_none_or(|m| m.role != "system") => std::iter::once(Message::system(sys)).chain(msgs).collect(),
        _ => msgs,
    }
}

impl Conversation {
    /// Opens the tools of a rollout on `task` and renders its prompt.
    /// The rendered prompt (chat template, tool schemas, generation prompt).
    pub(super) fn rendered_prompt(&self) -> &str {
        &self.rendered_prompt
    }

    pub(super) fn open(
        tokenizer: &Tokenizer,
        registry: &ToolRegistry,
        task: &Task,
        sample_index: usize,
        system_prompt: Option<&str>,
    ) -> Result<Self, RolloutError> {
        let session = registry.session(task)?;
        let prompt = prompt_messages(task, session.observation(), system_prompt);
        let prompt: Vec<Value> = to_values(&prompt).collect();
        let schemas = session.schemas();
        let tools = (!schemas.is_empty()).then_some(schemas);
        let text_err = |what| move |source| RolloutError::Text { task: task.id.clone(), turn: 0, what, source };
        let (rendered_prompt, ids) = tokenizer.render_ids(&prompt, tools.as_deref(), true).map_err(text_err("rendering the prompt"))?;
        let n = ids.len();
        Ok(Conversation {
            task_id: task.id.clone(),
            sample_index,
            session,
            tools,
            prompt,
            rendered_prompt,
            prompt_len: n,
            ids,
            mask: vec![0; n],
            logprobs: vec![0.0; n],
            versions: vec![0; n],
            segments: vec![],
            summary: None,
            steps: vec![],
            format_errors: vec![],
            messages: vec![],
            turns: 0,
            ended_by: None,
            stop: None,
        })
    }

    /// The token ids so far (the next generation's prefix).
    pub(super) fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Tokens the rollout may still add: the budget after the prompt and the model's context.
    pub(super) fn room(&self, max_tokens: usize, context: usize) -> usize {
        let response = self.ids.len() - self.prompt_len;
        max_tokens.saturating_sub(response).min(context.saturating_sub(self.ids.len()))
    }

    fn text_err(&self, what: &'static str) -> impl FnOnce(ModelError) -> RolloutError + '_ {
        move |source| RolloutError::Text { task: self.task_id.clone(), turn: self.turns, what, source }
    }

    /// Records one generated turn (cut to `limit` tokens) and parses it; returns
    /// the calls to execute, or `None` when the rollout ended with this turn.
    pub(super) fn record_turn(
        &mut self,
        mut completion: Completion,
        limit: usize,
        version: u64,
        tokenizer: &Tokenizer,
    ) -> Result<Option<Vec<ParsedCall>>, RolloutError> {
        if completion.tokens.len() > limit {
            completion.tokens.truncate(limit);
            completion.logprobs.truncate(limit);
            completion.finish = FinishReason::Length;
        }
        let start = self.ids.len();
        let n = completion.tokens.len();
        self.ids.extend_from_slice(&completion.tokens);
        self.mask.extend(std::iter::repeat_n(1, n));
        self.logprobs.extend_from_slice(&completion.logprobs);
        self.versions.extend(std::iter::repeat_n(version, n));
        let span = Span { start, end: self.ids.len() };
        self.turns += 1;
        self.ended_by = match completion.finish {
            FinishReason::StopToken => completion.tokens.last().copied(),
            FinishReason::StopString | FinishReason::Length => None,
        };
        let body = &completion.tokens[..n - usize::from(self.ended_by.is_some())];
        let text = tokenizer.decode(body, false).map_err(self.text_err("decoding the generated turn"))?;
        let turn = self.session.parse(&text);
        self.format_errors.extend(turn.format_errors());
        self.messages.push(turn.message());
        let cut = completion.finish == FinishReason::Length;
        if turn.calls.is_empty() {
            self.summary = Some(span);
            self.stop = Some(if cut { StopReason::TokenBudget } else { StopReason::Answered });
            return Ok(None);
        }
        self.segments.push(span);
        if cut {
            self.stop = Some(StopReason::TokenBudget);
            return Ok(None);
        }
        Ok(Some(turn.calls))
    }

    /// Executes the calls of the last turn (one step per call, in order).
    pub(super) fn execute(&mut self, calls: &[ParsedCall]) -> Vec<Step> {
        self.session.execute(self.turns - 1, calls)
    }

    /// Records the steps of the last turn and, unless the rollout ends here,
    /// appends their tool messages as a token suffix with loss mask 0.
    pub(super) fn append_results(
        &mut self,
        steps: Vec<Step>,
        tokenizer: &Tokenizer,
        stop_ids: &[u32],
        max_turns: usize,
        room: usize,
    ) -> Result<(), RolloutError> {
        let tool_messages: Vec<Message> = steps.iter().map(|s| Message::tool(s.name.clone(), s.result.clone())).collect();
        self.steps.extend(steps);
        if self.turns >= max_turns {
            self.stop = Some(StopReason::MaxTurns);
            return Ok(());
        }
        let suffix = self.suffix(tokenizer, &tool_messages, stop_ids)?;
        let ids = tokenizer.encode(&suffix).map_err(self.text_err("tokenising the tool results"))?;
        // The suffix must leave room for at least one generated token.
        if ids.len() >= room {
            self.stop = Some(StopReason::TokenBudget);
            return Ok(());
        }
        let n = ids.len();
        self.ids.extend(ids);
        self.mask.extend(std::iter::repeat_n(0, n));
        self.logprobs.extend(std::iter::repeat_n(0.0, n));
        self.versions.extend(std::iter::repeat_n(0, n));
        self.messages.extend(tool_messages);
        Ok(())
    }

    /// The text that follows the model's last token: the template's glue after
    /// the turn, the tool messages and the generation prompt.
    fn suffix(&self, tokenizer: &Tokenizer, tool_messages: &[Message], stop_ids: &[u32]) -> Result<String, RolloutError> {
        let turn = self.turns;
        let mut conversation = self.prompt.clone();
        conversation.extend(to_values(&self.messages));
        let tools = self.tools.as_deref();
        let before = tokenizer.render(&conversation, tools, false).map_err(self.text_err("rendering the conversation"))?;
        conversation.extend(to_values(tool_messages));
        let after = tokenizer.render(&conversation, tools, true).map_err(self.text_err("rendering the tool results"))?;
        let Some(tail) = after.strip_prefix(before.as_str()) else {
            let at = before.char_indices().zip(after.chars()).find(|((_, a), b)| a != b).map_or(before.len().min(after.len()), |((i, _), _)| i);
            let found = after[at..].chars().take(80).collect();
            return Err(RolloutError::NotPrefix { task: self.task_id.clone(), turn, found });
        };
        // The glue starts after the end-of-turn token in the rendering: after
        // the one the model wrote, or, when a stop string ended the turn, at
        // the template's own (which the model did not write).
        let stops: Vec<(bool, String)> = match self.ended_by {
            Some(id) => vec![(true, id)],
            None => stop_ids.iter().map(|&id| (false, id)).collect(),
        }
        .into_iter()
        .map(|(written, id)| tokenizer.decode(&[id], false).map(|t| (written, t)))
        .collect::<Result<_, _>>()
        .map_err(self.text_err("decoding the stop tokens"))?;
        let end = stops
            .iter()
            .filter(|(_, t)| !t.is_empty())
            .filter_map(|(written, t)| before.rfind(t.as_str()).map(|at| if *written { at + t.len() } else { at }))
            .max()
            .ok_or_else(|| RolloutError::NoEndOfTurn { task: self.task_id.clone(), turn, stops: stops.iter().map(|(_, t)| t.clone()).collect() })?;
        Ok(format!("{}{tail}", &before[end..]))
    }

    /// The finished trajectory.
    pub(super) fn finish(self, tokenizer: &Tokenizer) -> Result<Trajectory, RolloutError> {
        let completion = tokenizer.decode(&self.ids[self.prompt_len..], false).map_err(self.text_err("decoding the completion"))?;
        let final_answer = self.messages.iter().rev().find(|m| m.role == "assistant").map(|m| m.content.clone()).unwrap_or_default();
        // The sources' grades, after the last turn (an MCP server's reward tool is called here).
        let grades = self.session.grades().into_iter().map(|(name, g)| (name, g.map_or_else(|reason| Score::Unscorable { reason }, Score::from))).collect();
        Ok(Trajectory {
            task_id: self.task_id,
            sample_index: self.sample_index,
            prompt_len: self.prompt_len,
            rendered_prompt: self.rendered_prompt,
            token_ids: self.ids,
            loss_mask: self.mask,
            logprobs: self.logprobs,
            versions: self.versions,
            segments: self.segments,
            summary: self.summary,
            steps: self.steps,
            format_errors: self.format_errors,
            messages: self.messages,
            completion,
            final_answer,
            // Every other ending is recorded when it happens: a live rollout ran out of turns.
            stop_reason: self.stop.unwrap_or(StopReason::MaxTurns),
            grades,
        })
    }
}
