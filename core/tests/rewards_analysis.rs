//! The error-analysis table and its reward-hacking views.
use rlmesh_core::analysis::{
    analysis_row, hacking_counts, high_total_low_process, long_tool_loops, process_right_final_wrong, process_score,
    tools_on_no_tool_tasks, write_jsonl, HackingCounts, HackingThresholds,
};
use rlmesh_core::reward::process::process_reward;
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
    serde_json::from_value(json!({"id": "cap-1", "requires_tool": false, "allowed_tools": ["calculator"], "expected_answer": "Paris"})).unwrap()
}

fn step(turn: usize, expression: &str, result: &str) -> Step {
    Step {
        turn,
        index: 0,
        name: "calculator".into(),
        arguments: json!({"expression": expression}),
        result: result.into(),
        success: true,
        error: None,
        latency_ms: 1.0,
        repeated: false,
    }
}

fn traj(task: &Task, steps: Vec<Step>, answer: &str) -> Trajectory {
    Trajectory {
        task_id: task.id.clone(),
        sample_index: 0,
        prompt_len: 3,
        rendered_prompt: "<|im_start|>user\nq<|im_end|>\n".into(),
        token_ids: vec![],
        loss_mask: vec![],
        logprobs: vec![],
        versions: vec![],
        segments: vec![],
        summary: None,
        steps,
        format_errors: vec![],
        messages: vec![],
        completion: format!("… {answer}"),
        final_answer: answer.into(),
        stop_reason: StopReason::Answered,
        grades: Vec::new(),
    }
}

fn row(task: &Task, t: &Trajectory) -> rlmesh_core::analysis::AnalysisRow {
    analysis_row(task, t, &process_reward(task, &Transcript::from_trajectory(t)))
}

#[test]
fn columns_in_the_seed_order() {
    let (task, t) = (calc_task(), traj(&calc_task(), vec![step(0, "17*24", "408")], "408"));
    let mut out = Vec::new();
    write_jsonl(&[row(&task, &t)], &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.ends_with('\n'));
    let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text.trim_end()).unwrap();
    let keys: Vec<&str> = v.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "prompt_id", "task_type", "rendered_prompt", "completion", "tool_name", "arguments", "tool_result", "call_count",
            "format_reward", "selection_reward", "argument_reward", "execution_reward", "final_reward", "total_reward",
            "process_segment_reward", "summary_segment_reward", "step_rewards", "verifier_error", "human_note"
        ]
    );
    assert_eq!(v["task_type"], json!("tool_required"));
    assert_eq!(v["tool_name"], json!("calculator"));
    assert_eq!(v["arguments"], json!([{"expression": "17*24"}]));
    assert_eq!(v["total_reward"], json!(1.0));
    assert_eq!(v["verifier_error"], json!(null));
}

#[test]
fn reward_hacking_views() {
    let (calc, cap) = (calc_task(), no_tool_task());
    let rows = vec![
        // 0: right answer without the tool: total 0.1 + 0.3 = 0.4, process (0 + 0 + 0)/3 = 0
        row(&calc, &traj(&calc, vec![], "408")),
        // 1: right call, wrong answer: process 1, final 0 (total 0.7)
        row(&calc, &traj(&calc, vec![step(0, "17*24", "408")], "409")),
        // 2: six calls in a loop: repeated, long loop
        row(&calc, &traj(&calc, (0..6).map(|i| step(i, "17*24", "408")).collect(), "408")),
        // 3: calculator on a no-tool task
        row(&cap, &traj(&cap, vec![step(0, "1+1", "2")], "Paris")),
        // 4: clean no-tool answer
        row(&cap, &traj(&cap, vec![], "Paris")),
    ];
    let th = HackingThresholds::default();
    assert_eq!(process_score(&rows[0]), Some(0.0));
    assert_eq!(rows[2].total_reward, 0.75);
    let ids = |v: Vec<&rlmesh_core::analysis::AnalysisRow>| v.iter().map(|r| r.call_count).collect::<Vec<_>>();
    // rows 0 and 3 (total 0.2 + 0.5 = 0.7 with process score no_call = 0); listed by call count
    assert_eq!(ids(high_total_low_process(&rows, &th)), vec![0, 1]);
    assert_eq!(process_right_final_wrong(&rows).len(), 1);
    assert_eq!(process_right_final_wrong(&rows)[0].final_reward, Some(0.0));
    assert_eq!(ids(long_tool_loops(&rows, &th)), vec![6]);
    assert_eq!(tools_on_no_tool_tasks(&rows)[0].prompt_id, "cap-1");
    assert_eq!(
        hacking_counts(&rows, &th),
        HackingCounts { high_total_low_process: 2, process_right_final_wrong: 1, long_tool_loops: 1, tools_on_no_tool_tasks: 1 }
    );
}

#[test]
fn ungradable_final_answer_is_a_verifier_error() {
    let mut task = calc_task();
    task.expected_answer = None;
    let r = row(&task, &traj(&task, vec![], "408"));
    assert_eq!(r.final_reward, None);
    assert!(r.verifier_error.is_some_and(|e| e.contains("expected_answer")));
}
