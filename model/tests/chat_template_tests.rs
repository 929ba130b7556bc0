//! Chat templates rendered by minijinja against transformers' `apply_chat_template`
//! (jinja2) on the same template: text and token ids identical, tools included.
mod common;

use common::*;
use rlmesh_model::Tokenizer;
use serde_json::{json, Value};

fn calculator_schema() -> Value {
    json!({"type": "function", "function": {"name": "calculator", "description": "Evaluate a <binary> operation & return \"the\" result.",
        "parameters": {"type": "object", "properties": {
            "operation": {"type": "string", "enum": ["add", "subtract", "multiply", "divide", "power"], "description": "Which operation"},
            "a": {"type": "number", "description": "First operand"},
            "b": {"type": "number", "description": "Second operand"}},
            "required": ["operation", "a", "b"]}}})
}

fn conversations() -> Vec<Value> {
    let calls = json!([
        {"type": "function", "function": {"name": "calculator", "arguments": {"operation": "multiply", "a": 17, "b": 24}}},
        {"type": "function", "function": {"name": "calculator", "arguments": {"operation": "divide", "a": 1.5, "b": 1e-5, "note": "<&> \"q\" ünï 😀"}}}
    ]);
    vec![
        json!({"messages": [{"role": "user", "content": "Reply with exactly: hello"}], "add_generation_prompt": true}),
        json!({"messages": [{"role": "system", "content": "Be brief & exact <always>."}, {"role": "user", "content": "Use the calculator to compute 17 * 24."}],
               "tools": [calculator_schema()], "add_generation_prompt": true}),
        json!({"messages": [
            {"role": "user", "content": "Compute 17*24 and 1.5/0.00001 — «quickly»"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "name": "calculator", "content": "408"},
            {"role": "tool", "name": "calculator", "content": "{\"error\": \"x < 0 & y > 1\"}"},
            {"role": "assistant", "content": "17 × 24 = 408 and 1.5/1e-5 = 150000.0"}],
            "tools": [calculator_schema()], "add_generation_prompt": false}),
        json!({"messages": [
            {"role": "user", "content": "multi\nline\ttabs 'quotes' \"dq\""},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [calls[0].clone()]},
            {"role": "tool", "name": "calculator", "content": "408"},
            {"role": "user", "content": "thanks"}],
            "tools": [calculator_schema()], "add_generation_prompt": true}),
    ]
}

fn check(model_dir: &std::path::Path, requests: &[Value]) {
    let tok = Tokenizer::load(model_dir).unwrap();
    let theirs = oracle(&["render", "--model", &model_dir.display().to_string()], &json!({ "requests": requests }));
    for (i, (req, want)) in requests.iter().zip(theirs["results"].as_array().unwrap()).enumerate() {
        let msgs = req["messages"].as_array().unwrap();
        let tools = req.get("tools").and_then(Value::as_array).map(|t| t.as_slice());
        let (text, ids) = tok.render_ids(msgs, tools, req["add_generation_prompt"].as_bool().unwrap()).unwrap();
        assert_eq!(text, want["text"].as_str().unwrap(), "conversation {i}: text differs");
        let want_ids: Vec<u32> = serde_json::from_value(want["token_ids"].clone()).unwrap();
        assert_eq!(ids, want_ids, "conversation {i}: token ids differ");
    }
}

#[test]
fn qwen_tool_template_matches_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "qwen2", true, true, 1, &["--layers", "1"]);
    check(&m, &conversations());
}

#[test]
fn smollm2_own_template_matches_transformers() {
    // SmolLM2's template has no tool support; plain conversations only.
    let reqs: Vec<Value> = conversations().into_iter().filter(|c| c.get("tools").is_none()).collect();
    let mut reqs = reqs;
    reqs.push(json!({"messages": [{"role": "system", "content": "sys & <x>"}, {"role": "user", "content": "héllo"}, {"role": "assistant", "content": "hi"}], "add_generation_prompt": false}));
    check(&smollm2(), &reqs);
}

/// A template fit for tool rollouts passes the check; SmolLM2's own (no tools), one that
/// drops earlier turns' content, and one without an end-of-turn token are refused with the reason.
#[test]
fn tool_templates_are_checked_before_a_run() {
    use rlmesh_model::template::{check_tool_template, TemplateProblem};
    let smol = smollm2();
    let mut tok = rlmesh_model::Tokenizer::load(&smol).unwrap();
    match check_tool_template(&tok) {
        Err(TemplateProblem::NoTools(name)) => assert_eq!(name, "rlmesh_probe_lookup"),
        other => panic!("SmolLM2's own template renders no tools: {other:?}"),
    }
    let qwen = std::fs::read_to_string(repo().join("model/templates/qwen2.5-tools.jinja")).unwrap();
    tok.set_chat_template(qwen.clone());
    check_tool_template(&tok).unwrap();
    // Earlier assistant turns shown without their tool calls once a later turn exists.
    let rewriting = qwen.replace("{%- for tool_call in message.tool_calls %}", "{%- for tool_call in (message.tool_calls if loop.last else []) %}");
    assert_ne!(rewriting, qwen);
    tok.set_chat_template(rewriting);
    let e = check_tool_template(&tok).unwrap_err();
    assert!(matches!(e, TemplateProblem::NotPrefix { added: "a tool result", .. }), "{e}");
    assert!(e.to_string().contains("not prefix-preserving"), "{e}");
    // Assistant turns that end without the model's stop token.
    tok.set_chat_template(qwen.replace("{{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}", "{{- '\\n' }}\n    {%- elif message.role == \"tool\" %}"));
    let e = check_tool_template(&tok).unwrap_err();
    assert!(matches!(e, TemplateProblem::NoEndOfTurn(_)), "{e}");
}
