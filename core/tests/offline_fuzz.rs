//! `launcher advantages` and `launcher reward` never panic on random or mutated
//! JSON: every input gives an output of finite numbers or an error naming a
//! field (issue 19, "Also": a property test per JSON command).
use proptest::prelude::*;
use rlmesh_core::offline::{advantages_json, reward_json_line};
use serde_json::{json, Value};

/// Numbers that break naive arithmetic: extremes, signed zeros, tiny and huge, fractions.
fn nasty_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(-1)),
        Just(json!(0.5)),
        Just(json!(1e308)),
        Just(json!(-1e308)),
        Just(json!(1e300)),
        Just(json!(1e15)),
        Just(json!(-1e15)),
        Just(json!(5e-324)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(2)),
        (-1e6f64..1e6).prop_map(|x| json!(x)),
    ]
}

/// Any JSON value, numbers drawn from [`nasty_number`], a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        nasty_number(),
        "[a-z_ ]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((field_name(), inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Keys the inputs use, plus a stranger.
fn field_name() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "estimator", "params", "groups", "loss_mask", "rewards", "reward_weights", "scale_rewards", "process", "summary", "total",
        "no_call", "w_process", "w_summary", "norm_by_std", "token_rewards", "step_rewards", "values", "logprobs", "ref_logprobs",
        "gamma", "lam", "kl_coef", "upstream_weighting", "critic_free", "reward", "task", "completion", "messages", "judge_score",
        "requires_tool", "allowed_tools", "gold_tool_calls", "expected_answer", "role", "content", "other",
    ])
    .prop_map(str::to_string)
}

/// A valid request of each estimator.
fn valid_advantages() -> Vec<Value> {
    let m = json!([0, 1, 1, 0, 1]);
    vec![
        json!({"estimator": "grpo", "params": {"scale_rewards": "group"}, "groups": [[{"loss_mask": m, "rewards": [1.0, null]}, {"loss_mask": m, "rewards": [0.0, 1.0]}]]}),
        json!({"estimator": "dr_grpo", "groups": [[{"loss_mask": m, "rewards": [1.0]}, {"loss_mask": m, "rewards": [0.0]}]]}),
        json!({"estimator": "rloo", "params": {"reward_weights": [2.0]}, "groups": [[{"loss_mask": m, "rewards": [1.0]}, {"loss_mask": m, "rewards": [0.0]}, {"loss_mask": m, "rewards": [0.5]}]]}),
        json!({"estimator": "slca", "groups": [[{"loss_mask": m, "process": 1.0, "summary": 0.2, "total": 1.2}, {"loss_mask": m, "process": 0.0, "summary": 0.6, "total": -0.6, "no_call": true}]]}),
        json!({"estimator": "steptool", "params": {"gamma": 0.9, "lam": 0.8}, "groups": [[{"loss_mask": m, "step_rewards": [1.0, 0.5], "values": [0.0, 0.1, 0.2, 0.3, 0.4], "logprobs": [0.0, -1.0, -1.0, 0.0, -2.0], "ref_logprobs": [0.0, -1.5, -1.0, 0.0, -1.0]}]]}),
        json!({"estimator": "steptool", "params": {"critic_free": true, "upstream_weighting": true}, "groups": [[{"loss_mask": m, "step_rewards": [1.0, 0.5]}, {"loss_mask": m, "step_rewards": [0.0, 0.0]}]]}),
    ]
}

/// A valid `launcher reward` request of each reward.
fn valid_rewards() -> Vec<Value> {
    let task = json!({"requires_tool": true, "allowed_tools": ["calculator"],
                      "gold_tool_calls": [[{"name": "calculator", "arguments": {"expression": "17*24"}}]], "expected_answer": "408"});
    let completion = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17*24\"}}\n</tool_call><tool_response>408</tool_response>The answer is 408.";
    ["process", "final_only", "hierr", "steptool"]
        .iter()
        .map(|r| json!({"reward": r, "task": task, "completion": completion, "judge_score": 4}))
        .chain([json!({"reward": "hierr", "task": task, "messages": [{"role": "assistant", "content": completion}]})])
        .collect()
}

