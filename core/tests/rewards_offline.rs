//! `launcher reward` JSON contract: every reward kind, malformed completions scored, errors naming the field.
use proptest::prelude::*;
use rlmesh_core::offline::reward_json_line;
use serde_json::json;

fn task() -> serde_json::Value {
    json!({
        "requires_tool": true, "allowed_tools": ["calculator"],
        "gold_tool_calls": [[{"name": "calculator", "arguments": {"expression": "17*24"}}]],
        "expected_answer": "408"
    })
}

const GOOD: &str = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17*24\"}}\n</tool_call><tool_response>408</tool_response>The answer is 408.";

fn line(reward: &str, completion: &str) -> String {
    json!({"reward": reward, "task": task(), "completion": completion}).to_string()
}

#[test]
fn every_reward_kind() {
    let p = reward_json_line(&line("process", GOOD)).unwrap();
    assert_eq!(p["total"], json!(1.0));
    assert_eq!(p["components"]["no_call"], json!(null));
    let f = reward_json_line(&line("final_only", "408")).unwrap();
    assert_eq!(f, json!({"total": 1.0, "components": {"format_ok": 1.0, "final_correct": 1.0}}));
    let h = json!({"reward": "hierr", "task": task(), "completion": GOOD, "judge_score": 3}).to_string();
    // process 1.0 (every part right) + summary (3 − 1)/4 = 0.5
    assert_eq!(reward_json_line(&h).unwrap()["total"], json!(1.5));
    let s = reward_json_line(&line("steptool", GOOD)).unwrap();
    assert_eq!(s["step_rewards"], json!([1.0, 1.0]));
}

#[test]
fn messages_input() {
    let l = json!({
        "reward": "process", "task": task(),
        "messages": [
            {"role": "user", "content": "17*24?"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "17*24"}}}]},
            {"role": "tool", "name": "calculator", "content": "408"},
            {"role": "assistant", "content": "408"}
        ]
    });
    assert_eq!(reward_json_line(&l.to_string()).unwrap()["total"], json!(1.0));
}

#[test]
fn malformed_completions_are_scored_with_format_zero() {
    for bad in [
        "<tool_call>",
        "</tool_call> 408",
        "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17*24\"}\n</tool_call>408",
        "<tool_call>[]</tool_call>408",
        "<tool_call>{\"name\": 7, \"arguments\": {}}</tool_call>408",
        "<tool_call>{\"name\": \"calculator\"}</tool_call>408",
        "<tool_call><tool_call>{}</tool_call></tool_call>408",
        "<tool_response>408",
        "",
    ] {
        let out = reward_json_line(&line("process", bad)).unwrap_or_else(|e| panic!("{bad:?}: {e}"));
        assert_eq!(out["components"]["format_ok"], json!(0.0), "{bad:?}");
        assert_eq!(reward_json_line(&line("hierr", bad)).unwrap()["components"]["no_call"], json!(1.0), "{bad:?}");
    }
}

#[test]
fn errors_name_the_field() {
    let e = |v: serde_json::Value| reward_json_line(&v.to_string()).unwrap_err().to_string();
    assert!(reward_json_line("{not json").unwrap_err().to_string().starts_with("input: not valid JSON"));
    assert!(e(json!({"reward": "vibes", "task": task(), "completion": ""})).starts_with("reward: expected one of"));
    assert!(e(json!({"reward": "process", "completion": ""})).starts_with("task: expected a task object"));
    assert!(e(json!({"reward": "process", "task": {"allowed_tools": []}, "completion": ""})).starts_with("task: expected"));
    assert!(e(json!({"reward": "process", "task": task()})).starts_with("completion: expected exactly one of"));
    assert_eq!(e(json!({"reward": "process", "task": task(), "completion": 5})), "completion: expected a string");
    assert!(e(json!({"reward": "process", "task": task(), "messages": [{"content": "x"}]})).starts_with("messages: expected an array of chat messages"));
    assert_eq!(e(json!({"reward": "hierr", "task": task(), "completion": "", "judge_score": 0})), "judge_score: expected an integer 1..=5");
}

proptest! {
    #[test]
    fn any_completion_is_scored(text in "(<tool_call>|</tool_call>|<tool_response>|</tool_response>|\\{|\\}|\"name\"|:|\\[|408|<\\|im_end\\|>|[a-z ]){0,40}") {
        for kind in ["process", "final_only", "hierr", "steptool"] {
            let out = reward_json_line(&line(kind, &text)).unwrap();
            prop_assert!(out["total"].as_f64().is_some_and(f64::is_finite));
        }
    }
}
