//! The JSON contracts of `score`, `render`, `advantages`, `reward` and `chat` (CLI.md), through the real binary.
mod common;

use common::*;
use rlmesh_actors::controller::init::{create_tiny_model, TinySpec};
use rlmesh_model::{ModelConfig, Transformer};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tch::{Device, Kind};

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn json_lines(s: &str) -> Vec<Value> {
    s.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect()
}

/// A tiny random Qwen2 saved as a transformers directory (no tokenizer: `score` reads ids).
fn tiny_scorer(dir: &Path) -> PathBuf {
    let cfg = json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true,
        "hidden_act": "silu", "dtype": "float32"
    });
    tch::manual_seed(3);
    let model = Transformer::new(ModelConfig::from_json(cfg, Path::new("tiny")).unwrap(), Device::Cpu, Kind::Float);
    let out = dir.join("tiny");
    model.save(&out, None).unwrap();
    out
}

#[test]
fn score_prints_one_logprob_per_next_token_matching_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = tiny_scorer(dir.path());
    let seqs = vec![vec![1u32, 5, 9, 63, 2], vec![7, 7], vec![0, 1, 2, 3, 4, 5, 6, 7, 8]];
    let input: String = seqs.iter().map(|s| format!("{}\n", json!({ "token_ids": s }))).collect();
    let o = launcher(&["score", "--model", model_dir.to_str().unwrap(), "--input", &write(dir.path(), "in.jsonl", &input), "--batch", "2"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = json_lines(&stdout(&o));
    let expected = Transformer::load(&model_dir, Device::Cpu, Some(Kind::Float)).unwrap().score(&seqs).unwrap();
    assert_eq!(out.len(), seqs.len());
    for ((line, seq), want) in out.iter().zip(&seqs).zip(&expected) {
        let got: Vec<f32> = serde_json::from_value(line["logprobs"].clone()).unwrap();
        assert_eq!(got.len(), seq.len() - 1);
        assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-5 && *g <= 0.0), "{got:?} vs {want:?}");
    }

    let o = launcher(&["score", "--model", model_dir.to_str().unwrap(), "--input", &write(dir.path(), "bad.jsonl", "{\"token_ids\": [1, 2]}\n{\"ids\": [1]}\n")]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("bad.jsonl:2: field \"token_ids\": missing"), "{}", stderr(&o));
}

