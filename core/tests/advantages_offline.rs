//! `launcher advantages` JSON contract: shapes, defaults and errors that name the field.
use rlmesh_core::offline::advantages_json;
use serde_json::json;

fn err(input: serde_json::Value) -> String {
    advantages_json(&input).unwrap_err().to_string()
}

#[test]
fn grpo_per_token_output() {
    let out = advantages_json(&json!({
        "estimator": "grpo", "params": {"scale_rewards": "none"},
        "groups": [[{"loss_mask": [0, 1, 1], "rewards": [1.0]}, {"loss_mask": [0, 0, 1], "rewards": [0.0]}]]
    }))
    .unwrap();
    // μ = 0.5 → A = [0.5, −0.5] on policy tokens; no returns for GRPO
    assert_eq!(out, json!({"advantages": [[[0.0, 0.5, 0.5], [0.0, 0.0, -0.5]]]}));
}

#[test]
fn dr_grpo_and_rloo_and_weights() {
    let groups = json!([[{"loss_mask": [1], "rewards": [1.0, null]}, {"loss_mask": [1], "rewards": [0.0, 1.0]}]]);
    // weights [1, 0.5]: r = [1, 0.5] → Dr.GRPO r − μ = [0.25, −0.25]; RLOO [0.5, −0.5]
    let dr = advantages_json(&json!({"estimator": "dr_grpo", "params": {"reward_weights": [1.0, 0.5]}, "groups": groups})).unwrap();
    assert_eq!(dr, json!({"advantages": [[[0.25], [-0.25]]]}));
    let rloo = advantages_json(&json!({"estimator": "rloo", "params": {"reward_weights": [1.0, 0.5]}, "groups": groups})).unwrap();
    assert_eq!(rloo, json!({"advantages": [[[0.5], [-0.5]]]}));
}

#[test]
fn slca_and_steptool_outputs() {
    let slca = advantages_json(&json!({
        "estimator": "slca", "params": {"norm_by_std": false},
        "groups": [[
            {"loss_mask": [1, 0, 1], "process": 1.0, "summary": 0.2, "total": 1.2},
            {"loss_mask": [1, 0, 1], "process": 0.0, "summary": 0.6, "total": 0.6, "no_call": false}
        ]]
    }))
    .unwrap();
    // p = [1, 0] → ±0.5 on the process token; q = [0.2, 0.6] → ∓0.2 on the summary token (f32)
    assert_eq!(slca, json!({"advantages": [[[0.5, 0.0, -0.2f32], [-0.5, 0.0, 0.2f32]]]}));
    let step = advantages_json(&json!({
        "estimator": "steptool", "params": {"gamma": 1.0, "lam": 1.0},
        "groups": [[{"loss_mask": [0, 1], "step_rewards": [1.0], "values": [0.0, 0.25]}]]
    }))
    .unwrap();
    // one masked token: A1 = 1 − 0.25 = 0.75, returns 0.75 + 0.25 = 1; whitening one token → 0
    assert_eq!(step, json!({"advantages": [[[0.0, 0.0]]], "returns": [[[0.0, 1.0]]]}));
    let free = advantages_json(&json!({
        "estimator": "steptool", "params": {"critic_free": true, "gamma": 1.0},
        "groups": [[{"loss_mask": [1], "step_rewards": [1.0]}, {"loss_mask": [1], "step_rewards": [0.0]}]]
    }))
    .unwrap();
    assert!(free.get("returns").is_none());
    assert_eq!(free["advantages"][0][0][0].as_f64().map(f64::signum), Some(1.0));
}

#[test]
fn errors_name_the_field() {
    let bad_mask = json!({"estimator": "grpo", "groups": [[{"loss_mask": [1], "rewards": [1.0]}], [{"loss_mask": [1, 2], "rewards": [1.0]}]]});
    assert_eq!(err(bad_mask), "groups[1][0].loss_mask: expected array of 0/1");
    assert_eq!(err(json!({"estimator": "ppo", "groups": []})), "estimator: expected one of \"grpo\", \"dr_grpo\", \"rloo\", \"slca\", \"steptool\"");
    let ragged = json!({"estimator": "grpo", "groups": [[{"loss_mask": [1], "rewards": [1.0, 2.0]}, {"loss_mask": [1], "rewards": [1.0]}]]});
    assert!(err(ragged).starts_with("groups[0][1].rewards: expected array of 2 numbers or nulls"));
    let scale = json!({"estimator": "grpo", "params": {"scale_rewards": "team"}, "groups": []});
    assert_eq!(err(scale), "params.scale_rewards: expected one of \"group\", \"batch\", \"none\"");
    let dr = json!({"estimator": "dr_grpo", "params": {"scale_rewards": "group"}, "groups": []});
    assert!(err(dr).starts_with("params.scale_rewards: expected \"none\""));
    let slca = json!({"estimator": "slca", "groups": [[{"loss_mask": [1], "process": 1.0, "summary": "high", "total": 1.0}]]});
    assert_eq!(err(slca), "groups[0][0].summary: expected a number");
    let values = json!({"estimator": "steptool", "groups": [[{"loss_mask": [1, 1], "token_rewards": [0.0, 1.0], "values": [0.0]}]]});
    assert_eq!(err(values), "groups[0][0].values: expected array of 2 numbers (one per loss_mask entry)");
    let steps = json!({"estimator": "steptool", "groups": [[{"loss_mask": [1, 0, 1], "step_rewards": [1.0], "values": [0.0, 0.0, 0.0]}]]});
    assert!(err(steps).starts_with("groups[0][0].step_rewards: expected one per action (2 runs"));
    assert_eq!(err(json!([1, 2])), "input: expected a JSON object");
}
