//! `launcher advantages` / `launcher reward` refuse overflowing inputs and parameters, naming the field (issue 19, defects 7 and 9).
use rlmesh_core::offline::{advantages_json, reward_json_line};
use serde_json::{json, Value};

fn err(input: Value) -> String {
    advantages_json(&input).unwrap_err().to_string()
}

fn grpo(rewards: [f64; 2], scale: &str) -> Value {
    json!({"estimator": "grpo", "params": {"scale_rewards": scale},
           "groups": [[{"loss_mask": [1], "rewards": [rewards[0]]}, {"loss_mask": [1], "rewards": [rewards[1]]}]]})
}

#[test]
fn overflowing_rewards_are_refused_not_turned_into_null_or_zero() {
    // Before: [1e300, 0] with "none" printed nulls, [1e308, −1e308] printed zeros, both exit 0.
    let e = err(grpo([1e300, 0.0], "none"));
    assert!(e.starts_with("groups[0][0].rewards: expected") && e.contains("1e15") && e.contains("1e300"), "{e}");
    let e = err(grpo([1e308, -1e308], "group"));
    assert!(e.starts_with("groups[0][0].rewards:"), "{e}");
    // Within the bound, the output is finite numbers.
    let ok = advantages_json(&grpo([1e15, -1e15], "none")).unwrap();
    assert_eq!(ok, json!({"advantages": [[[1e15f32], [-1e15f32]]]}));
    let e = err(json!({"estimator": "grpo", "params": {"reward_weights": [1e200]}, "groups": [[{"loss_mask": [1], "rewards": [1.0]}]]}));
    assert!(e.starts_with("params.reward_weights:"), "{e}");
}

#[test]
fn steptool_gamma_lam_and_kl_are_validated() {
    let rollout = json!({"loss_mask": [1, 1], "token_rewards": [0.0, 1.0], "values": [0.0, 0.0]});
    for (key, v) in [("gamma", 1e308), ("gamma", -0.1), ("lam", 1.5), ("kl_coef", -1.0)] {
        let e = err(json!({"estimator": "steptool", "params": {key: v}, "groups": [[rollout]]}));
        assert!(e.starts_with(&format!("params.{key}: expected a number in [0, ")), "{key}={v}: {e}");
    }
    let e = err(json!({"estimator": "steptool", "groups": [[{"loss_mask": [1], "token_rewards": [0.0], "values": [1e30]}]]}));
    assert!(e.starts_with("groups[0][0].values:"), "{e}");
    assert!(advantages_json(&json!({"estimator": "steptool", "params": {"gamma": 1.0, "lam": 0.0}, "groups": [[rollout]]})).is_ok());
}

#[test]
fn slca_scores_are_bounded() {
    let e = err(json!({"estimator": "slca", "groups": [[
        {"loss_mask": [1, 0, 1], "process": 1e308, "summary": 0.0, "total": 1.0},
        {"loss_mask": [1, 0, 1], "process": -1e308, "summary": 0.0, "total": 1.0}]]}));
    assert!(e.starts_with("groups[0][0].process:"), "{e}");
    let e = err(json!({"estimator": "slca", "params": {"w_summary": -1e300}, "groups": []}));
    assert!(e.starts_with("params.w_summary:"), "{e}");
}

#[test]
fn nan_in_json_is_named_as_such() {
    let e = reward_json_line(r#"{"reward": "process", "task": {"requires_tool": NaN}, "completion": ""}"#).unwrap_err().to_string();
    assert!(e.starts_with("input: not valid JSON") && e.contains("NaN and Infinity are not JSON numbers"), "{e}");
    assert!(!e.contains("expected a JSON object"), "{e}");
}
