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

/// Errors while building warm-up data.
#[derive(Debug, thiserror::Error)]
pub enum WarmupError {
    /// The tools could not be opened for a task.
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
    let mut session: ToolSession = registry.session(task).map_err(|e| task_err(e.to_string()))?;
    let user = match session.observation() {
        Some(obs) => format!("{}\n\n{obs}", task.prompt),
        None => task.prompt.clone(),
    };
    let mut conv: Vec<Message> = system_prompt.map(Message::system).into_iter().chain([Message::user(user)]).collect();
    let prompt_len_msgs = conv.len();
    let schemas = session.schemas();
    let tools = (!schemas.is_empty()).then_some(schemas.as_slice());
    let values = |msgs: &[Message]| -> Vec<Value> { msgs.iter().map(|m| serde_json::to_value(m).expect("message serialises")).collect() };
    let (mut text, mut ids) = tokenizer.render_ids(&values(&conv), tools, true).map_err(text_err)?;
    let mut mask = vec![0u8; ids.len()];

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
    let append = |conv: &mut Vec<Message>, msg: Message, text: &mut String, ids: &mut Vec<u32>, mask: &mut Vec<u8>, gen_prompt_after: bool, calls_follow: Option<Vec<Message>>| -> Result<(), WarmupError> {
        // The assistant's own text: what the template renders for this message, up to and including its end token.
        conv.push(msg);
        let full = tokenizer.render(&values(conv), tools, false).map_err(text_err)?;
        let body = full.strip_prefix(text.as_str()).ok_or_else(|| task_err("the chat template is not prefix-preserving".into()))?;
        let glue_start = body.rfind('\n').filter(|&i| i + 1 == body.len()).unwrap_or(body.len());
        let (own, _) = body.split_at(glue_start);
        let own_ids = tokenizer.encode(own).map_err(text_err)?;
        ids.extend(&own_ids);
        mask.extend(std::iter::repeat_n(1u8, own_ids.len()));
        text.push_str(own);
        if let Some(tool_msgs) = calls_follow {
            conv.extend(tool_msgs);
        }
        if gen_prompt_after {
            let next = tokenizer.render(&values(conv), tools, true).map_err(text_err)?;
            let suffix = next.strip_prefix(text.as_str()).ok_or_else(|| task_err("the chat template is not prefix-preserving".into()))?.to_string();
            let suffix_ids = tokenizer.encode(&suffix).map_err(text_err)?;
            ids.extend(&suffix_ids);
            mask.extend(std::iter::repeat_n(0u8, suffix_ids.len()));
            text.push_str(&suffix);
        }
        Ok(())
    };
    for (turn, calls) in turns.iter().enumerate() {
        let parsed: Vec<rlmesh_core::tools::ParsedCall> = calls
            .iter()
            .map(|(name, args)| rlmesh_core::tools::ParsedCall { name: name.clone(), arguments: args.clone(), raw: String::new(), error: None })
            .collect();
        let steps = session.execute(turn, &parsed);
        last_result = steps.last().map(|s| s.result.clone());
        let mut msg = Message::assistant("");
        msg.tool_calls = Some(calls.iter().map(|(n, a)| ToolCallMsg::new(n.clone(), a.clone())).collect());
        let tool_msgs: Vec<Message> = steps.iter().map(|s| Message::tool(s.name.clone(), s.result.clone())).collect();
        append(&mut conv, msg, &mut text, &mut ids, &mut mask, true, Some(tool_msgs))?;
    }
    let answer = if strategy == Strategy::ToolOnNoToolTask { answer_text(task, None) } else { answer_text(task, last_result.as_deref()) };
    append(&mut conv, Message::assistant(answer), &mut text, &mut ids, &mut mask, false, None)?;
    // The end-of-turn token closes the answer; it is part of what the model writes.
    Ok(ExpertExample { strategy, token_ids: ids, loss_mask: mask, messages: conv.split_off(prompt_len_msgs) })
}
