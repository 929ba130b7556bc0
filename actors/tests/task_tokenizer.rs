//! The task tokenizer the embedded default learns: digits are single tokens,
//! the fixed template text collapses to a few tokens, any text round-trips,
//! training is deterministic, and transformers reads the files to the same
//! chat-template text and the same token ids (the oracle).
use rlmesh_actors::controller::init::{build_task_tokenizer, TASK_SPECIAL_TOKENS, TASK_TAG_TOKENS};
use rlmesh_core::dataset::{generate, MixConfig};
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_core::{Message, ToolCallMsg};
use rlmesh_model::Tokenizer;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn build(dir: &Path, vocab: usize) -> Tokenizer {
    build_chunked(dir, vocab, 3)
}

fn build_chunked(dir: &Path, vocab: usize, digits: u32) -> Tokenizer {
    let tasks = generate(&MixConfig { size: 300, tool_fraction: 0.5, multi_step_fraction: 0.0, inventory: false, three_step_fraction: 0.0, seed: 3, drill_words: false }).unwrap();
    let reg = ToolRegistry::from_names(&["calculator"], ExecLimits::default()).unwrap();
    build_task_tokenizer(dir, &tasks, &reg, vocab, digits).unwrap();
    Tokenizer::load(dir).unwrap()
}

fn calculator_schema() -> Vec<Value> {
    let reg = ToolRegistry::from_names(&["calculator"], ExecLimits::default()).unwrap();
    let task = generate(&MixConfig { size: 2, tool_fraction: 1.0, multi_step_fraction: 0.0, inventory: false, three_step_fraction: 0.0, seed: 0, drill_words: false }).unwrap().remove(0);
    reg.session(&task).unwrap().schemas()
}

fn conversation() -> Vec<Value> {
    let mut call = Message::assistant("");
    call.tool_calls = Some(vec![ToolCallMsg::new("calculator", json!({"operation": "multiply", "a": 731, "b": 48.5}))]);
    [
        Message::user("Use the calculator to multiply 731 by 48.5."),
        call,
        Message::tool("calculator", "35453.5"),
        Message::assistant("The answer is 35453.5."),
        Message::user("Now say «ünïcode» & <tags> \"quoted\" 🙂 and nothing else."),
    ]
    .iter()
    .map(|m| serde_json::to_value(m).unwrap())
    .collect()
}

#[test]
fn numbers_are_three_digit_chunks_and_the_fixed_text_collapses() {
    let dir = tempfile::tempdir().unwrap();
    let tok = build(dir.path(), 1024);
    // The learned 1024, plus the 1,110 strings of one to three digits the training did not already make tokens.
    assert!((1024 + 1000..=1024 + 1110).contains(&tok.vocab_size()), "{}", tok.vocab_size());
    for chunk in ["0", "7", "00", "42", "000", "999", "075"] {
        assert_eq!(tok.encode(chunk).unwrap().len(), 1, "{chunk}");
    }
    for (i, t) in TASK_SPECIAL_TOKENS.iter().enumerate() {
        assert_eq!(tok.token_to_id(t), Some(i as u32), "{t}");
    }
    for t in TASK_TAG_TOKENS {
        assert_eq!(tok.encode(t).unwrap().len(), 1, "{t}");
    }
    assert_eq!(tok.stop_token_ids(), &[2]);
    let pieces = |text: &str| -> Vec<String> { tok.encode(text).unwrap().iter().map(|&i| tok.decode(&[i], false).unwrap()).collect() };
    assert_eq!(pieces("x=9081726354").last_chunk::<4>().unwrap(), &["908", "172", "635", "4"]);
    assert_eq!(pieces("-0.2571428571"), ["-", "0", ".", "257", "142", "857", "1"]);
    assert_eq!(pieces("75922"), ["759", "22"]);
    // The system prompt with the calculator's schema (about 950 characters) is a handful of tokens.
    let (text, ids) = tok.render_ids(&[json!({"role": "user", "content": "hi"})], Some(&calculator_schema()), true).unwrap();
    assert!(text.len() > 900, "{}", text.len());
    assert!(ids.len() < 24, "{} tokens: {:?}", ids.len(), ids);
}

