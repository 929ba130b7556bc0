//! The tool loop end to end: a tiny Qwen2 policy taught in this process to
//! call tools, the real calculator and tool executor, the real chat template.
#[path = "common/tool_policy.rs"]
mod tool_policy;

use rlmesh_actors::rollout::{chat, rollout_groups, RolloutConfig, RolloutError};
use rlmesh_core::tools::inventory::Inventory;
use rlmesh_core::{Group, Message, Span, StopReason, Task, ToolCallMsg, Trajectory};
use rlmesh_model::{SamplingParams, Tokenizer};
use serde_json::json;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tool_policy::{call, conversation, policy, prompt_of, registry, render_with_mask, targets, tokenizer, tools_of, TOOL_TIMEOUT_MS};

const VERSION: u64 = 3;

fn greedy() -> RolloutConfig {
    RolloutConfig {
        group_size: 2,
        max_turns: 4,
        max_tokens: 400,
        sampling: SamplingParams { max_new_tokens: 96, temperature: 0.0, ..SamplingParams::default() },
        ..RolloutConfig::default()
    }
}

/// Every taught task, G = 2, in one batch (shared by the tests), and how long it took.
fn batch() -> &'static (Vec<Group>, Duration) {
    static BATCH: OnceLock<(Vec<Group>, Duration)> = OnceLock::new();
    BATCH.get_or_init(|| {
        let (model, tk) = (policy(), tokenizer());
        let tasks: Vec<(u64, Task)> = targets().into_iter().enumerate().map(|(i, (t, _))| (100 + i as u64, t)).collect();
        let start = Instant::now();
        let groups = rollout_groups(&model, &tk, &registry(), &tasks, &greedy(), VERSION, 7).unwrap();
        let took = start.elapsed();
        eprintln!("batched rollout of {} trajectories took {:.2} s", groups.len() * 2, took.as_secs_f64());
        (groups, took)
    })
}

fn group(id: &str) -> &'static Group {
    batch().0.iter().find(|g| g.task.id == id).unwrap()
}

fn target_turns(id: &str) -> Vec<String> {
    targets().into_iter().find(|(t, _)| t.id == id).unwrap().1
}

