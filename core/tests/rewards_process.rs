//! The seed's process-aware reward and the final-answer-only reward, by hand.
use rlmesh_core::reward::process::{final_only_reward, process_reward};
use rlmesh_core::reward::Transcript;
use rlmesh_core::{Step, StopReason, Task, Trajectory};
use serde_json::json;

fn calc_task() -> Task {
    serde_json::from_value(json!({
        "id": "calc-1", "requires_tool": true, "allowed_tools": ["calculator"],
        "gold_tool_calls": [[{"name": "calculator", "arguments": {"expression": "17*24"}}]],
        "expected_answer": "408"
    }))
    .unwrap()
}

fn no_tool_task() -> Task {
    serde_json::from_value(json!({"id": "cap-1", "requires_tool": false, "allowed_tools": ["search"], "expected_answer": "Paris"})).unwrap()
}

fn call(name: &str, args: serde_json::Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": name, "arguments": args}))
}

fn turn_with_result(call_text: &str, result: &str) -> String {
    format!("{call_text}<|im_end|>\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
}

fn components(s: &rlmesh_core::reward::Scored) -> Vec<Option<f64>> {
    s.components.iter().map(|(_, v)| *v).collect()
}

#[test]
fn perfect_tool_rollout_scores_one() {
    let text = turn_with_result(&call("calculator", json!({"expression": "17*24"})), "408") + "The answer is 408.<|im_end|>";
    let s = process_reward(&calc_task(), &Transcript::from_completion(&text));
    // 0.10·1 + 0.20·1 + 0.20·1 + 0.20·1 + 0.30·1 − 0.25·0 = 1.0
    assert_eq!(components(&s), vec![Some(1.0), Some(1.0), Some(1.0), Some(1.0), Some(1.0), Some(0.0), None]);
    assert!((s.total - 1.0).abs() < 1e-12);
}

#[test]
fn answering_without_the_tool_gets_format_and_final_only() {
    let s = process_reward(&calc_task(), &Transcript::from_completion("17*24 = 408"));
    // 0.10·1 (format) + 0.30·1 (final) = 0.4; selection, arguments, execution all 0
    assert_eq!(components(&s), vec![Some(1.0), Some(0.0), Some(0.0), Some(0.0), Some(1.0), Some(0.0), None]);
    assert!((s.total - 0.4).abs() < 1e-12);
    // The final-answer-only reward cannot tell: 0.10·1 + 0.90·1 = 1.0
    assert!((final_only_reward(&calc_task(), &Transcript::from_completion("17*24 = 408")).total - 1.0).abs() < 1e-12);
}

#[test]
fn repeated_call_is_penalised() {
    let c = call("calculator", json!({"expression": "17*24"}));
    let text = turn_with_result(&c, "408") + &turn_with_result(&c, "408") + "408";
    let s = process_reward(&calc_task(), &Transcript::from_completion(&text));
    // 0.10 + 0.20 + 0.20 + 0.20 + 0.30 − 0.25 = 0.75
    assert_eq!(s.component("repeated_call"), Some(1.0));
    assert!((s.total - 0.75).abs() < 1e-12);
}

#[test]
fn negative_total_from_penalty_alone() {
    // Wrong tool called twice with the same arguments (errors), a malformed block, wrong answer.
    let c = call("search", json!({"q": "17*24"}));
    let text = turn_with_result(&c, "{\"error\": \"unknown tool\"}")
        + &turn_with_result(&c, "{\"error\": \"unknown tool\"}")
        + "<tool_call>\n{oops\n</tool_call> I give up: 7";
    let s = process_reward(&calc_task(), &Transcript::from_completion(&text));
    // format 0 (malformed block), tool 0, args 0, execution 0, final 0, repeated 1 → −0.25
    assert_eq!(components(&s), vec![Some(0.0), Some(0.0), Some(0.0), Some(0.0), Some(0.0), Some(1.0), None]);
    assert!((s.total + 0.25).abs() < 1e-12);
}

#[test]
fn wrong_arguments_lose_only_the_argument_part() {
    let text = turn_with_result(&call("calculator", json!({"expression": "17*25"})), "425") + "425";
    let s = process_reward(&calc_task(), &Transcript::from_completion(&text));
    // 0.10 + 0.20 (tool) + 0 (args) + 0.20 (ran) + 0 (final) = 0.5
    assert!((s.total - 0.5).abs() < 1e-12);
}

#[test]
fn malformed_completion_scores_zero_format() {
    let s = process_reward(&calc_task(), &Transcript::from_completion("<tool_call>\n{\"name\": \"calculator\", \"arguments\": \"17*24\"}"));
    // unclosed block with string arguments: nothing applies → every part 0
    assert_eq!(s.component("format_ok"), Some(0.0));
    assert_eq!(s.total, 0.0);
}

#[test]
fn no_tool_task_rubric() {
    let t = no_tool_task();
    let right = process_reward(&t, &Transcript::from_completion("The capital of France is Paris."));
    // 0.20·1 + 0.30·1 + 0.50·1 = 1.0; tool parts do not apply
    assert_eq!(components(&right), vec![Some(1.0), None, None, None, Some(1.0), None, Some(1.0)]);
    assert!((right.total - 1.0).abs() < 1e-12);
    let text = turn_with_result(&call("search", json!({"q": "capital of France"})), "Paris") + "Paris";
    let tool_used = process_reward(&t, &Transcript::from_completion(&text));
    // 0.20·1 + 0.30·0 + 0.50·1 = 0.7
    assert!((tool_used.total - 0.7).abs() < 1e-12);
}

#[test]
fn missing_expected_answer_is_absent_not_zero() {
    let mut task = calc_task();
    task.expected_answer = None;
    let text = turn_with_result(&call("calculator", json!({"expression": "17*24"})), "408") + "408";
    let s = process_reward(&task, &Transcript::from_completion(&text));
    // 0.10 + 0.20 + 0.20 + 0.20 = 0.7; final_correct is None
    assert_eq!(s.component("final_correct"), None);
    assert!((s.total - 0.7).abs() < 1e-12);
}

#[test]
fn trajectory_and_text_agree() {
    let traj = Trajectory {
        task_id: "calc-1".into(),
        sample_index: 0,
        prompt_len: 0,
        rendered_prompt: String::new(),
        token_ids: vec![],
        loss_mask: vec![],
        logprobs: vec![],
        versions: vec![],
        segments: vec![],
        summary: None,
        steps: vec![Step {
            turn: 0,
            index: 0,
            name: "calculator".into(),
            arguments: json!({"expression": "17 * 24"}),
            result: "408".into(),
            success: true,
            error: None,
            latency_ms: 0.1,
            repeated: false,
        }],
        format_errors: vec![],
        messages: vec![],
        completion: String::new(),
        final_answer: "It is 408.0".into(),
        stop_reason: StopReason::Answered,
        grades: Vec::new(),
    };
    let from_traj = process_reward(&calc_task(), &Transcript::from_trajectory(&traj));
    // "17 * 24" vs gold "17*24": strings differ after trimming → arguments 0: 0.10+0.20+0+0.20+0.30 = 0.8
    assert!((from_traj.total - 0.8).abs() < 1e-12);
    let text = turn_with_result(&call("calculator", json!({"expression": "17 * 24"})), "408") + "It is 408.0";
    assert_eq!(process_reward(&calc_task(), &Transcript::from_completion(&text)), from_traj);
}
