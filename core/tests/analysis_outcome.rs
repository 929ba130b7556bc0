//! The held-out verdict (`trajectory_outcome`) on hand-built rollouts.
use rlmesh_core::analysis::trajectory_outcome;
use rlmesh_core::{GoldCall, Step, StopReason, Task, Trajectory};
use serde_json::json;

fn task(requires_tool: bool) -> Task {
    Task {
        id: "t".into(),
        prompt: "p".into(),
        requires_tool,
        allowed_tools: if requires_tool { vec!["calculator".into()] } else { vec![] },
        gold_tool_calls: if requires_tool {
            vec![vec![GoldCall { name: "calculator".into(), arguments: json!({"operation": "multiply", "a": 17, "b": 24}) }]]
        } else {
            vec![]
        },
        expected_answer: Some(if requires_tool { "408" } else { "hello" }.into()),
        environment: None,
        env_state: None,
        ..Default::default()
    }
}

fn step(turn: usize, args: serde_json::Value, ok: bool) -> Step {
    Step { turn, index: 0, name: "calculator".into(), arguments: args, result: "408".into(), success: ok, error: None, latency_ms: 0.0, repeated: false }
}

fn traj(steps: Vec<Step>, answer: &str) -> Trajectory {
    Trajectory {
        task_id: "t".into(),
        sample_index: 0,
        prompt_len: 0,
        rendered_prompt: String::new(),
        token_ids: vec![],
        loss_mask: vec![],
        logprobs: vec![],
        versions: vec![],
        segments: vec![],
        summary: None,
        steps,
        format_errors: vec![],
        messages: vec![],
        completion: String::new(),
        final_answer: answer.into(),
        stop_reason: StopReason::Answered,
    }
}

#[test]
fn outcomes_of_the_seed_strategies() {
    let good = json!({"operation": "multiply", "a": 17, "b": 24});
    let tool = task(true);
    // Correct single call then the answer: success.
    let o = trajectory_outcome(&tool, &traj(vec![step(0, good.clone(), true)], "The answer is 408."));
    assert!(o.success && o.final_correct && o.called_tool && !o.repeated_call);
    // Answer without the tool: right answer, no success.
    let o = trajectory_outcome(&tool, &traj(vec![], "408"));
    assert!(!o.success && o.final_correct && !o.called_tool);
    // Wrong arguments.
    let o = trajectory_outcome(&tool, &traj(vec![step(0, json!({"operation": "add", "a": 17, "b": 24}), true)], "408"));
    assert!(!o.success);
    // Repeated identical call.
    let o = trajectory_outcome(&tool, &traj(vec![step(0, good.clone(), true), step(1, good.clone(), true)], "408"));
    assert!(!o.success && o.repeated_call);
    // Failed execution.
    let o = trajectory_outcome(&tool, &traj(vec![step(0, good.clone(), false)], "408"));
    assert!(!o.success);
    // No-tool task: answered directly succeeds; a tool call is unnecessary.
    let plain = task(false);
    let o = trajectory_outcome(&plain, &traj(vec![], "hello"));
    assert!(o.success && !o.unnecessary_tool);
    let o = trajectory_outcome(&plain, &traj(vec![step(0, good, true)], "hello"));
    assert!(!o.success && o.unnecessary_tool && o.final_correct);
}