/// Every value inside `v`, by path, so that a mutation can pick one.
fn paths(v: &Value, here: Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    out.push(here.clone());
    match v {
        Value::Array(items) => items.iter().enumerate().for_each(|(i, x)| paths(x, [here.clone(), vec![PathStep::Index(i)]].concat(), out)),
        Value::Object(m) => m.iter().for_each(|(k, x)| paths(x, [here.clone(), vec![PathStep::Key(k.clone())]].concat(), out)),
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum PathStep {
    Index(usize),
    Key(String),
}

fn at<'a>(v: &'a mut Value, path: &[PathStep]) -> &'a mut Value {
    path.iter().fold(v, |v, s| match s {
        PathStep::Index(i) => &mut v[*i],
        PathStep::Key(k) => &mut v[k.as_str()],
    })
}

/// One mutation of a value: replace a node, drop it, or duplicate an array element.
#[derive(Clone, Debug)]
enum Mutation {
    Replace(usize, Value),
    Remove(usize),
    Duplicate(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), prop_oneof![nasty_number(), any_json()]).prop_map(|(i, v)| Mutation::Replace(i, v)),
        any::<usize>().prop_map(Mutation::Remove),
        (any::<usize>(), 1usize..40).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
    ]
}

fn mutate(mut v: Value, mutations: &[Mutation]) -> Value {
    for m in mutations {
        let mut all = Vec::new();
        paths(&v, vec![], &mut all);
        let pick = |i: usize| all[i % all.len()].clone();
        match m {
            Mutation::Replace(i, x) => *at(&mut v, &pick(*i)) = x.clone(),
            Mutation::Remove(i) => {
                let p = pick(*i);
                if let Some((last, parent)) = p.split_last() {
                    match (at(&mut v, parent), last) {
                        (Value::Array(a), PathStep::Index(j)) => {
                            a.remove(*j);
                        }
                        (Value::Object(o), PathStep::Key(k)) => {
                            o.remove(k);
                        }
                        _ => {}
                    }
                }
            }
            Mutation::Duplicate(i, n) => {
                if let Value::Array(a) = at(&mut v, &pick(*i)) {
                    if let Some(first) = a.first().cloned() {
                        a.extend(std::iter::repeat_n(first, *n));
                    }
                }
            }
        }
    }
    v
}

/// An `advantages` answer: an output of finite numbers shaped like the groups, or an error naming a field.
fn check_advantages(input: &Value) -> Result<(), TestCaseError> {
    match advantages_json(input) {
        Ok(out) => {
            let groups = input["groups"].as_array().map_or(0, Vec::len);
            prop_assert_eq!(out["advantages"].as_array().map(Vec::len), Some(groups), "{}", out);
            for (key, per_token) in out.as_object().unwrap() {
                for x in per_token.as_array().unwrap().iter().flat_map(|g| g.as_array().unwrap()).flat_map(|r| r.as_array().unwrap()) {
                    prop_assert!(x.as_f64().is_some_and(f64::is_finite), "{key}: {x} in {out}");
                }
            }
        }
        Err(e) => {
            let e = e.to_string();
            prop_assert!(e.contains(": expected") && !e.is_empty(), "{e}");
        }
    }
    Ok(())
}

fn check_reward(line: &str) -> Result<(), TestCaseError> {
    match reward_json_line(line) {
        Ok(out) => prop_assert!(out["total"].as_f64().is_some_and(f64::is_finite), "{out}"),
        Err(e) => prop_assert!(e.to_string().contains("expected") || e.to_string().contains("not valid JSON"), "{e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn advantages_of_mutated_valid_requests(which in 0usize..6, mutations in prop::collection::vec(mutation(), 1..5)) {
        check_advantages(&mutate(valid_advantages()[which].clone(), &mutations))?;
    }

    #[test]
    fn advantages_of_random_json(v in any_json(), estimator in prop::sample::select(vec!["grpo", "dr_grpo", "rloo", "slca", "steptool", "x"])) {
        check_advantages(&v)?;
        check_advantages(&json!({"estimator": estimator, "params": v.clone(), "groups": [[v.clone(), v]]}))?;
    }

    #[test]
    fn reward_of_mutated_valid_requests(which in 0usize..5, mutations in prop::collection::vec(mutation(), 1..5)) {
        check_reward(&mutate(valid_rewards()[which].clone(), &mutations).to_string())?;
    }

    #[test]
    fn reward_of_random_text_and_truncations(v in any_json(), cut in any::<usize>(), junk in "[\\PC]{0,40}") {
        check_reward(&v.to_string())?;
        let line = valid_rewards()[cut % 5].to_string();
        let cut_at = (0..=cut % (line.len() + 1)).rev().find(|&i| line.is_char_boundary(i)).unwrap_or(0);
        check_reward(&format!("{}{junk}", &line[..cut_at]))?;
    }
}
