//! Run set-up: the tiny policy the embedded default trains (created in Rust:
//! random weights, SmolLM2's tokenizer, the Qwen2.5-style tool template).
use rlmesh_model::{ModelConfig, Transformer};
use serde_json::json;
use std::path::{Path, PathBuf};
use tch::{Device, Kind};

/// The tool-calling chat template shipped with rlmesh (Qwen2.5 style).
pub const TOOL_TEMPLATE: &str = include_str!("../../../model/templates/qwen2.5-tools.jinja");

/// Shape of the tiny policy.
#[derive(Clone, Copy, Debug)]
pub struct TinySpec {
    /// Residual width.
    pub hidden: i64,
    /// Decoder layers.
    pub layers: i64,
    /// Query heads.
    pub heads: i64,
    /// Key/value heads.
    pub kv_heads: i64,
    /// MLP width.
    pub intermediate: i64,
}

impl Default for TinySpec {
    fn default() -> Self {
        TinySpec { hidden: 128, layers: 4, heads: 4, kv_heads: 2, intermediate: 384 }
    }
}

/// Errors of run set-up.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A tokenizer file could not be copied.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The model could not be built or saved.
    #[error(transparent)]
    Model(#[from] rlmesh_model::ModelError),
}

/// Create a tiny Llama-architecture model with random weights (seeded) in `out`,
/// using the tokenizer files of `tokenizer_dir` and rlmesh's tool template.
pub fn create_tiny_model(out: &Path, tokenizer_dir: &Path, spec: TinySpec, seed: u64) -> Result<PathBuf, InitError> {
    let vocab = rlmesh_model::Tokenizer::load(tokenizer_dir)?.vocab_size() as i64;
    let config = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": spec.hidden, "intermediate_size": spec.intermediate, "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "head_dim": spec.hidden / spec.heads,
        "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "dtype": "float32"
    });
    let cfg = ModelConfig::from_json(config, &out.join("config.json"))?;
    tch::manual_seed(seed as i64);
    let model = Transformer::new(cfg, Device::Cpu, Kind::Float);
    model.save(out, None)?;
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        let src = tokenizer_dir.join(f);
        if src.exists() {
            std::fs::copy(&src, out.join(f)).map_err(|source| InitError::Io { path: src.clone(), source })?;
        }
    }
    let tmpl = out.join("chat_template.jinja");
    std::fs::write(&tmpl, TOOL_TEMPLATE).map_err(|source| InitError::Io { path: tmpl.clone(), source })?;
    Ok(out.to_path_buf())
}
