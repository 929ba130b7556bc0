//! Task files: rows in rlmesh's own shape and in TRL's, verl's and verifiers'
//! shapes through `[tasks.columns]`, ids from the file, the inference of
//! `requires_tool`, the held-out split, and errors that name the file, line and field.
use rlmesh_core::dataset::task_file::{parse_jsonl_with, split_off, task_from_row};
use rlmesh_core::dataset::{
    generate, load_task_file, load_tasks, parse_jsonl, task_row, to_jsonl, Columns, DatasetError, MixConfig, TaskFiles,
};
use serde_json::json;

#[test]
fn generated_tasks_round_trip_through_jsonl() {
    let tasks = generate(&MixConfig { size: 200, ..MixConfig::default() }).unwrap();
    assert_eq!(parse_jsonl(&to_jsonl(&tasks), "mix.jsonl").unwrap(), tasks);
}

#[test]
fn a_row_without_an_id_gets_the_file_name_and_line() {
    let text = "\n{\"prompt\": \"Reply with exactly: hello\", \"requires_tool\": false}\n";
    let tasks = parse_jsonl(text, "data/tasks.jsonl").unwrap();
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].id, "tasks.jsonl:2");
    assert!(!tasks[0].requires_tool);
}

#[test]
fn a_full_tool_task_line_in_todays_shape_loads() {
    let line = r#"{"id": "m1", "prompt": "Use the calculator to compute 17 * 24.", "requires_tool": true, "allowed_tools": ["calculator"], "gold_tool_calls": [[{"name": "calculator", "arguments": {"operation": "multiply", "a": 17, "b": 24}}]], "expected_answer": "408"}"#;
    let t = &parse_jsonl(line, "t.jsonl").unwrap()[0];
    assert_eq!(t.gold_tool_calls[0][0].arguments["b"], 24);
    assert_eq!(t.expected_answer.as_deref(), Some("408"));
    assert_eq!(t.allowed_tools, ["calculator"]);
}

#[test]
fn the_new_fields_load_and_a_tool_task_needs_no_gold_calls() {
    let line = json!({
        "prompt": [{"role": "system", "content": "You manage files."}, {"role": "user", "content": "Delete b.txt."}],
        "answer": "done", "tools": ["delete_file", {"type": "function", "function": {"name": "list_files"}}],
        "env_state": {"files": ["a.txt", "b.txt"]}, "info": {"expect_deleted": ["b.txt"]},
    });
    let t = &parse_jsonl(&line.to_string(), "files.jsonl").unwrap()[0];
    assert_eq!(t.prompt, "Delete b.txt.");
    assert_eq!(t.messages.len(), 2);
    assert_eq!(t.messages[0].role, "system");
    assert_eq!(t.allowed_tools, ["delete_file", "list_files"]);
    assert!(t.requires_tool && t.gold_tool_calls.is_empty());
    assert_eq!(t.env_state, Some(json!({"files": ["a.txt", "b.txt"]})));
    assert_eq!(t.info, Some(json!({"expect_deleted": ["b.txt"]})));
    assert_eq!(t.environment, None);
    // What a verifier receives reads back as the same task.
    let row = task_row(t);
    assert_eq!(row["answer"], "done");
    assert_eq!(&task_from_row(row.as_object().unwrap(), &Columns::default(), "x", "field").unwrap(), t);
}

#[test]
fn requires_tool_is_inferred_by_the_documented_rule() {
    let infer = |row: serde_json::Value| parse_jsonl(&row.to_string(), "t.jsonl").unwrap()[0].requires_tool;
    // Gold calls: a tool task.
    assert!(infer(json!({"prompt": "p", "gold_tool_calls": [[{"name": "f"}]]})));
    // An empty list of tools: no tool can be called.
    assert!(!infer(json!({"prompt": "p", "tools": []})));
    // Otherwise (tools absent, or listed): a tool task.
    assert!(infer(json!({"prompt": "p"})));
    assert!(infer(json!({"prompt": "p", "tools": ["f"]})));
    // Said outright, it wins.
    assert!(!infer(json!({"prompt": "p", "requires_tool": false})));
}

