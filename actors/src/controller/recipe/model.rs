//! `[model]`: the policy, a Hugging Face directory or the tiny model created for the run.
use super::checks::{at_least, at_most};
use super::source::Invalid;
use super::bounds;
use rlmesh_core::tools::ToolFormat;
use serde::{Deserialize, Serialize};

/// The policy model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// An HF model directory, or `"tiny"` to create a tiny model and tokenizer (default).
    #[serde(default = "default_model_path")]
    pub path: String,
    /// The tiny model's tokenizer: `"task"` (default) learns a byte-level BPE
    /// from the task mix's expert conversations (numbers as chunks of up to three digits);
    /// `"smollm2"` uses SmolLM2's 49k-token tokenizer from the set-up.
    #[serde(default = "default_tokenizer")]
    pub tokenizer: String,
    /// Vocabulary size of the `"task"` tokenizer (default 1024).
    #[serde(default = "default_vocab")]
    pub vocab_size: usize,
    /// Digits per number token of the `"task"` tokenizer, 1–3 (default 3):
    /// numbers split into chunks of this many digits from the left, and every
    /// string of 1 to this many digits is a token.
    #[serde(default = "default_number_chunk")]
    pub number_chunk: u32,
    /// The tiny model's residual width (default 128).
    #[serde(default = "default_hidden")]
    pub hidden: i64,
    /// The tiny model's decoder layers (default 4).
    #[serde(default = "default_layers")]
    pub layers: i64,
    /// The tiny model's query heads (default 4).
    #[serde(default = "default_heads")]
    pub heads: i64,
    /// The tiny model's key/value heads (default 2; `heads` must be a multiple).
    #[serde(default = "default_kv_heads")]
    pub kv_heads: i64,
    /// How the model writes tool calls: `"hermes"` (`<tool_call>` blocks; default),
    /// `"llama3_json"` or `"mistral"`.
    #[serde(default)]
    pub tool_format: ToolFormat,
    /// A Jinja chat template (a file, relative to the recipe) replacing the model's own:
    /// for a model whose template cannot render tools (SmolLM2's), e.g.
    /// `model/templates/qwen2.5-tools.jinja`. It is checked before the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
}

fn default_tokenizer() -> String {
    "task".to_string()
}
fn default_vocab() -> usize {
    1024
}
fn default_number_chunk() -> u32 {
    3
}
fn default_hidden() -> i64 {
    128
}
fn default_layers() -> i64 {
    4
}
fn default_heads() -> i64 {
    4
}
fn default_kv_heads() -> i64 {
    2
}

fn default_model_path() -> String {
    "tiny".to_string()
}

impl Default for ModelSpec {
    fn default() -> Self {
        ModelSpec {
            path: default_model_path(),
            tokenizer: default_tokenizer(),
            vocab_size: default_vocab(),
            number_chunk: default_number_chunk(),
            hidden: default_hidden(),
            layers: default_layers(),
            heads: default_heads(),
            kv_heads: default_kv_heads(),
            tool_format: ToolFormat::default(),
            chat_template: None,
        }
    }
}

impl ModelSpec {
    /// Checks ranges and cross-field rules; the error names the offending field.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        if self.path.is_empty() {
            return Err(Invalid::new("model.path", "an HF model directory or \"tiny\""));
        }
        let m = self;
        if !["task", "smollm2"].contains(&m.tokenizer.as_str()) {
            return Err(Invalid::new("model.tokenizer", format!("\"task\" or \"smollm2\", got \"{}\"", m.tokenizer)));
        }
        at_least("model.vocab_size", m.vocab_size as f64, 300.0)?;
        let chunk = crate::controller::init::NUMBER_CHUNK_DIGITS;
        if !chunk.contains(&m.number_chunk) {
            let (lo, hi) = (chunk.start(), chunk.end());
            return Err(Invalid::new("model.number_chunk", format!("digits per number token, {lo} to {hi}, got {}", m.number_chunk)));
        }
        at_least("model.layers", m.layers as f64, 1.0)?;
        at_least("model.hidden", m.hidden as f64, 16.0)?;
        at_least("model.heads", m.heads as f64, 1.0)?;
        at_least("model.kv_heads", m.kv_heads as f64, 1.0)?;
        at_most("model.vocab_size", m.vocab_size as f64, bounds::VOCAB_SIZE as f64, "past the largest LLM vocabularies")?;
        at_most("model.hidden", m.hidden as f64, bounds::HIDDEN as f64, "the width of the largest open models")?;
        at_most("model.layers", m.layers as f64, bounds::LAYERS as f64, "past the deepest open models")?;
        at_most("model.heads", m.heads as f64, bounds::HEADS as f64, "past any published model")?;
        at_most("model.kv_heads", m.kv_heads as f64, bounds::HEADS as f64, "past any published model")?;
        if m.hidden % (2 * m.heads) != 0 {
            return Err(Invalid::new("model.hidden", format!("must split into {} heads of even width (a multiple of {}), got {}", m.heads, 2 * m.heads, m.hidden)));
        }
        if m.heads % m.kv_heads != 0 {
            return Err(Invalid::new("model.kv_heads", format!("must divide model.heads ({}), got {}", m.heads, m.kv_heads)));
        }
        if m.path == "tiny" && m.chat_template.is_some() {
            return Err(Invalid::new("model.chat_template", "the tiny model is created with rlmesh's tool template; a template applies to a model directory (model.path)"));
        }
        if m.path == "tiny" {
            // Embedding (task tokenizer only: SmolLM2's is 49152 rows), then per layer q, o, k, v and the 3×-wide MLP.
            let h = m.hidden as f64;
            let vocab = if m.tokenizer == "task" { m.vocab_size as f64 } else { 49_152.0 };
            let params = vocab * h + m.layers as f64 * (2.0 * h * h + 2.0 * h * h * m.kv_heads as f64 / m.heads as f64 + 9.0 * h * h);
            if params > bounds::TINY_PARAMETERS {
                return Err(Invalid::new(
                    "model.hidden",
                    format!("the tiny model would have {params:.3e} parameters, more than 2^30 (it is trained in f32 on the CPU: 16 GiB with Adam's state); lower model.hidden or model.layers"),
                ));
            }
        }
        Ok(())
    }
}
