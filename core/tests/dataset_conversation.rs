//! Warm-up conversations in TRL's SFT format: OpenAI messages with
//! `tool_calls` and `tool` messages, checked, with errors naming the line and field.
use rlmesh_core::dataset::conversation::{parse_messages, parse_sft_jsonl};
use serde_json::json;

fn tool_conversation() -> serde_json::Value {
    json!({"messages": [
        {"role": "system", "content": "You can use tools."},
        {"role": "user", "content": "What is 17 * 24, and 2 + 3?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": "{\"operation\": \"multiply\", \"a\": 17, \"b\": 24}"}},
            {"id": "call_2", "type": "function", "function": {"name": "adder", "arguments": {"a": 2, "b": 3}}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"},
        {"role": "tool", "tool_call_id": "call_1", "content": "408"},
        {"role": "assistant", "content": [{"type": "text", "text": "408 and 5."}]}],
     "tools": [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]})
}

#[test]
fn a_tool_calling_conversation_parses_into_template_messages() {
    let c = &parse_sft_jsonl(&tool_conversation().to_string(), "data/sft.jsonl").unwrap()[0];
    assert_eq!(c.id, "sft.jsonl:1");
    let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "tool", "assistant"]);
    let calls = c.messages[2].tool_calls.as_ref().unwrap();
    assert_eq!(calls[0].function.arguments, json!({"operation": "multiply", "a": 17, "b": 24}), "a JSON string becomes an object");
    assert_eq!(calls[1].function.arguments, json!({"a": 2, "b": 3}));
    assert_eq!(c.messages[2].content, "");
    // Tool messages are named after the call their id answers, whatever the order.
    assert_eq!(c.messages[3].name.as_deref(), Some("adder"));
    assert_eq!(c.messages[4].name.as_deref(), Some("calculator"));
    assert_eq!(c.messages[5].content, "408 and 5.");
    assert_eq!(c.tools.len(), 1);
}

#[test]
fn trl_prompt_completion_conversations_are_joined() {
    let row = json!({"id": "ex-1", "prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "hello"}]});
    let c = &parse_sft_jsonl(&row.to_string(), "sft.jsonl").unwrap()[0];
    assert_eq!((c.id.as_str(), c.messages.len()), ("ex-1", 2));
}

#[test]
fn tool_messages_without_ids_answer_the_calls_in_order() {
    let m = parse_messages(
        &json!([{"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": "{}"}}]},
                {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]),
        "messages",
    )
    .unwrap();
    assert_eq!((m[2].name.as_deref(), m[3].name.as_deref()), (Some("a"), Some("b")));
}

#[test]
fn errors_name_the_line_and_the_field() {
    let good = tool_conversation().to_string();
    let user = json!({"role": "user", "content": "q"});
    let asst = |calls: serde_json::Value| json!({"role": "assistant", "content": null, "tool_calls": calls});
    let call = |f: serde_json::Value| json!([{"id": "c", "type": "function", "function": f}]);
    let cases = [
        (json!({"messages": "hi"}), r#"field "messages": expected a list of messages, got a string ("hi")"#),
        (json!({"messages": []}), r#"field "messages": expected at least one message, got an empty list"#),
        (json!({"messages": [user]}), r#"field "messages": no assistant message, so nothing to learn"#),
        (json!({"message": [user]}), r#"unknown field "message"; did you mean "messages"? (other unknown fields are ignored)"#),
        (json!({"text": "x"}), r#"missing field "messages" (or "prompt" and "completion")"#),
        (json!({"messages": [{"role": "robot", "content": "x"}]}), r#"field "messages"[0].role: expected one of system, user, assistant, tool, got "robot""#),
        (json!({"messages": [{"content": "x"}]}), r#"field "messages"[0]: missing "role""#),
        (json!({"messages": [user, {"role": "system", "content": "late"}]}), r#"field "messages"[1]: a system message may only come first"#),
        (json!({"messages": [{"role": "user", "content": 5}]}), r#"field "messages"[0].content: expected a string, null or a list of text parts, got an integer (5)"#),
        (json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}), r#"field "messages"[0].content: [0]: expected a text part {"type": "text", "text": …}, got an object"#),
        (json!({"messages": [user, {"role": "assistant", "content": null}]}), r#"field "messages"[1]: an assistant message needs "content" or "tool_calls""#),
        (json!({"messages": [user, {"role": "assistant", "tool_call": []}]}), r#"field "messages"[1]: unknown key "tool_call"; did you mean "tool_calls"?"#),
        (json!({"messages": [{"role": "user", "content": "q", "tool_calls": []}]}), r#"field "messages"[0].tool_calls: only an assistant message may call tools"#),
        (json!({"messages": [user, asst(json!({"name": "f"}))]}), r#"field "messages"[1].tool_calls: expected a list of calls, got an object"#),
        (json!({"messages": [user, asst(json!([{"type": "function", "name": "f", "arguments": {}}]))]}), r#"field "messages"[1].tool_calls[0]: missing "function" (a call is {"id", "type": "function", "function": {"name", "arguments"}})"#),
        (json!({"messages": [user, asst(json!([{"type": "tool", "function": {"name": "f", "arguments": {}}}]))]}), r#"field "messages"[1].tool_calls[0].type: expected "function", got a string ("tool")"#),
        (json!({"messages": [user, asst(call(json!({"arguments": {}})))]}), r#"field "messages"[1].tool_calls[0].function: missing "name""#),
        (json!({"messages": [user, asst(call(json!({"name": "f"})))]}), r#"field "messages"[1].tool_calls[0].function: missing "arguments""#),
        (json!({"messages": [user, asst(call(json!({"name": "f", "arguments": "{oops"})))]}), r#"field "messages"[1].tool_calls[0].function.arguments: the string is not JSON (key must be a string at line 1 column 2)"#),
        (json!({"messages": [user, asst(call(json!({"name": "f", "arguments": "[1]"})))]}), r#"field "messages"[1].tool_calls[0].function.arguments: the string holds an array, not a JSON object"#),
        (json!({"messages": [user, asst(call(json!({"name": "f", "arguments": 3})))]}), r#"field "messages"[1].tool_calls[0].function.arguments: expected a JSON object or a string holding one, got an integer (3)"#),
        (json!({"messages": [user, {"role": "tool", "content": "5"}]}), r#"field "messages"[1]: a tool message must answer a call of the assistant message before it (0 call(s), all answered)"#),
        (json!({"messages": [user, asst(call(json!({"name": "f", "arguments": {}}))), {"role": "tool", "tool_call_id": "zz", "content": "5"}]}), r#"field "messages"[2].tool_call_id: "zz" names no call of the assistant message before it"#),
        (json!({"messages": [user, asst(call(json!({"name": "f", "arguments": {}}))), {"role": "tool", "tool_call_id": "c"}]}), r#"field "messages"[2]: missing "content" (the tool's result)"#),
        (json!({"messages": [user, {"role": "assistant", "content": "a"}], "tools": {"name": "f"}}), r#"field "tools": expected a list of function schemas, got an object"#),
        (json!({"id": "sft.jsonl:1", "messages": [user, {"role": "assistant", "content": "a"}]}), r#"field "id": "sft.jsonl:1" is already used on line 1"#),
    ];
    for (bad, message) in cases {
        let text = format!("{good}\n\n{bad}\n{good}\n");
        let e = parse_sft_jsonl(&text, "sft.jsonl").unwrap_err();
        assert_eq!(e.to_string(), format!("sft.jsonl:3: {message}"), "{bad}");
    }
}