#[test]
fn numbers_split_into_chunks_of_the_recipes_width() {
    for (digits, want) in [(1u32, vec!["7", "5", "9", "2", "2"]), (2, vec!["75", "92", "2"])] {
        let dir = tempfile::tempdir().unwrap();
        let tok = build_chunked(dir.path(), 600, digits);
        let pieces: Vec<String> = tok.encode("75922").unwrap().iter().map(|&i| tok.decode(&[i], false).unwrap()).collect();
        assert_eq!(pieces, want, "{digits}-digit chunks");
        // Every string of 1..=digits digits is a token; a longer one is not.
        let all = (1..=digits).all(|w| (0..10u32.pow(w)).all(|n| tok.token_to_id(&format!("{n:0w$}", w = w as usize)).is_some()));
        assert!(all, "{digits}-digit chunks missing");
        assert!(tok.encode("375").unwrap().len() > 1);
        assert_eq!(tok.decode(&tok.encode("x = -0.2571428571.").unwrap(), false).unwrap(), "x = -0.2571428571.");
    }
    let dir = tempfile::tempdir().unwrap();
    let tasks = generate(&MixConfig { size: 10, tool_fraction: 0.5, multi_step_fraction: 0.0, inventory: false, three_step_fraction: 0.0, seed: 3, drill_words: false }).unwrap();
    let reg = ToolRegistry::from_names(&["calculator"], ExecLimits::default()).unwrap();
    let e = build_task_tokenizer(dir.path(), &tasks, &reg, 600, 4).unwrap_err().to_string();
    assert!(e.contains("number chunks of 1 to 3 digits, got 4"), "{e}");
}

#[test]
fn any_text_round_trips_and_training_is_deterministic() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let tok = build(a.path(), 600);
    build(b.path(), 600);
    let read = |d: &Path| std::fs::read(d.join("tokenizer.json")).unwrap();
    assert!(read(a.path()) == read(b.path()), "two trainings on the same tasks differ");
    for text in ["", "plain", "«ünïcode» 🙂 \u{0} \t\r\n", "<tool_call>\n{\"a\": -0.5e-7}\n</tool_call><|im_end|>", "ZZZ~~~^^^"] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
}

#[test]
fn transformers_reads_the_same_template_text_and_ids() {
    let dir = tempfile::tempdir().unwrap();
    let tok = build(dir.path(), 700);
    let tools = calculator_schema();
    let msgs = conversation();
    let mut requests = vec![];
    let mut ours = vec![];
    for (n, gen) in [(1, true), (3, true), (4, false), (5, true)] {
        requests.push(json!({"messages": &msgs[..n], "tools": tools, "add_generation_prompt": gen}));
        ours.push(tok.render_ids(&msgs[..n], Some(&tools), gen).unwrap());
    }
    requests.push(json!({"messages": &msgs[..1], "add_generation_prompt": true}));
    ours.push(tok.render_ids(&msgs[..1], None, true).unwrap());
    let input = json!({ "requests": requests });
    let mut child = Command::new(repo().join("scripts/py"))
        .arg(repo().join("tests/oracle/hf_oracle.py"))
        .args(["render", "--model", dir.path().to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "oracle failed: {}", String::from_utf8_lossy(&out.stderr));
    let theirs: Value = serde_json::from_slice(out.stdout.rsplit(|&b| b == b'\n').find(|l| !l.is_empty()).unwrap()).unwrap();
    for (i, ((text, ids), t)) in ours.iter().zip(theirs["results"].as_array().unwrap()).enumerate() {
        assert_eq!(text, t["text"].as_str().unwrap(), "request {i}: text");
        let hf: Vec<u32> = t["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(ids, &hf, "request {i}: ids");
    }
}
