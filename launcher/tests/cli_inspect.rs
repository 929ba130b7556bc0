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
