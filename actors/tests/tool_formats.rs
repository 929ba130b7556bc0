//! Each tool-call format's parser reads back the calls its template writes: an
//! assistant turn with two calls, rendered by the format's chat template
//! (`model/templates/`), parses into the same calls and arguments.
use rlmesh_core::tools::{calculator, ToolFormat};
use rlmesh_model::tokenizer::render_template;
use serde_json::json;
use std::path::Path;

fn template(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/templates").join(name)).unwrap()
}

#[test]
fn every_format_parses_the_calls_its_template_renders() {
    let tools = [calculator::tool()];
    let schemas: Vec<_> = tools.iter().map(|t| t.spec.json_schema()).collect();
    let calls = [json!({"operation": "add", "a": 17, "b": 25}), json!({"operation": "power", "a": 2.5, "b": 3})];
    let user = json!({"role": "user", "content": "Add 17 and 25, then raise 2.5 to 3."});
    let assistant = json!({
        "role": "assistant", "content": "",
        "tool_calls": calls.iter().map(|a| json!({"type": "function", "function": {"name": "calculator", "arguments": a}})).collect::<Vec<_>>()
    });
    for (format, file, end) in [
        (ToolFormat::Hermes, "qwen2.5-tools.jinja", "<|im_end|>\n"),
        (ToolFormat::Llama3Json, "llama3-json-tools.jinja", "<|eot_id|>"),
        (ToolFormat::Mistral, "mistral-tools.jinja", "</s>"),
    ] {
        let source = template(file);
        let ctx = |messages: Vec<serde_json::Value>, generation: bool| {
            json!({"messages": messages, "tools": schemas, "add_generation_prompt": generation, "bos_token": "", "eos_token": "</s>"})
        };
        let prompt = render_template(&source, &ctx(vec![user.clone()], true)).unwrap();
        assert!(prompt.contains("\"calculator\""), "{file}: the prompt shows the tool");
        let whole = render_template(&source, &ctx(vec![user.clone(), assistant.clone()], false)).unwrap();
        let turn = whole.strip_prefix(prompt.as_str()).unwrap_or_else(|| panic!("{file}: not prefix-preserving"));
        let turn = turn.strip_suffix(end).unwrap_or_else(|| panic!("{file}: the turn {turn:?} does not end with {end:?}"));
        let parsed = format.parse(turn, &tools);
        assert_eq!(parsed.calls.len(), 2, "{file}: {turn:?}");
        for (c, want) in parsed.calls.iter().zip(&calls) {
            assert!(c.error.is_none(), "{file}: {:?}", c.error);
            assert_eq!((&c.name[..], &c.arguments), ("calculator", want), "{file}");
        }
        // And a plain reply is no call in any format.
        assert!(format.parse("The answer is 42.", &tools).calls.is_empty());
    }
}