#[test]
fn render_uses_the_models_own_template() {
    let dir = tempfile::tempdir().unwrap();
    let model = models_dir().join("smollm2-135m");
    let req = json!({"messages": [{"role": "user", "content": "Hi there"}], "add_generation_prompt": true});
    let o = launcher(&["render", "--model", model.to_str().unwrap(), "--input", &write(dir.path(), "r.json", &req.to_string())]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let text = out["text"].as_str().unwrap();
    assert!(text.starts_with("<|im_start|>system\n") && text.ends_with("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"), "{text:?}");
    let tok = rlmesh_model::Tokenizer::load(&model).unwrap();
    assert_eq!(out["token_ids"], json!(tok.encode(text).unwrap()));

    let o = launcher(&["render", "--model", model.to_str().unwrap(), "--input", &write(dir.path(), "bad.json", r#"{"messages": [{"content": "x"}]}"#)]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("field \"messages[0].role\""), "{}", stderr(&o));
}

#[test]
fn advantages_compute_grpo_and_name_the_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let req = json!({"estimator": "grpo", "params": {"scale_rewards": "none"},
                     "groups": [[{"loss_mask": [0, 1, 1], "rewards": [1.0]}, {"loss_mask": [0, 0, 1], "rewards": [0.0]}]]});
    let o = launcher(&["advantages", "--input", &write(dir.path(), "a.json", &req.to_string())]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(out, json!({"advantages": [[[0.0, 0.5, 0.5], [0.0, 0.0, -0.5]]]}));

    let bad = json!({"estimator": "grpo", "groups": [[{"loss_mask": [1], "rewards": [1.0]}, {"rewards": [0.0]}]]});
    let o = launcher(&["advantages", "--input", &write(dir.path(), "bad.json", &bad.to_string())]);
    assert_eq!(code(&o), 2);
    let err = stderr(&o);
    assert!(err.contains("bad.json") && err.contains("groups[0][1].loss_mask"), "{err}");
}

#[test]
fn reward_scores_good_and_malformed_completions_without_failing() {
    let dir = tempfile::tempdir().unwrap();
    let task = json!({"requires_tool": true, "allowed_tools": ["calculator"],
                      "gold_tool_calls": [[{"name": "calculator", "arguments": {"expression": "17*24"}}]], "expected_answer": "408"});
    let good = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17*24\"}}\n</tool_call><tool_response>408</tool_response>The answer is 408.";
    let completions = [good, "<tool_call>", "<tool_call>{\"name\": 7}</tool_call>408", "</tool_call> 408", ""];
    let input: String = completions.iter().map(|c| format!("{}\n", json!({"reward": "process", "task": task, "completion": c}))).collect();
    let o = launcher(&["reward", "--input", &write(dir.path(), "r.jsonl", &input)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = json_lines(&stdout(&o));
    assert_eq!(out.len(), completions.len());
    assert_eq!(out[0]["total"], json!(1.0));
    for (c, v) in completions.iter().zip(&out).skip(1) {
        assert_eq!(v["components"]["format_ok"], json!(0.0), "{c:?}: {v}");
        assert!(v["total"].as_f64().unwrap() < 1.0, "{c:?}: {v}");
    }

    let o = launcher(&["reward", "--input", &write(dir.path(), "bad.jsonl", &format!("{}\n{}\n", json!({"reward": "process", "task": task, "completion": ""}), json!({"reward": "vibes", "task": task, "completion": ""})))]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("bad.jsonl:2") && stderr(&o).contains("reward: expected one of"), "{}", stderr(&o));
}

#[test]
fn chat_runs_the_tool_loop_with_the_tool_template_when_the_model_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let smol = models_dir().join("smollm2-135m");
    let spec = TinySpec { hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64 };
    let model = create_tiny_model(&dir.path().join("tiny"), &smol, spec, 5).unwrap();
    // Give it SmolLM2's own template, which ignores tools: chat must fall back to rlmesh's tool template.
    std::fs::copy(smol.join("chat_template.jinja"), model.join("chat_template.jinja")).unwrap();
    let args = ["chat", "--model", model.to_str().unwrap(), "--prompt", "What is 17*24?", "--tools", "calculator", "--greedy", "--max-new-tokens", "6"];
    let o = launcher(&[&args[..], &["--json"]].concat());
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("has no chat template that renders tools"), "{}", stderr(&o));
    let out: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(out["messages"][0], json!({"role": "user", "content": "What is 17*24?"}));
    assert_eq!(out["messages"][1]["role"], "assistant");
    let text = out["text"].as_str().unwrap();
    assert!(text.contains("<tools>") && text.contains("\"calculator\""), "the prompt offers the calculator: {text:?}");
    let tok = rlmesh_model::Tokenizer::load(&model).unwrap();
    assert_eq!(tok.decode(&serde_json::from_value::<Vec<u32>>(out["token_ids"].clone()).unwrap(), false).unwrap(), text);

    let o = launcher(&args);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let lines = stdout(&o);
    assert!(lines.starts_with("[user] What is 17*24?\n[assistant"), "{lines}");
    assert!(lines.lines().last().unwrap().starts_with("[stop] "), "{lines}");

    let o = launcher(&["chat", "--model", model.to_str().unwrap(), "--prompt", "hi", "--tools", "abacus"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--tools") && stderr(&o).contains("abacus"), "{}", stderr(&o));
}

/// A file of `len` bytes that takes no disk (sparse): for refusals that must come before reading.
fn sparse(dir: &Path, name: &str, len: u64) -> String {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(len).unwrap();
    p.display().to_string()
}

#[test]
fn score_refuses_a_sequence_longer_than_the_model_naming_line_length_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = tiny_scorer(dir.path());
    let model = model_dir.to_str().unwrap();
    // The tiny scorer's max_position_embeddings is 64; 65 ids were scored silently before.
    let input = format!("{}\n{}\n", json!({"token_ids": [1, 2, 3]}), json!({"token_ids": vec![1u32; 65]}));
    let o = launcher(&["score", "--model", model, "--input", &write(dir.path(), "long.jsonl", &input)]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("long.jsonl:2: field \"token_ids\": 65 tokens, more than the model's limit of 64 (max_position_embeddings)"), "{}", stderr(&o));
    // A million ids: refused by length, no allocation in libtorch (it panicked with exit 101).
    let input = format!("{}\n", json!({"token_ids": vec![7u32; 1_000_000]}));
    let o = launcher(&["score", "--model", model, "--input", &write(dir.path(), "huge.jsonl", &input)]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("huge.jsonl:1: field \"token_ids\": 1000000 tokens"), "{}", stderr(&o));
    let o = launcher(&["score", "--model", model, "--input", &write(dir.path(), "ok.jsonl", "{\"token_ids\": [1, 2]}\n"), "--batch", "0"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--batch"), "{}", stderr(&o));
    let o = launcher(&["score", "--model", model, "--input", &write(dir.path(), "nan.jsonl", "{\"token_ids\": [1, NaN]}\n")]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("nan.jsonl:1") && stderr(&o).contains("NaN and Infinity are not JSON numbers"), "{}", stderr(&o));
}

#[test]
fn oversized_inputs_are_refused_with_the_bound_before_they_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let model = models_dir().join("smollm2-135m");
    // 200 MB inputs aborted with SIGABRT ("memory allocation failed"); these are sparse files.
    let big = sparse(dir.path(), "big.json", 200 << 20);
    for args in [vec!["advantages", "--input", &big], vec!["render", "--model", model.to_str().unwrap(), "--input", &big]] {
        let o = launcher(&args);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("big.json: 209715200 bytes, more than the 16 MiB"), "{args:?}: {}", stderr(&o));
    }
    // Standard input has no size to look at: it is read up to the bound, then refused.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_launcher"))
        .args(["advantages", "--input", "-"])
        .stdin(std::fs::File::open(&big).unwrap())
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("-: more than the 16 MiB `advantages` reads"), "{}", stderr(&o));
    // JSONL is streamed; one line may not pass 4 MiB.
    let line = format!("{{\"token_ids\": [{}1]}}\n", "1, ".repeat(5 << 19));
    let long = write(dir.path(), "long.jsonl", &format!("\n{line}"));
    let scorer = tiny_scorer(dir.path());
    for args in [vec!["reward", "--input", &long], vec!["score", "--model", scorer.to_str().unwrap(), "--input", &long]] {
        let o = launcher(&args);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("long.jsonl:2: line longer than 4 MiB"), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn render_refuses_a_role_the_template_would_drop() {
    let dir = tempfile::tempdir().unwrap();
    let smol = models_dir().join("smollm2-135m");
    // SmolLM2's tokenizer with rlmesh's Qwen2.5-style tool template, which has no branch for unknown roles.
    let qwen = dir.path().join("qwen-style");
    std::fs::create_dir(&qwen).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(smol.join(f), qwen.join(f)).unwrap();
    }
    std::fs::write(qwen.join("chat_template.jinja"), rlmesh_actors::controller::init::TOOL_TEMPLATE).unwrap();
    let req = json!({"messages": [{"role": "user", "content": "Hi"}, {"role": "narrator", "content": "Later that day"}]});
    let input = write(dir.path(), "r.json", &req.to_string());
    let o = launcher(&["render", "--model", qwen.to_str().unwrap(), "--input", &input]);
    assert_eq!(code(&o), 2, "{}", stdout(&o));
    assert!(stderr(&o).contains("r.json: field \"messages[1].role\": \"narrator\" is a role this model's chat template does not render"), "{}", stderr(&o));
    // SmolLM2's own template renders any role: the same input renders.
    let o = launcher(&["render", "--model", smol.to_str().unwrap(), "--input", &input]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("narrator"), "{}", stdout(&o));
}

#[test]
fn chat_names_its_flags_and_refuses_a_prompt_that_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let smol = models_dir().join("smollm2-135m");
    let spec = TinySpec { hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64 };
    let model = create_tiny_model(&dir.path().join("tiny"), &smol, spec, 5).unwrap();
    let m = model.to_str().unwrap();
    let o = launcher(&["chat", "--model", m, "--prompt", "hi", "--max-new-tokens", "0"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--max-new-tokens") && !stderr(&o).contains("sampling."), "{}", stderr(&o));
    // A context of 64 positions: a long prompt ended with "[stop] TokenBudget" and no word about it.
    let config = model.join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    cfg["max_position_embeddings"] = json!(64);
    std::fs::write(&config, cfg.to_string()).unwrap();
    let long = "the quick brown fox jumps over the lazy dog ".repeat(20);
    let o = launcher(&["chat", "--model", m, "--prompt", &long, "--greedy"]);
    assert_eq!(code(&o), 2, "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("--prompt:") && err.contains("tokens once rendered") && err.contains("context holds 64"), "{err}");
    // A prompt that fits but leaves less room than --max-new-tokens says so.
    let o = launcher(&["chat", "--model", m, "--prompt", "the quick brown fox", "--greedy", "--max-new-tokens", "100"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("a reply gets at most") && stderr(&o).contains("not --max-new-tokens 100"), "{}", stderr(&o));
}
