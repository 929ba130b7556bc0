//! Warm-up data: noisy expert trajectories for supervised fine-tuning before RL.
//!
//! An expert follows one of the seed's strategies on a task — the correct
//! calls then the answer, or a hack: answering without the tool, wrong
//! arguments, a repeated call, a tool on a no-tool task. The turns are rendered
//! exactly as a rollout records them: prompt from the chat template, each
//! assistant turn as the tokens the model would write (loss mask 1), the
//! template glue and the tool responses as a prefix-preserving suffix (mask 0).
//! Tool results come from really executing the calls.
use rlmesh_core::tools::{ToolRegistry, ToolSession};
use rlmesh_core::{Message, Task, ToolCallMsg};
use rlmesh_model::{ModelError, Tokenizer};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Shares of SFT trajectories per strategy: all five when given, summing to 1
/// (default 0.6 correct, 0.1 each other). A strategy that does not apply to a
/// task (`unnecessary_tool` on a tool task, the tool mistakes on a no-tool
/// task) writes the correct trajectory instead.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftMix {
    /// The right calls, then the right answer.
    pub correct: f64,
    /// Answers a tool task without calling the tool.
    pub no_tool: f64,
    /// Calls the right tool with wrong arguments.
    pub wrong_arguments: f64,
    /// Repeats a call.
    pub repeated_call: f64,
    /// Calls a tool on a no-tool task.
    pub unnecessary_tool: f64,
}

impl Default for SftMix {
    fn default() -> Self {
        SftMix { correct: 0.6, no_tool: 0.1, wrong_arguments: 0.1, repeated_call: 0.1, unnecessary_tool: 0.1 }
    }
}

/// A strategy an expert follows on a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// The gold calls in order, then the answer (no call on a no-tool task).
    Correct,
    /// Answer a tool task without calling the tool.
    AnswerWithoutTool,
    /// Call the tool with wrong arguments, then answer with its result.
    WrongArguments,
    /// Make the first gold call twice.
    RepeatedCall,
    /// Call the calculator on a no-tool task, then answer.
    ToolOnNoToolTask,
}

/// The strategy for a draw `u` in [0, 1) under the recipe's mix, restricted to
/// the strategies that apply to the task (the weights are renormalised).
pub fn pick_strategy(mix: &SftMix, task: &Task, u: f64) -> Strategy {
    let options: Vec<(Strategy, f64)> = if task.requires_tool {
        vec![
            (Strategy::Correct, mix.correct),
            (Strategy::AnswerWithoutTool, mix.no_tool),
            (Strategy::WrongArguments, mix.wrong_arguments),
            (Strategy::RepeatedCall, mix.repeated_call),
        ]
    } else {
        vec![(Strategy::Correct, mix.correct), (Strategy::ToolOnNoToolTask, mix.unnecessary_tool)]
    };
    let total: f64 = options.iter().map(|(_, w)| w.max(0.0)).sum();
    let mut x = u * total;
    for (s, w) in &options {
        if x < w.max(0.0) {
            return *s;
        }
        x -= w.max(0.0);
    }
    Strategy::Correct
}

/// One supervised example: tokens and the mask of the tokens the model writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertExample {
    /// The strategy followed.
    pub strategy: Strategy,
    /// Prompt + response ids.
    pub token_ids: Vec<u32>,
    /// 1 on the assistant's own tokens.
    pub loss_mask: Vec<u8>,
    /// The conversation after the prompt.
    pub messages: Vec<Message>,
}

/// Why a conversation cannot be laid out for training.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    /// Rendering or tokenising failed.
    #[error("{0}")]
    Text(ModelError),
    /// A rendering of the conversation so far is not a prefix of the next one.
    #[error("the chat template is not prefix-preserving")]
    NotPrefixPreserving,
}

/// A conversation's tokens for supervised training, and its loss mask: 1 on
/// what each assistant message renders to (its end-of-turn token included),
/// 0 on everything else (system, user and tool turns, template glue, the
/// generation prompts). The text is rendered by the chat template at each
/// assistant turn, and each new piece is tokenised alone and appended, as a
/// rollout appends its turns: no token is ever re-tokenised across a turn's
/// boundary, so what is trained is what the policy would have produced.
pub fn training_tokens(tokenizer: &Tokenizer, conv: &[Message], tools: Option<&[Value]>) -> Result<(Vec<u32>, Vec<u8>), ConversationError> {
    let values = |msgs: &[Message]| -> Vec<Value> { msgs.iter().map(|m| serde_json::to_value(m).expect("message serialises")).collect() };
    let (mut text, mut ids, mut mask) = (String::new(), Vec::new(), Vec::new());
    let mut push = |piece: &str, m: u8, text: &mut String| -> Result<(), ConversationError> {
        let piece_ids = tokenizer.encode(piece).map_err(ConversationError::Text)?;
        mask.extend(std::iter::repeat_n(m, piece_ids.len()));
        ids.extend(piece_ids);
        text.push_str(piece);
        Ok(())
    };
    for i in (0..conv.len()).filter(|&i| conv[i].role == "assistant") {
        // Everything up to this turn's generation prompt: not trained.
        let before = tokenizer.render(&values(&conv[..i]), tools, true).map_err(ConversationError::Text)?;
        let glue = before.strip_prefix(text.as_str()).ok_or(ConversationError::NotPrefixPreserving)?.to_string();
        push(&glue, 0, &mut text)?;
        // The assistant's own text, up to and including its end token (not the newline after it).
        let full = tokenizer.render(&values(&conv[..=i]), tools, false).map_err(ConversationError::Text)?;
        let body = full.strip_prefix(text.as_str()).ok_or(ConversationError::NotPrefixPreserving)?;
        let glue_start = body.rfind('\n').filter(|&j| j + 1 == body.len()).unwrap_or(body.len());
        let own = body[..glue_start].to_string();
        push(&own, 1, &mut text)?;
    }
    Ok((ids, mask))
}