/// Runs of 1s in a mask.
fn runs(mask: &[u8]) -> Vec<Span> {
    let mut out = vec![];
    let mut start = None;
    for (i, &m) in mask.iter().chain([&0]).enumerate() {
        match (m, start) {
            (1, None) => start = Some(i),
            (0, Some(s)) => {
                out.push(Span { start: s, end: i });
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// What every trajectory must satisfy; `rerender` also checks that the
/// messages render (tokenised in one piece) to exactly the token ids and mask.
fn check_record(tk: &Tokenizer, traj: &Trajectory, prompt: &[Message], tools: &[serde_json::Value], rerender: bool) {
    let n = traj.token_ids.len();
    assert_eq!((traj.loss_mask.len(), traj.logprobs.len(), traj.versions.len()), (n, n, n));
    // The prompt: the rendered prompt's tokens, all masked out.
    assert_eq!(tk.render(&to_values(prompt), Some(tools), true).unwrap(), traj.rendered_prompt);
    assert_eq!(tk.encode(&traj.rendered_prompt).unwrap(), traj.token_ids[..traj.prompt_len]);
    assert!(traj.loss_mask[..traj.prompt_len].iter().all(|&m| m == 0));
    // Log-probs and versions only under the mask; the log-probs are the policy's.
    for i in 0..n {
        match traj.loss_mask[i] {
            0 => assert_eq!((traj.logprobs[i], traj.versions[i]), (0.0, 0), "token {i}"),
            _ => assert!(traj.logprobs[i] <= 0.0 && traj.versions[i] == VERSION, "token {i}"),
        }
    }
    // The policy tokens are exactly the segments and the summary, each one run of the mask.
    let mut spans = traj.segments.clone();
    spans.extend(traj.summary);
    assert_eq!(runs(&traj.loss_mask), spans, "segments + summary are the runs of the mask");
    assert_eq!(traj.policy_tokens(), spans.iter().map(Span::len).sum::<usize>());
    assert_eq!(traj.completion, tk.decode(&traj.token_ids[traj.prompt_len..], false).unwrap());
    if rerender {
        let (ids, mask) = render_with_mask(tk, prompt, &traj.messages, tools);
        assert_eq!(ids[..n], traj.token_ids, "re-rendering the messages gives the token ids");
        assert_eq!(tk.decode(&ids[n..], false).unwrap(), "\n", "only the glue after the last turn is missing");
        assert_eq!(mask[..n], traj.loss_mask, "mask 1 exactly on the assistant turns' tokens");
    }
}

fn to_values(messages: &[Message]) -> Vec<serde_json::Value> {
    messages.iter().map(|m| serde_json::to_value(m).unwrap()).collect()
}

fn text(tk: &Tokenizer, traj: &Trajectory, span: Span) -> String {
    tk.decode(&traj.token_ids[span.start..span.end], false).unwrap()
}

#[test]
fn calculator_rollout_masks_only_policy_tokens_and_rerenders_exactly() {
    let tk = tokenizer();
    let g = group("calc");
    assert_eq!(g.group_id, 100);
    assert_eq!(g.trajectories.iter().map(|t| t.sample_index).collect::<Vec<_>>(), [0, 1]);
    let turns = target_turns("calc");
    for traj in &g.trajectories {
        assert_eq!(traj.stop_reason, StopReason::Answered);
        assert_eq!(traj.messages, conversation(&g.task, &turns));
        assert_eq!(traj.messages[1], Message::tool("calculator", "408"));
        check_record(&tk, traj, &prompt_of(&g.task), &tools_of(&g.task), true);
        assert_eq!(traj.steps.len(), 1);
        let s = &traj.steps[0];
        assert_eq!((s.turn, s.index, s.name.as_str(), s.result.as_str(), s.success, s.repeated), (0, 0, "calculator", "408", true, false));
        assert_eq!(s.arguments, json!({"operation": "multiply", "a": 17, "b": 24}));
        assert_eq!(traj.segments.len(), 1);
        assert_eq!(text(&tk, traj, traj.segments[0]), format!("{}<|im_end|>", turns[0]));
        assert_eq!(text(&tk, traj, traj.summary.unwrap()), "The answer is 408.<|im_end|>");
        assert_eq!(traj.final_answer, "The answer is 408.");
        assert!(traj.format_errors.is_empty());
        // Between the call and the answer: the glue, the tool turn and the generation prompt, all masked out.
        let injected = Span { start: traj.segments[0].end, end: traj.summary.unwrap().start };
        assert_eq!(text(&tk, traj, injected), "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
        // The behaviour log-probs are the policy's own (teacher-forced) log-probs.
        let scored = policy().score(std::slice::from_ref(&traj.token_ids)).unwrap().remove(0);
        for i in (0..traj.token_ids.len()).filter(|&i| traj.loss_mask[i] == 1) {
            assert!((traj.logprobs[i] - scored[i - 1]).abs() < 1e-3, "token {i}: {} vs {}", traj.logprobs[i], scored[i - 1]);
        }
    }
    assert_eq!(g.trajectories[0].token_ids, g.trajectories[1].token_ids, "greedy samples of one prompt agree");
}

#[test]
fn no_tool_answer_is_one_summary_and_no_steps() {
    let tk = tokenizer();
    let g = group("hello");
    for traj in &g.trajectories {
        check_record(&tk, traj, &prompt_of(&g.task), &tools_of(&g.task), true);
        assert_eq!(traj.stop_reason, StopReason::Answered);
        assert!(traj.steps.is_empty() && traj.segments.is_empty());
        assert_eq!(traj.summary, Some(Span { start: traj.prompt_len, end: traj.token_ids.len() }));
        assert_eq!(traj.messages, [Message::assistant("hello")]);
        assert_eq!(traj.final_answer, "hello");
        assert_eq!(traj.completion, "hello<|im_end|>");
    }
}

#[test]
fn parallel_calls_each_get_a_tool_message_and_repeats_are_flagged() {
    let tk = tokenizer();
    let g = group("parallel");
    let turns = target_turns("parallel");
    for traj in &g.trajectories {
        check_record(&tk, traj, &prompt_of(&g.task), &tools_of(&g.task), true);
        assert_eq!(traj.stop_reason, StopReason::Answered);
        assert_eq!(traj.messages, conversation(&g.task, &turns));
        let calls = traj.messages[0].tool_calls.clone().unwrap();
        assert_eq!(
            calls,
            [
                ToolCallMsg::new("calculator", json!({"operation": "add", "a": 1, "b": 2})),
                ToolCallMsg::new("calculator", json!({"operation": "power", "a": 2, "b": 3}))
            ]
        );
        assert_eq!(traj.messages[1..3], [Message::tool("calculator", "3"), Message::tool("calculator", "8")]);
        let summary: Vec<_> = traj.steps.iter().map(|s| (s.turn, s.index, s.result.as_str(), s.success, s.repeated)).collect();
        assert_eq!(summary, [(0, 0, "3", true, false), (0, 1, "8", true, false), (1, 0, "3", true, true)]);
        assert_eq!(traj.segments.len(), 2);
        assert_eq!(text(&tk, traj, traj.segments[1]), format!("{}<|im_end|>", call("calculator", r#"{"operation": "add", "a": 1, "b": 2}"#)));
        assert_eq!(traj.final_answer, "1 + 2 = 3 and 2 ** 3 = 8.");
    }
}

#[test]
fn failed_calls_are_recorded_and_a_hanging_tool_does_not_stop_the_rollout() {
    let tk = tokenizer();
    let g = group("broken");
    for traj in &g.trajectories {
        check_record(&tk, traj, &prompt_of(&g.task), &tools_of(&g.task), true);
        assert_eq!(traj.stop_reason, StopReason::Answered);
        assert_eq!(traj.final_answer, "Done.");
        assert_eq!(traj.format_errors.len(), 1);
        assert!(traj.format_errors[0].starts_with("malformed tool call: invalid JSON"), "{}", traj.format_errors[0]);
        let errors: Vec<String> = traj.steps.iter().map(|s| s.error.clone().unwrap()).collect();
        assert!(traj.steps.iter().all(|s| !s.success && s.turn == 0));
        assert_eq!(errors[0], traj.format_errors[0]);
        assert_eq!(errors[1], "unknown tool \"search\" (available: calculator, wait)");
        assert_eq!(errors[2], format!("tool \"wait\" timed out after {TOOL_TIMEOUT_MS} ms"));
        assert!(traj.steps[2].latency_ms >= TOOL_TIMEOUT_MS as f64);
        // One tool message per block, each {"error": …}; the malformed block stays in the assistant's content.
        let tools: Vec<&Message> = traj.messages.iter().filter(|m| m.role == "tool").collect();
        assert_eq!(tools.len(), 3);
        for (m, e) in tools.iter().zip(&errors) {
            assert_eq!(serde_json::from_str::<serde_json::Value>(&m.content).unwrap(), json!({ "error": e }));
        }
        assert!(traj.messages[0].content.starts_with("<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"a\": 1}\n</tool_call>"));
        assert_eq!(traj.messages[0].tool_calls.as_ref().map(Vec::len), Some(2));
    }
    // The hanging tool sleeps for a minute; the whole batch finished long before.
    assert!(batch().1 < Duration::from_secs(20), "the batch took {:?}", batch().1);
}

#[test]
fn max_turns_stops_after_the_last_allowed_turn() {
    let (model, tk) = (policy(), tokenizer());
    let g = group("parallel").clone();
    let cfg = RolloutConfig { max_turns: 1, group_size: 1, ..greedy() };
    let traj = rollout_groups(&model, &tk, &registry(), &[(1, g.task.clone())], &cfg, VERSION, 0).unwrap().remove(0).trajectories.remove(0);
    check_record(&tk, &traj, &prompt_of(&g.task), &tools_of(&g.task), true);
    assert_eq!(traj.stop_reason, StopReason::MaxTurns);
    // The last turn's calls ran, but their results were never shown to the model.
    assert_eq!(traj.steps.len(), 2);
    assert_eq!(traj.messages.len(), 1);
    assert_eq!((traj.segments.len(), traj.summary), (1, None));
    assert_eq!(traj.token_ids, g.trajectories[0].token_ids[..traj.token_ids.len()]);
}

#[test]
fn token_budget_cuts_the_rollout() {
    let (model, tk) = (policy(), tokenizer());
    let full = &group("calc").trajectories[0];
    let run = |max_tokens: usize| {
        let cfg = RolloutConfig { max_tokens, group_size: 1, ..greedy() };
        let task = group("calc").task.clone();
        rollout_groups(&model, &tk, &registry(), &[(1, task)], &cfg, VERSION, 0).unwrap().remove(0).trajectories.remove(0)
    };
    let (prompt, call_end, answer_start) = (full.prompt_len, full.segments[0].end, full.summary.unwrap().start);
    let prompt_msgs = prompt_of(&group("calc").task);
    let tools = tools_of(&group("calc").task);

    // Inside the first turn: the call is cut, nothing runs.
    let cut = run(5);
    check_record(&tk, &cut, &prompt_msgs, &tools, false);
    assert_eq!(cut.stop_reason, StopReason::TokenBudget);
    assert_eq!(cut.token_ids, full.token_ids[..prompt + 5]);
    assert!(cut.steps.is_empty());

    // The call fits but its result and one more token do not: the call runs, the result is not appended.
    let no_room = run(answer_start - prompt);
    check_record(&tk, &no_room, &prompt_msgs, &tools, true);
    assert_eq!(no_room.stop_reason, StopReason::TokenBudget);
    assert_eq!(no_room.token_ids, full.token_ids[..call_end]);
    assert_eq!((no_room.steps.len(), no_room.messages.len()), (1, 1));

    // The answer is cut after 2 tokens.
    let short = run(answer_start + 2 - prompt);
    check_record(&tk, &short, &prompt_msgs, &tools, false);
    assert_eq!(short.stop_reason, StopReason::TokenBudget);
    assert_eq!(short.token_ids, full.token_ids[..answer_start + 2]);
    assert_eq!(short.summary, Some(Span { start: answer_start, end: answer_start + 2 }));
    assert_eq!(short.messages.len(), 3);
}

#[test]
fn chat_runs_one_conversation_as_the_batch_does() {
    let (model, tk) = (policy(), tokenizer());
    let cfg = RolloutConfig { group_size: 5, ..greedy() };
    let traj = chat(&model, &tk, &registry(), "Use the calculator to compute 17 * 24.", &cfg, 1).unwrap();
    let batched = &group("calc").trajectories[0];
    assert_eq!(traj.task_id, "chat");
    assert_eq!(traj.token_ids, batched.token_ids, "alone or in a batch of 8, greedy decoding agrees");
    assert_eq!(traj.messages, batched.messages);
    assert!(traj.versions.iter().all(|&v| v == 0));
}

#[test]
fn prompt_has_the_system_message_the_observation_and_the_tools() {
    let (model, tk) = (policy(), tokenizer());
    let task = Task {
        environment: Some("inventory".into()),
        env_state: Some(Inventory::state(&[("apples", 12), ("pears", 3)], &[("apples", 20)])),
        ..tool_policy::task("stock", "Bring the apples to 20.", true)
    };
    let cfg = RolloutConfig { system_prompt: Some("You manage a shop.".into()), max_tokens: 3, group_size: 1, ..greedy() };
    let traj = rollout_groups(&model, &tk, &registry(), &[(9, task.clone())], &cfg, VERSION, 0).unwrap().remove(0).trajectories.remove(0);
    let session = registry().session(&task).unwrap();
    let observation = session.observation().unwrap().to_string();
    let prompt = [Message::system("You manage a shop."), Message::user(format!("Bring the apples to 20.\n\n{observation}"))];
    check_record(&tk, &traj, &prompt, &session.schemas(), false);
    assert!(traj.rendered_prompt.starts_with("<|im_start|>system\nYou manage a shop.\n\n# Tools"));
    assert!(traj.rendered_prompt.contains("apples, pears"), "{}", traj.rendered_prompt);
    let names: Vec<String> = session.schemas().iter().map(|s| s["function"]["name"].as_str().unwrap().to_string()).collect();
    assert!(names.len() > 2 && names.iter().all(|n| traj.rendered_prompt.contains(&format!("\"name\": \"{n}\""))), "{names:?}");
    assert_eq!((traj.stop_reason, traj.policy_tokens()), (StopReason::TokenBudget, 3));
}

#[test]
fn bad_config_is_refused_naming_the_field() {
    let (model, tk) = (policy(), tokenizer());
    let task = group("calc").task.clone();
    for (cfg, field) in [
        (RolloutConfig { group_size: 0, ..greedy() }, "group_size"),
        (RolloutConfig { max_turns: 0, ..greedy() }, "max_turns"),
        (RolloutConfig { max_tokens: 0, ..greedy() }, "max_tokens"),
    ] {
        let err = rollout_groups(&model, &tk, &registry(), &[(1, task.clone())], &cfg, VERSION, 0).unwrap_err();
        assert!(matches!(err, RolloutError::Config { field: f, .. } if f == field), "{err}");
        assert_eq!(err.to_string(), format!("rollout config: field `{field}` must be at least 1, got 0"));
    }
    let unknown = Task { environment: Some("garden".into()), ..task };
    let err = rollout_groups(&model, &tk, &registry(), &[(1, unknown)], &greedy(), VERSION, 0).unwrap_err();
    assert!(err.to_string().contains("environment \"garden\" is not configured"), "{err}");
}