#[test]
fn a_single_user_message_prompt_is_its_text_and_trailing_assistant_turns_are_cut() {
    let t = &parse_jsonl(&json!({"prompt": [{"role": "user", "content": "hi"}]}).to_string(), "t.jsonl").unwrap()[0];
    assert_eq!((t.prompt.as_str(), t.messages.len()), ("hi", 0));
    // TRL's conversational `messages`: prompt and answer from the same column.
    let columns = Columns::new([("prompt", "messages"), ("answer", "messages")]).unwrap();
    let row = json!({"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris"}]});
    let t = &parse_jsonl_with(&row.to_string(), "trl.jsonl", &columns).unwrap()[0];
    assert_eq!(t.prompt, "Capital of France?");
    assert_eq!(t.messages.len(), 2);
    assert_eq!(t.expected_answer.as_deref(), Some("Paris"));
}

#[test]
fn trl_prompt_completion_rows_load_unchanged() {
    let text = [
        json!({"prompt": "What is 2 + 2?", "completion": "4"}),
        json!({"prompt": [{"role": "user", "content": "What is 3 + 3?"}], "completion": [{"role": "assistant", "content": "6"}]}),
    ]
    .map(|r| r.to_string())
    .join("\n");
    let tasks = parse_jsonl(&text, "trl.jsonl").unwrap();
    assert_eq!(tasks[1].prompt, "What is 3 + 3?");
    assert_eq!(tasks[0].expected_answer, None, "the completion is not the answer unless mapped");
    let graded = parse_jsonl_with(&text, "trl.jsonl", &Columns::new([("answer", "completion")]).unwrap()).unwrap();
    assert_eq!(graded.iter().map(|t| t.expected_answer.clone().unwrap()).collect::<Vec<_>>(), ["4", "6"]);
}

#[test]
fn verifiers_and_dotted_columns_map_onto_fields() {
    let columns = Columns::new([("prompt", "question"), ("answer", "reward_model.ground_truth"), ("info", "extra_info"), ("id", "extra_info.index")]).unwrap();
    let row = json!({"question": "1 + 1?", "reward_model": {"style": "rule", "ground_truth": 2}, "extra_info": {"index": 7, "split": "train"}, "data_source": "gsm8k"});
    let t = &parse_jsonl_with(&row.to_string(), "v.jsonl", &columns).unwrap()[0];
    assert_eq!((t.id.as_str(), t.prompt.as_str(), t.expected_answer.as_deref()), ("7", "1 + 1?", Some("2")));
    assert_eq!(t.info.as_ref().unwrap()["split"], "train");
    let e = Columns::new([("promt", "question")]).unwrap_err().to_string();
    assert!(e.starts_with("[tasks.columns]: unknown field \"promt\""), "{e}");
}

#[test]
fn held_out_rows_are_chosen_with_the_seed_and_never_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train.jsonl");
    let text: String = (0..50).map(|i| format!("{{\"prompt\": \"task {i}\"}}\n")).collect();
    std::fs::write(&file, text).unwrap();
    let spec = TaskFiles { held_out: 10, ..TaskFiles::new(&file) };
    let a = load_tasks(&spec, 7).unwrap();
    assert_eq!((a.train.len(), a.held_out.len()), (40, 10));
    assert_eq!(a, load_tasks(&spec, 7).unwrap(), "same seed, same split");
    assert_ne!(a.held_out, load_tasks(&spec, 8).unwrap().held_out, "another seed, another split");
    let ids = |ts: &[rlmesh_core::Task]| ts.iter().map(|t| t.id.clone()).collect::<std::collections::HashSet<_>>();
    assert!(ids(&a.train).is_disjoint(&ids(&a.held_out)));
    assert!(a.train.windows(2).all(|w| w[0].id < w[1].id || w[0].id.len() < w[1].id.len()), "file order kept");
    // A held-out file instead; an id in both files is refused.
    let held = dir.path().join("test.jsonl");
    std::fs::write(&held, "{\"prompt\": \"other\"}\n{\"id\": \"train.jsonl:3\", \"prompt\": \"dup\"}\n").unwrap();
    let spec = TaskFiles { held_out_file: Some(held.clone()), ..TaskFiles::new(&file) };
    let e = load_tasks(&spec, 0).unwrap_err().to_string();
    assert_eq!(e, format!("{}: task id \"train.jsonl:3\" is also in {}; ids must be unique", held.display(), file.display()));
    let e = load_tasks(&TaskFiles { held_out: 50, ..TaskFiles::new(&file) }, 0).unwrap_err().to_string();
    assert!(e.contains("held_out = 50 leaves no training task"), "{e}");
    let (rest, out) = split_off(a.train.clone(), 0, 1);
    assert_eq!((rest.len(), out.len()), (40, 0));
}