/// Errors while building warm-up data.
#[derive(Debug, thiserror::Error)]
pub enum WarmupError {
    /// The task's tool session could not be opened (e.g. its reset failed).
    #[error("task {task}: {source}")]
    Session {
        /// Task id.
        task: String,
        /// The cause.
        source: rlmesh_core::tools::RegistryError,
    },
    /// The conversation could not be laid out for a task.
    #[error("task {task}: {message}")]
    Task {
        /// Task id.
        task: String,
        /// What went wrong.
        message: String,
    },
    /// Rendering or tokenising failed.
    #[error("task {task}: {source}")]
    Text {
        /// Task id.
        task: String,
        /// The cause.
        source: ModelError,
    },
}

fn wrong_arguments(args: &Value) -> Value {
    let mut v = args.clone();
    if let Some(o) = v.as_object_mut() {
        // Off by one on the first numeric argument, as a careless copy would be.
        if let Some((_, x)) = o.iter_mut().find(|(_, x)| x.is_number()) {
            let n = x.as_f64().unwrap_or(0.0) + 1.0;
            *x = if n.fract() == 0.0 { json!(n as i64) } else { json!(n) };
        }
    }
    v
}

fn answer_text(task: &Task, result: Option<&str>) -> String {
    match (task.requires_tool, result) {
        (true, Some(r)) => format!("The answer is {r}."),
        _ => task.expected_answer.clone().unwrap_or_default(),
    }
}

/// Build the example for `task` under `strategy` (the tools really run).
pub fn expert_example(
    tokenizer: &Tokenizer,
    registry: &ToolRegistry,
    task: &Task,
    strategy: Strategy,
    system_prompt: Option<&str>,
) -> Result<ExpertExample, WarmupError> {
    let task_err = |m: String| WarmupError::Task { task: task.id.clone(), message: m };
    let text_err = |source| WarmupError::Text { task: task.id.clone(), source };
    let mut session: ToolSession = registry.session(task).map_err(|source| WarmupError::Session { task: task.id.clone(), source })?;
    let user = match session.observation() {
        Some(obs) => format!("{}\n\n{obs}", task.prompt),
        None => task.prompt.clone(),
    };
    let mut conv: Vec<Message> = system_prompt.map(Message::system).into_iter().chain([Message::user(user)]).collect();
    let prompt_len_msgs = conv.len();
    let schemas = session.schemas();
    let tools = (!schemas.is_empty()).then_some(schemas.as_slice());

    // The calls of each assistant turn under the strategy.
    let gold: Vec<Vec<(String, Value)>> =
        task.gold_tool_calls.iter().map(|step| step.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect()).collect();
    let turns: Vec<Vec<(String, Value)>> = match strategy {
        Strategy::Correct => gold.clone(),
        Strategy::AnswerWithoutTool => vec![],
        Strategy::WrongArguments => {
            let mut g = gold.clone();
            if let Some(c) = g.first_mut().and_then(|s| s.first_mut()) {
                c.1 = wrong_arguments(&c.1);
            }
            g
        }
        Strategy::RepeatedCall => {
            let mut g = gold.clone();
            if let Some(first) = g.first().cloned() {
                g.insert(1, first);
            }
            g
        }
        Strategy::ToolOnNoToolTask => vec![vec![("calculator".to_string(), json!({"operation": "add", "a": 2, "b": 3}))]],
    };
    let mut last_result: Option<String> = None;
    for (turn, calls) in turns.iter().enumerate() {
        let parsed: Vec<rlmesh_core::tools::ParsedCall> = calls
            .iter()
            .map(|(name, args)| rlmesh_core::tools::ParsedCall { name: name.clone(), arguments: args.clone(), raw: String::new(), error: None })
            .collect();
        let steps = session.execute(turn, &parsed);
        last_result = steps.last().map(|s| s.result.clone());
        let mut msg = Message::assistant("");
        msg.tool_calls = Some(calls.iter().map(|(n, a)| ToolCallMsg::new(n.clone(), a.clone())).collect());
        conv.push(msg);
        conv.extend(steps.iter().map(|s| Message::tool(s.name.clone(), s.result.clone())));
    }
    let answer = if strategy == Strategy::ToolOnNoToolTask { answer_text(task, None) } else { answer_text(task, last_result.as_deref()) };
    conv.push(Message::assistant(answer));
    let (ids, mask) = training_tokens(tokenizer, &conv, tools).map_err(|e| match e {
        ConversationError::Text(source) => text_err(source),
        ConversationError::NotPrefixPreserving => task_err("the chat template is not prefix-preserving".into()),
    })?;
    Ok(ExpertExample { strategy, token_ids: ids, loss_mask: mask, messages: conv.split_off(prompt_len_msgs) })
}
