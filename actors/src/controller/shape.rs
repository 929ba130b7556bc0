//! What the memory plan ([`super::memory`]) reads of a model and of a
//! learner micro-batch: the decoder's shape from its `config.json`
//! ([`ModelShape`]) and the largest RL micro-batch the recipe's layout computes
//! ([`MicroShape`]).
use super::memory::PADDED_RL_ROWS;
use super::recipe::Recipe;
use rlmesh_model::config::ModelConfig;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The shape of a decoder (what the plan reads of `config.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    /// Vocabulary rows.
    pub vocab: u64,
    /// Residual width.
    pub hidden: u64,
    /// MLP width.
    pub intermediate: u64,
    /// Decoder layers.
    pub layers: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads.
    pub kv_heads: u64,
    /// Width of a head.
    pub head_dim: u64,
    /// Bias on q/k/v.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// Bias on the MLP projections.
    pub mlp_bias: bool,
    /// `lm_head` is the embedding.
    pub tied: bool,
    /// Longest context.
    pub max_positions: u64,
}

impl ModelShape {
    /// The shape of a parsed `config.json`.
    pub fn of(c: &ModelConfig) -> ModelShape {
        let u = |x: i64| x.max(0) as u64;
        ModelShape {
            vocab: u(c.vocab_size),
            hidden: u(c.hidden_size),
            intermediate: u(c.intermediate_size),
            layers: u(c.num_layers),
            heads: u(c.num_heads),
            kv_heads: u(c.num_kv_heads),
            head_dim: u(c.head_dim),
            qkv_bias: c.qkv_bias,
            o_bias: c.o_bias,
            mlp_bias: c.mlp_bias,
            tied: c.tie_word_embeddings,
            max_positions: u(c.max_position_embeddings),
        }
    }

    /// The policy of a recipe: its `config.json`, or the tiny model it creates
    /// (`model.path = "tiny"`: the task tokenizer's vocabulary, or SmolLM2's 49152).
    pub fn of_recipe(recipe: &Recipe) -> Result<ModelShape, String> {
        if !recipe.tiny_model() {
            let dir = Path::new(&recipe.model.path);
            return ModelConfig::load(dir).map(|c| ModelShape::of(&c)).map_err(|e| format!("field \"model.path\": {e}"));
        }
        let t = recipe.tiny_spec();
        let vocab = if recipe.model.tokenizer == "task" { recipe.model.vocab_size as u64 } else { 49_152 };
        let u = |x: i64| x.max(0) as u64;
        Ok(ModelShape {
            vocab,
            hidden: u(t.hidden),
            intermediate: u(t.intermediate),
            layers: u(t.layers),
            heads: u(t.heads),
            kv_heads: u(t.kv_heads),
            head_dim: u(t.hidden / t.heads.max(1)),
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            tied: true,
            max_positions: 2048,
        })
    }

    /// Query width (`heads × head_dim`).
    pub fn q_dim(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// Key (and value) width (`kv_heads × head_dim`).
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// Trained parameters, exactly as the decoder creates them.
    pub fn parameters(&self) -> u64 {
        let (h, i, q, k) = (self.hidden, self.intermediate, self.q_dim(), self.kv_dim());
        let b = |on: bool, n: u64| if on { n } else { 0 };
        let attention = h * q + 2 * h * k + q * h + b(self.qkv_bias, q + 2 * k) + b(self.o_bias, h);
        let mlp = 3 * h * i + b(self.mlp_bias, 2 * i + h);
        let layer = attention + mlp + 2 * h;
        self.vocab * h * if self.tied { 1 } else { 2 } + self.layers * layer + h
    }
}

/// One micro-batch of the learner, as it is computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MicroShape {
    /// Positions the forward computes (padding included).
    pub tokens: u64,
    /// Key slots attention gathers beyond one per token (a shared prompt's keys, once per continuation).
    pub extra_keys: u64,
    /// Positions the loss reads (rows of the `[targets, vocab]` head).
    pub targets: u64,
    /// Bytes of the children's attention masks.
    pub mask_bytes: u64,
}

impl MicroShape {
    /// The RL phase's largest micro-batch: whole groups of a `prompt`-token prompt and
    /// `group_size` continuations of `completion` tokens, laid out as `[learner]` says.
    pub fn of_recipe(recipe: &Recipe, prompt: u64, completion: u64) -> MicroShape {
        let l = &recipe.learner;
        let layout = match (l.pack, l.shared_prefix) {
            (false, _) => MicroLayout::Padded { rows: PADDED_RL_ROWS as u64 },
            (true, false) => MicroLayout::Packed { budget: l.micro_batch_tokens as u64 },
            (true, true) => MicroLayout::SharedPrefix { budget: l.micro_batch_tokens as u64 },
        };
        MicroShape::of_groups(layout, prompt, completion, recipe.rl.group_size as u64)
    }

    /// The largest micro-batch of groups of `group` sequences, each a `prompt` and
    /// `completion` trained tokens after it, in `layout`.
    pub fn of_groups(layout: MicroLayout, prompt: u64, completion: u64, group: u64) -> MicroShape {
        let (p, c, g) = (prompt, completion.max(1), group.max(1));
        match layout {
            MicroLayout::Padded { rows } => MicroShape { tokens: rows * (p + c), extra_keys: 0, targets: rows * c, mask_bytes: 0 },
            MicroLayout::Packed { budget } => {
                let seqs = (budget / (p + c)).max(1);
                MicroShape { tokens: seqs * (p + c), extra_keys: 0, targets: seqs * c, mask_bytes: 0 }
            }
            MicroLayout::SharedPrefix { budget } => {
                // Units of one prompt and as many of its continuations as the budget holds.
                let children = (budget.saturating_sub(p) / c).clamp(1, g);
                let unit = p + children * c;
                let units = (budget / unit).max(1);
                MicroShape { tokens: units * unit, extra_keys: units * children * p, targets: units * children * c, mask_bytes: units * children * c * (p + c) }
            }
        }
    }
}

/// How the learner lays out an RL micro-batch (`[learner] pack`, `shared_prefix`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MicroLayout {
    /// One right-padded sequence per row.
    Padded {
        /// Rows per micro-batch.
        rows: u64,
    },
    /// Sequences end to end, at most `budget` computed tokens.
    Packed {
        /// `micro_batch_tokens`.
        budget: u64,
    },
    /// A group's prompt once, its continuations after it.
    SharedPrefix {
        /// `micro_batch_tokens`.
        budget: u64,
    },
}