#[test]
fn errors_name_the_line_and_the_field() {
    let good = r#"{"prompt": "Reply with exactly: hello", "requires_tool": false}"#;
    let cases = [
        (r#"{"prompt": "x", "requires_tool": "yes"}"#, r#"field "requires_tool": expected a boolean, got a string ("yes")"#),
        (r#"{"requires_tool": false}"#, r#"missing field "prompt" (the prompt)"#),
        (r#"{"prompt": 3, "requires_tool": false}"#, r#"field "prompt": expected a string or a list of messages, got an integer (3)"#),
        (r#"{"prompt": "x", "requires_tools": true}"#, r#"unknown field "requires_tools"; did you mean "requires_tool"? (other unknown fields are ignored)"#),
        (r#"{"prompt": "x", "allowed_tools": ["calculator", 7]}"#, r#"field "allowed_tools"[1]: expected a tool name, got an integer (7)"#),
        (r#"{"prompt": "x", "tools": ["a"], "allowed_tools": ["b"]}"#, r#"fields "tools" and "allowed_tools" are both given; keep one"#),
        (r#"{"prompt": "x", "gold_tool_calls": [{"name": "calculator"}]}"#, r#"field "gold_tool_calls"[0]: expected a list of calls, got an object"#),
        (r#"{"prompt": "x", "gold_tool_calls": [[{"name": "calculator", "arguments": [1]}]]}"#, r#"field "gold_tool_calls"[0][0].arguments: expected an object, got an array"#),
        (r#"{"prompt": "x", "gold_tool_calls": [[{"arguments": {}}]]}"#, r#"field "gold_tool_calls"[0][0]: missing "name""#),
        (r#"{"prompt": "x", "allowed_tools": ["calculator"], "gold_tool_calls": [[{"name": "search", "arguments": {}}]]}"#, r#"field "gold_tool_calls"[0][0].name: "search" is not in the task's tools"#),
        (r#"{"prompt": "x", "gold_tool_calls": [[]]}"#, r#"field "gold_tool_calls"[0]: a step needs at least one call"#),
        (r#"{"prompt": "x", "requires_tool": false, "gold_tool_calls": [[{"name": "calculator"}]]}"#, r#"field "gold_tool_calls": a task with "requires_tool": false must not expect calls"#),
        (r#"{"prompt": "x", "requires_tool": true, "tools": []}"#, r#"field "requires_tool": true, but the task's tools are an empty list"#),
        (r#"{"prompt": " ", "requires_tool": false}"#, r#"field "prompt": must not be empty"#),
        (r#"{"prompt": [{"role": "assistant", "content": "hi"}]}"#, r#"field "prompt": no user message"#),
        (r#"{"prompt": [{"role": "users", "content": "hi"}]}"#, r#"field "prompt"[0].role: expected one of system, user, assistant, tool, got "users""#),
        (r#"{"prompt": "x", "expected_answer": {"a": 1}}"#, r#"field "expected_answer": expected a string, a number or a list of messages, got an object"#),
        (r#"{"id": "tasks.jsonl:1", "prompt": "x", "requires_tool": false}"#, r#"field "id": "tasks.jsonl:1" is already used on line 1"#),
        (r#"["prompt"]"#, "expected a JSON object (one row per line), got an array"),
        (r#"{"prompt": "x", "requires_tool": false"#, "invalid JSON: EOF while parsing an object at line 1 column 38"),
    ];
    for (bad, message) in cases {
        let text = format!("{good}\n\n{bad}\n{good}\n");
        let e = parse_jsonl(&text, "tasks.jsonl").unwrap_err();
        assert_eq!(e.to_string(), format!("tasks.jsonl:3: {message}"), "{bad}");
        assert!(matches!(e, DatasetError::Line { line: 3, .. }));
    }
    // A mapped column that a row lacks names the column, the field and what the row has.
    let e = parse_jsonl_with("{\"q\": \"x\"}", "v.jsonl", &Columns::new([("prompt", "question")]).unwrap()).unwrap_err();
    assert_eq!(e.to_string(), "v.jsonl:1: missing field \"question\" (prompt, from [tasks.columns]); the row has: q");
}

#[test]
fn a_missing_file_names_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.jsonl");
    let e = load_task_file(&missing).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: ", missing.display())), "{e}");
}
