//! Fixtures for the learner tests: tiny random models made in Rust and saved
//! as transformers directories, deterministic batches, the PyTorch oracle.
#![allow(dead_code)]
use rlmesh_actors::learner::{SftBatch, SftSequence, TrainBatch, TrainSequence};
use rlmesh_model::{ModelConfig, Transformer};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The project's Python (PyTorch 2.11, transformers).
pub fn python() -> PathBuf {
    std::env::var_os("RLMESH_PYTHON").map(PathBuf::from).unwrap_or_else(|| repo().join("scripts/py"))
}

/// `tests/oracle/loss_oracle.py`.
pub fn oracle_script() -> PathBuf {
    repo().join("tests/oracle/loss_oracle.py")
}

/// Vocabulary of the tiny models.
pub const VOCAB: i64 = 96;

/// Writes a model directory under `dir` (`name`, random weights from `seed`).
pub type MakeModel = fn(&Path, &str, i64) -> PathBuf;

/// The two model shapes the dtype and checkpointing tests run on.
pub const TWO_SHAPES: [(&str, MakeModel); 2] = [("qwen2-tiny", tiny_model), ("smollm2-shaped", smollm2_shaped_model)];

/// A tiny Qwen2 (tied embeddings, q/k/v biases) with seeded random weights, saved under `dir/name`.
pub fn tiny_model(dir: &Path, name: &str, seed: i64) -> PathBuf {
    random_model(
        json!({
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0
        }),
        &dir.join(name),
        seed,
    )
}

/// A random model of SmolLM2's shape, scaled down: Llama, tied embeddings, no biases,
/// three query heads per key/value head (SmolLM2-135M: 9 and 3), saved under `dir/name`.
pub fn smollm2_shaped_model(dir: &Path, name: &str, seed: i64) -> PathBuf {
    random_model(
        json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 48, "intermediate_size": 128,
            "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "rope_theta": 100000.0
        }),
        &dir.join(name),
        seed,
    )
}

/// A model of `shape` over the tiny vocabulary with tied embeddings and seeded random weights, saved at `out`.
fn random_model(mut shape: Value, out: &Path, seed: i64) -> PathBuf {
    let common = json!({
        "vocab_size": VOCAB, "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
        "hidden_act": "silu", "dtype": "float32"
    });
    for (k, v) in common.as_object().unwrap() {
        shape[k] = v.clone();
    }
    let config = ModelConfig::from_json(shape, out).unwrap();
    tch::manual_seed(seed);
    let model = Transformer::new(config, Device::Cpu, Kind::Float);
    // Larger than the default 0.02 so that the policy is far from uniform.
    tch::no_grad(|| {
        for (name, mut v) in model.vs.variables() {
            if !name.contains("norm") {
                let _ = v.g_mul_scalar_(4.0);
            }
        }
    });
    model.save(out, None).unwrap();
    out.to_path_buf()
}

/// A grouped policy-gradient batch: `groups` prompts of `prompt` tokens, `g` rollouts each
/// with completions of 3 to 24 tokens; with `multi_turn`, every other rollout has a call,
/// a tool result outside the loss mask and a reply. Behaviour and reference log-probs,
/// values, returns and per-token rewards are filled in.
pub fn grouped_batch(groups: usize, g: usize, prompt: usize, multi_turn: bool, seed: u64) -> TrainBatch {
    let mut r = Rng(seed);
    let token = |r: &mut Rng| 3 + (r.next() * (VOCAB - 3) as f64) as u32;
    let batch = (0..groups).map(|_| {
        let head: Vec<u32> = (0..prompt).map(|_| token(&mut r)).collect();
        (0..g)
            .map(|k| {
                let mut token_ids = head.clone();
                let mut loss_mask = vec![0u8; prompt];
                let n = 3 + (r.next() * 21.0) as usize;
                for j in 0..n {
                    token_ids.push(token(&mut r));
                    loss_mask.push(1);
                    if multi_turn && k % 2 == 1 && j == n / 2 {
                        for _ in 0..5 {
                            token_ids.push(token(&mut r));
                            loss_mask.push(0);
                        }
                    }
                }
                let len = token_ids.len();
                let adv = (r.next() * 2.0 - 1.0) as f32;
                let mut f = |lo: f64, hi: f64| -> Vec<f32> { (0..len).map(|_| (lo + r.next() * (hi - lo)) as f32).collect() };
                let rewards: Vec<f32> = (0..len).map(|t| if loss_mask[t] == 1 && (t + 1 == len || loss_mask[t + 1] == 0) { 0.5 } else { 0.0 }).collect();
                TrainSequence {
                    advantages: loss_mask.iter().map(|&m| m as f32 * adv).collect(),
                    behaviour_logprobs: f(-5.5, -3.5),
                    ref_logprobs: Some(f(-5.5, -3.5)),
                    values: Some(f(-0.3, 0.3)),
                    returns: Some(f(-1.0, 1.0)),
                    rewards: Some(rewards),
                    token_ids,
                    loss_mask,
                }
            })
            .collect::<Vec<_>>()
    });
    TrainBatch::of_groups(batch.collect::<Vec<_>>())
}

/// splitmix64 stream of floats in [0, 1).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A policy-gradient batch: varied lengths, a prompt, a masked-out tool result in the middle,
/// behaviour/ref log-probs near the tiny model's, values and returns.
pub fn policy_batch(n: usize, seed: u64) -> TrainBatch {
    let mut r = Rng(seed);
    let sequences = (0..n)
        .map(|i| {
            let len = 10 + (i * 3) % 9;
            let token_ids: Vec<u32> = (0..len).map(|_| 3 + (r.next() * (VOCAB - 3) as f64) as u32).collect();
            let loss_mask: Vec<u8> = (0..len).map(|j| (j >= 4 && !(7..9).contains(&j)) as u8).collect();
            let adv = (r.next() * 2.0 - 1.0) as f32;
            let mut f = |lo: f64, hi: f64| -> Vec<f32> { (0..len).map(|_| (lo + r.next() * (hi - lo)) as f32).collect() };
            TrainSequence {
                advantages: loss_mask.iter().map(|&m| m as f32 * adv).collect(),
                behaviour_logprobs: f(-5.5, -3.5),
                ref_logprobs: Some(f(-5.5, -3.5)),
                values: Some(f(-0.3, 0.3)),
                returns: Some(f(-1.0, 1.0)),
                rewards: None,
                token_ids,
                loss_mask,
            }
        })
        .collect();
    TrainBatch { sequences, ..Default::default() }
}

/// A fixed SFT dataset: counting sequences (`a, a+k, a+2k, …` mod the vocabulary) after a 2-token prompt.
pub fn sft_batch(n: usize, len: usize) -> SftBatch {
    let sequences = (0..n)
        .map(|i| {
            let (a, k) = (3 + 7 * i as u32, 1 + (i as u32 % 3));
            let token_ids: Vec<u32> = (0..len as u32).map(|j| 3 + (a + k * j) % (VOCAB as u32 - 3)).collect();
            let loss_mask = (0..len).map(|j| (j >= 2) as u8).collect();
            SftSequence { token_ids, loss_mask }
        })
        .collect();
    SftBatch { sequences }
}

/// Largest absolute difference between two tensors.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double)).abs().max().double_value(&[])
}

/// A `[rows, cols]` float64 tensor from JSON nested arrays.
pub fn tensor2(v: &Value) -> Tensor {
    let rows: Vec<Vec<f64>> = serde_json::from_value(v.clone()).unwrap();
    let cols = rows[0].len() as i64;
    Tensor::from_slice(&rows.concat()).view([rows.len() as i64, cols])
}
