//! `config.json` of a Hugging Face causal LM, reduced to what the decoder needs.
use crate::error::{io_err, ModelError, Result};
use serde_json::{json, Value};
use std::path::Path;

/// Model families rlmesh implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `Qwen2ForCausalLM` (Qwen2 / Qwen2.5): bias on q, k, v projections.
    Qwen2,
    /// `LlamaForCausalLM` (Llama, SmolLM2): optional attention / MLP bias.
    Llama,
}

impl Architecture {
    /// The transformers class name.
    pub fn class_name(self) -> &'static str {
        match self {
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Llama => "LlamaForCausalLM",
        }
    }
    /// The transformers `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Qwen2 => "qwen2",
            Architecture::Llama => "llama",
        }
    }
}

/// The decoder's hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Model family.
    pub arch: Architecture,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: i64,
    /// Residual width.
    pub hidden_size: i64,
    /// MLP inner width.
    pub intermediate_size: i64,
    /// Decoder layers.
    pub num_layers: i64,
    /// Query heads.
    pub num_heads: i64,
    /// Key/value heads (GQA when fewer than `num_heads`).
    pub num_kv_heads: i64,
    /// Width of one head.
    pub head_dim: i64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// Bias on q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// Bias on the MLP projections.
    pub mlp_bias: bool,
    /// `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Longest supported context.
    pub max_position_embeddings: i64,
    /// Stored dtype (`float32` / `bfloat16`).
    pub dtype: String,
    /// Beginning-of-sequence id, if any.
    pub bos_token_id: Option<i64>,
    /// End-of-sequence ids (the config may list several).
    pub eos_token_ids: Vec<i64>,
    /// Padding id, if any.
    pub pad_token_id: Option<i64>,
    /// The raw JSON (kept so a save writes back fields rlmesh does not use).
    pub raw: Value,
}

fn field<'a>(v: &'a Value, path: &Path, name: &str) -> Result<&'a Value> {
    v.get(name).filter(|x| !x.is_null()).ok_or_else(|| ModelError::BadFile {
        path: path.to_path_buf(),
        message: format!("field {name:?}: missing"),
    })
}

fn int(v: &Value, path: &Path, name: &str) -> Result<i64> {
    let x = field(v, path, name)?;
    x.as_i64().filter(|n| *n > 0).ok_or_else(|| ModelError::BadFile {
        path: path.to_path_buf(),
        message: format!("field {name:?}: expected a positive integer, found {x}"),
    })
}

fn float_or(v: &Value, path: &Path, name: &str, default: f64) -> Result<f64> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x.as_f64().ok_or_else(|| ModelError::BadFile {
            path: path.to_path_buf(),
            message: format!("field {name:?}: expected a number, found {x}"),
        }),
    }
}

fn bool_or(v: &Value, name: &str, default: bool) -> bool {
    v.get(name).and_then(Value::as_bool).unwrap_or(default)
}

fn ids(v: Option<&Value>) -> Vec<i64> {
    match v {
        Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_i64).collect(),
        _ => vec![],
    }
}

