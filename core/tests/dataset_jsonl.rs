//! The JSONL task format: round trips, the seed's own lines, and errors that
//! name the file, line and field.
use rlmesh_core::dataset::{generate, load_jsonl, parse_jsonl, to_jsonl, DatasetError, MixConfig};

#[test]
fn generated_tasks_round_trip_through_jsonl() {
    let tasks = generate(&MixConfig { size: 200, ..MixConfig::default() }).unwrap();
    assert_eq!(parse_jsonl(&to_jsonl(&tasks), "mix.jsonl").unwrap(), tasks);
}

#[test]
fn the_seed_no_tool_line_loads_with_a_line_id() {
    let text = "\n{\"prompt\": \"Reply with exactly: hello\", \"requires_tool\": false}\n";
    let tasks = parse_jsonl(text, "data/tasks.jsonl").unwrap();
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].id, "tasks-2");
    assert!(!tasks[0].requires_tool);
}

#[test]
fn a_full_tool_task_line_loads() {
    let line = r#"{"id": "m1", "prompt": "Use the calculator to compute 17 * 24.", "requires_tool": true, "allowed_tools": ["calculator"], "gold_tool_calls": [[{"name": "calculator", "arguments": {"operation": "multiply", "a": 17, "b": 24}}]], "expected_answer": "408"}"#;
    let t = &parse_jsonl(line, "t.jsonl").unwrap()[0];
    assert_eq!(t.gold_tool_calls[0][0].arguments["b"], 24);
    assert_eq!(t.expected_answer.as_deref(), Some("408"));
}

#[test]
fn errors_name_the_line_and_the_field() {
    let good = r#"{"prompt": "Reply with exactly: hello", "requires_tool": false}"#;
    let cases = [
        (r#"{"prompt": "x", "requires_tool": "yes"}"#, r#"field "requires_tool": expected a boolean, got a string ("yes")"#),
        (r#"{"prompt": "x"}"#, r#"missing field "requires_tool""#),
        (r#"{"prompt": 3, "requires_tool": false}"#, r#"field "prompt": expected a string, got an integer (3)"#),
        (r#"{"prompt": "x", "requires_tool": false, "requires_tools": true}"#, r#"unknown field "requires_tools" (expected one of: id, prompt, requires_tool, allowed_tools, gold_tool_calls, expected_answer, environment, env_state)"#),
        (r#"{"prompt": "x", "requires_tool": true, "allowed_tools": ["calculator", 7]}"#, r#"field "allowed_tools"[1]: expected a string, got an integer (7)"#),
        (r#"{"prompt": "x", "requires_tool": true, "gold_tool_calls": [{"name": "calculator"}]}"#, r#"field "gold_tool_calls"[0]: expected a list of calls, got an object"#),
        (r#"{"prompt": "x", "requires_tool": true, "gold_tool_calls": [[{"name": "calculator", "arguments": [1]}]]}"#, r#"field "gold_tool_calls"[0][0].arguments: expected an object, got an array"#),
        (r#"{"prompt": "x", "requires_tool": true, "gold_tool_calls": [[{"arguments": {}}]]}"#, r#"field "gold_tool_calls"[0][0]: missing "name""#),
        (r#"{"prompt": "x", "requires_tool": true}"#, r#"field "allowed_tools": a task with "requires_tool": true needs at least one allowed tool"#),
        (r#"{"prompt": "x", "requires_tool": true, "allowed_tools": ["calculator"]}"#, r#"field "gold_tool_calls": a task with "requires_tool": true needs its expected calls (a list of steps)"#),
        (r#"{"prompt": "x", "requires_tool": true, "allowed_tools": ["calculator"], "gold_tool_calls": [[{"name": "search", "arguments": {}}]]}"#, r#"field "gold_tool_calls"[0][0].name: "search" is not in "allowed_tools""#),
        (r#"{"prompt": "x", "requires_tool": true, "allowed_tools": ["calculator"], "gold_tool_calls": [[]]}"#, r#"field "gold_tool_calls"[0]: a step needs at least one call"#),
        (r#"{"prompt": "x", "requires_tool": false, "gold_tool_calls": [[{"name": "calculator"}]]}"#, r#"field "gold_tool_calls": a task with "requires_tool": false must not expect calls"#),
        (r#"{"prompt": " ", "requires_tool": false}"#, r#"field "prompt": must not be empty"#),
        (r#"{"prompt": "x", "requires_tool": false, "env_state": {}}"#, r#"field "env_state": given without "environment""#),
        (r#"{"prompt": "x", "requires_tool": false, "expected_answer": 408}"#, r#"field "expected_answer": expected a string or null, got an integer (408)"#),
        (r#"{"id": "tasks-1", "prompt": "x", "requires_tool": false}"#, r#"field "id": "tasks-1" is already used on line 1"#),
        (r#"["prompt"]"#, "expected a JSON object (one task per line), got an array"),
        (r#"{"prompt": "x", "requires_tool": false"#, "invalid JSON: EOF while parsing an object at line 1 column 38"),
    ];
    for (bad, message) in cases {
        let text = format!("{good}\n\n{bad}\n{good}\n");
        let e = parse_jsonl(&text, "tasks.jsonl").unwrap_err();
        assert_eq!(e.to_string(), format!("tasks.jsonl:3: {message}"), "{bad}");
        assert!(matches!(e, DatasetError::Line { line: 3, .. }));
    }
}

#[test]
fn files_load_and_a_missing_file_names_its_path() {
    let dir = std::env::temp_dir().join(format!("rlmesh-dataset-jsonl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("seed.jsonl");
    std::fs::write(&path, "{\"prompt\": \"Reply with exactly: hello\", \"requires_tool\": false}\n").unwrap();
    assert_eq!(load_jsonl(&path).unwrap()[0].id, "seed-1");
    let missing = dir.join("missing.jsonl");
    let e = load_jsonl(&missing).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: ", missing.display())), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
