//! Runs the learner-step benchmark (ignored: a benchmark, not a test).
//! `cargo test -p rlmesh-actors --test learner_bench -- --ignored --nocapture`
//! Environment: `RLMESH_BENCH_DEVICE=cuda` (bfloat16 there), `RLMESH_BENCH_SMOLLM2=DIR`
//! (default: the cached SmolLM2-135M; `shape` makes random weights of its shape).
mod learner_common;

use learner_common::*;
use rlmesh_actors::learner::bench::{bench_learner_step, LearnerBench};
use rlmesh_model::{ModelConfig, Transformer};
use std::path::{Path, PathBuf};
use tch::{Device, Kind};

fn smollm2(dir: &Path) -> PathBuf {
    match std::env::var("RLMESH_BENCH_SMOLLM2").ok().as_deref() {
        Some("shape") => {
            let cfg = serde_json::json!({
                "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
                "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                "head_dim": 64, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
                "tie_word_embeddings": true, "hidden_act": "silu", "dtype": "float32"
            });
            let model = Transformer::new(ModelConfig::from_json(cfg, Path::new("smollm2-shape")).unwrap(), Device::Cpu, Kind::Float);
            let out = dir.join("smollm2-shape");
            model.save(&out, None).unwrap();
            out
        }
        Some(d) => PathBuf::from(d),
        None => {
            let out = std::process::Command::new(repo().join("scripts/prepare-models.sh")).output().unwrap();
            PathBuf::from(String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim()).join("smollm2-135m")
        }
    }
}

#[test]
#[ignore]
fn bench_learner_step_vs_pytorch_eager() {
    let dir = tempfile::tempdir().unwrap();
    let cuda = std::env::var("RLMESH_BENCH_DEVICE").as_deref() == Ok("cuda");
    let (device, kind) = if cuda { (Device::Cuda(0), Kind::BFloat16) } else { (Device::Cpu, Kind::Float) };
    let threads = std::env::var("RLMESH_BENCH_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(2);
    let base = |model_dir: PathBuf, batch_size, seq_len, iters| LearnerBench {
        model_dir,
        python: python(),
        script: oracle_script(),
        batch_size,
        seq_len,
        prompt_len: seq_len / 4,
        iters,
        warmup: 2,
        threads,
        device,
        kind,
        rounds: 1,
        peer_fused_adamw: false,
    };
    let tiny = bench_learner_step(&base(tiny_model(dir.path(), "tiny", 1), 8, 64, 20)).unwrap();
    let (b, t, iters) = if cuda { (8, 512, 10) } else { (4, 128, 3) };
    let smol = bench_learner_step(&base(smollm2(dir.path()), b, t, iters)).unwrap();
    println!("{}", serde_json::to_string_pretty(&[tiny, smol]).unwrap());
}