impl ModelConfig {
    /// Read `config.json` from a model directory.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        if !path.exists() {
            return Err(ModelError::MissingFile { path, what: "model config" });
        }
        let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
        let raw: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::BadFile { path: path.clone(), message: format!("not valid JSON: {e}") })?;
        Self::from_json(raw, &path)
    }

    /// Parse a config from its JSON (`path` is used in errors only).
    pub fn from_json(raw: Value, path: &Path) -> Result<Self> {
        let arch_name = raw
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| raw.get("model_type").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_default();
        let arch = match arch_name.as_str() {
            "Qwen2ForCausalLM" | "qwen2" => Architecture::Qwen2,
            "LlamaForCausalLM" | "llama" => Architecture::Llama,
            _ => {
                return Err(ModelError::UnsupportedArchitecture {
                    path: path.to_path_buf(),
                    found: arch_name,
                    supported: "Qwen2ForCausalLM, LlamaForCausalLM",
                })
            }
        };
        let hidden_size = int(&raw, path, "hidden_size")?;
        let num_heads = int(&raw, path, "num_attention_heads")?;
        let num_kv_heads = match raw.get("num_key_value_heads") {
            None | Some(Value::Null) => num_heads,
            Some(_) => int(&raw, path, "num_key_value_heads")?,
        };
        let head_dim = match raw.get("head_dim") {
            None | Some(Value::Null) => {
                if hidden_size % num_heads != 0 {
                    return Err(ModelError::BadFile {
                        path: path.to_path_buf(),
                        message: format!("hidden_size {hidden_size} is not divisible by num_attention_heads {num_heads}"),
                    });
                }
                hidden_size / num_heads
            }
            Some(_) => int(&raw, path, "head_dim")?,
        };
        if num_heads % num_kv_heads != 0 {
            return Err(ModelError::BadFile {
                path: path.to_path_buf(),
                message: format!("num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"),
            });
        }
        // transformers ≥ 5 writes `rope_parameters: {rope_theta, rope_type}`; older files a flat `rope_theta`.
        let rope = raw.get("rope_parameters").or_else(|| raw.get("rope_scaling")).filter(|v| !v.is_null());
        if let Some(kind) = rope.and_then(|r| r.get("rope_type").or_else(|| r.get("type"))).and_then(Value::as_str) {
            if kind != "default" {
                return Err(ModelError::BadFile {
                    path: path.to_path_buf(),
                    message: format!("field \"rope_type\": {kind:?} is not supported (only \"default\")"),
                });
            }
        }
        let rope_theta = match rope.and_then(|r| r.get("rope_theta")).and_then(Value::as_f64) {
            Some(t) => t,
            None => float_or(&raw, path, "rope_theta", 10000.0)?,
        };
        let attention_bias = bool_or(&raw, "attention_bias", false);
        let (qkv_bias, o_bias, mlp_bias) = match arch {
            Architecture::Qwen2 => (true, false, false),
            Architecture::Llama => (attention_bias, attention_bias, bool_or(&raw, "mlp_bias", false)),
        };
        if let Some(act) = raw.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(ModelError::BadFile {
                    path: path.to_path_buf(),
                    message: format!("field \"hidden_act\": {act:?} is not supported (only \"silu\")"),
                });
            }
        }
        let dtype = raw
            .get("dtype")
            .or_else(|| raw.get("torch_dtype"))
            .and_then(Value::as_str)
            .unwrap_or("float32")
            .to_string();
        Ok(ModelConfig {
            arch,
            vocab_size: int(&raw, path, "vocab_size")?,
            hidden_size,
            intermediate_size: int(&raw, path, "intermediate_size")?,
            num_layers: int(&raw, path, "num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: float_or(&raw, path, "rms_norm_eps", 1e-6)?,
            rope_theta,
            qkv_bias,
            o_bias,
            mlp_bias,
            tie_word_embeddings: bool_or(&raw, "tie_word_embeddings", arch == Architecture::Qwen2),
            max_position_embeddings: match raw.get("max_position_embeddings") {
                None | Some(Value::Null) => 32768,
                Some(_) => int(&raw, path, "max_position_embeddings")?,
            },
            dtype,
            bos_token_id: raw.get("bos_token_id").and_then(Value::as_i64),
            eos_token_ids: ids(raw.get("eos_token_id")),
            pad_token_id: raw.get("pad_token_id").and_then(Value::as_i64),
            raw,
        })
    }

    /// The JSON to write next to saved weights (the loaded fields, updated with `dtype`).
    pub fn to_json(&self, dtype: &str) -> Value {
        let mut v = if self.raw.is_object() { self.raw.clone() } else { json!({}) };
        let o = v.as_object_mut().expect("object");
        o.insert("architectures".into(), json!([self.arch.class_name()]));
        o.insert("model_type".into(), json!(self.arch.model_type()));
        o.insert("dtype".into(), json!(dtype));
        o.remove("torch_dtype");
        v
    }
}
