//! The decoder-only transformer (Qwen2 / Llama families), numerically matching
//! transformers' eager PyTorch code.
//!
//! Parameters live in a `tch::nn::VarStore` under the Hugging Face names
//! (`model.layers.3.self_attn.q_proj.weight`, …), so loading, saving, the
//! optimiser and the weight digest all see the same names.
//!
//! Activation checkpointing ([`Transformer::checkpointed`]): a training step
//! may keep only each decoder layer's input instead of everything autograd
//! saves inside the layers, and recompute one layer at a time in the backward.
//! libtorch offers no custom autograd function through tch, so the backward of
//! the layers is run by hand: the forward keeps the inputs and hands the loss
//! a leaf for the last layer's output; after the loss's backward has filled
//! that leaf's gradient, the same forward call is made again and, layer by
//! layer from the last, recomputes the layer on its saved input and
//! backpropagates the gradient through it (parameter gradients accumulate as
//! in one backward), ending in the embedding.
use crate::cache::KvCache;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use tch::{nn, Device, Kind, Tensor};

pub(crate) struct Linear {
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
}

impl Linear {
    fn new(p: nn::Path, in_dim: i64, out_dim: i64, bias: bool) -> Self {
        let weight = p.var("weight", &[out_dim, in_dim], nn::Init::Randn { mean: 0.0, stdev: 0.02 });
        let bias = bias.then(|| p.var("bias", &[out_dim], nn::Init::Const(0.0)));
        Linear { weight, bias }
    }
    fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.weight, self.bias.as_ref())
    }
}

pub(crate) struct RmsNorm {
    pub(crate) weight: Tensor,
    pub(crate) eps: f64,
}

impl RmsNorm {
    fn new(p: nn::Path, dim: i64, eps: f64) -> Self {
        RmsNorm { weight: p.var("weight", &[dim], nn::Init::Const(1.0)), eps }
    }
    /// transformers' LlamaRMSNorm / Qwen2RMSNorm: statistics in float32, scale in the input dtype.
    fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        if kind == Kind::Float && self.weight.kind() == Kind::Float {
            // libtorch's fused kernel: the same float32 arithmetic in one pass.
            return x.rms_norm([x.size()[x.dim() - 1]], Some(&self.weight), self.eps);
        }
        let h = x.to_kind(Kind::Float);
        let var = h.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        let h = h * (var + self.eps).rsqrt();
        &self.weight * h.to_kind(kind)
    }
}

pub(crate) struct Layer {
    pub(crate) input_norm: RmsNorm,
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    pub(crate) post_norm: RmsNorm,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

/// Where a checkpointed step stands (see the module doc).
enum Checkpoint {
    /// The next forward keeps each layer's input only.
    Forward,
    /// The forward ran: the layers' inputs, and the leaf the loss saw as the last layer's output.
    Saved { inputs: Vec<Tensor>, top: Tensor },
    /// The loss's backward ran: the next forward recomputes and backpropagates the layers.
    Backward { inputs: Vec<Tensor>, top: Tensor },
}

/// The policy network.
pub struct Transformer {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// All trainable parameters, under their Hugging Face names.
    pub vs: nn::VarStore,
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: RmsNorm,
    lm_head: Tensor,
    inv_freq: Tensor,
    /// Activation checkpointing's state during a checkpointed step.
    checkpoint: std::sync::Mutex<Option<Checkpoint>>,
}

/// Token positions and the attention mask for one forward call.
pub struct Batch {
    /// Token ids `[B, T]` (int64).
    pub ids: Tensor,
    /// Position ids `[B, T]` (int64).
    pub positions: Tensor,
    /// Boolean mask `[B, 1, T, S]`: query t may attend key slot s (S counts cached slots too);
    /// an undefined tensor (`Tensor::new()`) when nothing is padded: plain causal attention
    /// over every slot, which libtorch runs without building or reading a mask.
    pub mask: Tensor,
}

impl Batch {
    /// A batch from ids and their validity `[B, T]` (no cache before it): positions from
    /// the validity, and an explicit mask only when some position is padding.
    pub fn new(ids: &Tensor, valid: &Tensor) -> Batch {
        let padded = !bool::try_from(valid.all()).unwrap_or(false);
        Batch { ids: ids.shallow_clone(), positions: positions_from_valid(valid), mask: if padded { causal_mask(valid) } else { Tensor::new() } }
    }

    /// A batch whose rows are padded only at the end (the learner's batches): plain
    /// causal attention is exact for every valid position — a valid query only sees
    /// earlier keys, all valid — so no mask is built or read. Outputs at padding
    /// positions are meaningless and must not be used.
    pub fn right_padded(ids: &Tensor) -> Batch {
        let (b, t) = ids.size2().expect("ids are [B, T]");
        let positions = Tensor::arange(t, (Kind::Int64, ids.device())).unsqueeze(0).expand([b, t], false);
        Batch { ids: ids.shallow_clone(), positions, mask: Tensor::new() }
    }
}

impl Transformer {
    /// A model with freshly initialised weights (normal(0, 0.02), norms at 1) on `device` in `kind`.
    pub fn new(config: ModelConfig, device: Device, kind: Kind) -> Self {
        let mut vs = nn::VarStore::new(device);
        let c = &config;
        let root = vs.root();
        let model = &root / "model";
        let embed = (&model / "embed_tokens").var("weight", &[c.vocab_size, c.hidden_size], nn::Init::Randn { mean: 0.0, stdev: 0.02 });
        let q_dim = c.num_heads * c.head_dim;
        let kv_dim = c.num_kv_heads * c.head_dim;
        let layers = (0..c.num_layers)
            .map(|i| {
                let p = &model / "layers" / i;
                let attn = &p / "self_attn";
                let mlp = &p / "mlp";
                Layer {
                    input_norm: RmsNorm::new(&p / "input_layernorm", c.hidden_size, c.rms_norm_eps),
                    q: Linear::new(&attn / "q_proj", c.hidden_size, q_dim, c.qkv_bias),
                    k: Linear::new(&attn / "k_proj", c.hidden_size, kv_dim, c.qkv_bias),
                    v: Linear::new(&attn / "v_proj", c.hidden_size, kv_dim, c.qkv_bias),
                    o: Linear::new(&attn / "o_proj", q_dim, c.hidden_size, c.o_bias),
                    post_norm: RmsNorm::new(&p / "post_attention_layernorm", c.hidden_size, c.rms_norm_eps),
                    gate: Linear::new(&mlp / "gate_proj", c.hidden_size, c.intermediate_size, c.mlp_bias),
                    up: Linear::new(&mlp / "up_proj", c.hidden_size, c.intermediate_size, c.mlp_bias),
                    down: Linear::new(&mlp / "down_proj", c.intermediate_size, c.hidden_size, c.mlp_bias),
                }
            })
            .collect();
        let norm = RmsNorm::new(&model / "norm", c.hidden_size, c.rms_norm_eps);
        let lm_head = if c.tie_word_embeddings {
            embed.shallow_clone()
        } else {
            (&root / "lm_head").var("weight", &[c.vocab_size, c.hidden_size], nn::Init::Randn { mean: 0.0, stdev: 0.02 })
        };
        // inv_freq as transformers computes it: 1 / θ^(arange(0, d, 2) / d), in float32.
        let inv_freq = (Tensor::arange_start_step(0, c.head_dim, 2, (Kind::Int64, device)).to_kind(Kind::Float) / c.head_dim as f64)
            .to_kind(Kind::Float);
        let inv_freq = Tensor::from(c.rope_theta).to_kind(Kind::Float).to_device(device).pow(&inv_freq).reciprocal();
        if kind != Kind::Float {
            vs.set_kind(kind);
        }
        Transformer { config, vs, embed, layers, norm, lm_head, inv_freq, checkpoint: std::sync::Mutex::new(None) }
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// The parameter dtype.
    pub fn kind(&self) -> Kind {
        self.embed.kind()
    }

    /// Names of the tensors a checkpoint must hold (tied `lm_head` excluded).
    pub fn parameter_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.vs.variables().into_keys().collect();
        names.sort();
        names
    }

    /// cos/sin tables `[B, 1, T, head_dim]` for the given positions (float32 math, then the
    /// model dtype); the first half of sin is negated, as rotate_half negates that half of x.
    pub(crate) fn rope(&self, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * self.inv_freq.view([1, 1, -1]);
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        let sin = freqs.sin();
        let signed_sin = Tensor::cat(&[&sin.neg(), &sin], -1);
        (emb.cos().to_kind(kind).unsqueeze(1), signed_sin.to_kind(kind).unsqueeze(1))
    }

    /// Logits `[B, T, V]` for a batch; with a cache, the new keys/values are
    /// appended at the cache's current length and attention covers all cached slots.
    pub fn forward(&self, batch: &Batch, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let hidden = self.hidden_states(batch, cache)?;
        Ok(hidden.linear::<Tensor>(&self.lm_head, None))
    }

    /// Final hidden states `[B, T, H]` (after the last norm).
    pub fn hidden_states(&self, batch: &Batch, mut cache: Option<&mut KvCache>) -> Result<Tensor> {
        let c = &self.config;
        let (b, t) = batch.ids.size2()?;
        let kind = self.kind();
        let x = Tensor::embedding(&self.embed, &batch.ids, -1, false, false);
        let (cos, sin) = self.rope(&batch.positions, kind);
        let start = cache.as_ref().map(|c| c.len()).unwrap_or(0);
        if let Some(cache) = cache.as_ref() {
            if start + t as usize > cache.capacity() {
                return Err(ModelError::Input(format!(
                    "KV cache holds {} slots, {} used, {} more requested",
                    cache.capacity(),
                    start,
                    t
                )));
            }
        }
        // Without padding: nothing to mask for one query per row; libtorch's causal path for a
        // fresh sequence; after cached slots, query i sees slots up to start + i.
        let unmasked = !batch.mask.defined();
        let is_causal = unmasked && t > 1 && start == 0;
        let mask = if !unmasked {
            Some(batch.mask.shallow_clone())
        } else if t > 1 && start > 0 {
            let s = start as i64 + t;
            Some(Tensor::ones([t, s], (Kind::Bool, batch.ids.device())).tril(start as i64).view([1, 1, t, s]))
        } else {
            None
        };
        let x = self.layers_forward(x, |i, q, k, v| {
            let q = q.view([b, t, c.num_heads, c.head_dim]).transpose(1, 2);
            let k = k.view([b, t, c.num_kv_heads, c.head_dim]).transpose(1, 2);
            let v = v.view([b, t, c.num_kv_heads, c.head_dim]).transpose(1, 2);
            let q = &q * &cos + swap_halves(&q) * &sin;
            let k = &k * &cos + swap_halves(&k) * &sin;
            let (k, v) = match cache.as_deref_mut() {
                Some(cache) => cache.append(i, start, &k, &v),
                None => (k, v),
            };
            let attn = Tensor::scaled_dot_product_attention(&q, &k, &v, mask.as_ref(), 0.0, is_causal, None, c.num_kv_heads != c.num_heads);
            attn.transpose(1, 2).reshape([b, t, c.num_heads * c.head_dim])
        });
        if let Some(cache) = cache {
            cache.advance(t);
        }
        Ok(x)
    }

    /// The decoder layers and the final norm over embeddings `x`; `attend(layer, q, k, v)`
    /// gets each layer's query, key and value projections (before RoPE) and returns the
    /// attention output in `x`'s token layout, before the output projection.
    /// Inside [`Transformer::checkpointed`] it keeps only the layers' inputs, or
    /// (its second call) recomputes and backpropagates the layers.
    pub(crate) fn layers_forward(&self, mut x: Tensor, mut attend: impl FnMut(usize, &Tensor, &Tensor, &Tensor) -> Tensor) -> Tensor {
        let state = self.checkpoint.lock().expect("checkpoint state").take();
        match state {
            None => {
                for (i, layer) in self.layers.iter().enumerate() {
                    x = self.layer_forward(i, layer, &x, &mut attend);
                }
                self.norm.forward(&x)
            }
            Some(Checkpoint::Forward) => {
                let mut inputs = Vec::with_capacity(self.layers.len());
                tch::no_grad(|| {
                    for (i, layer) in self.layers.iter().enumerate() {
                        let input = x.detach();
                        x = self.layer_forward(i, layer, &input, &mut attend);
                        inputs.push(input);
                    }
                });
                let top = x.detach().set_requires_grad(true);
                let out = self.norm.forward(&top);
                *self.checkpoint.lock().expect("checkpoint state") = Some(Checkpoint::Saved { inputs, top });
                out
            }
            Some(Checkpoint::Backward { inputs, top }) => {
                let mut grad = top.grad();
                for (i, input) in inputs.into_iter().enumerate().rev() {
                    let input = input.set_requires_grad(true);
                    let out = self.layer_forward(i, &self.layers[i], &input, &mut attend);
                    (out * &grad).sum(Kind::Float).backward();
                    grad = input.grad();
                }
                // The embedding's gradient, through `x`'s own graph.
                (&x * &grad).sum(Kind::Float).backward();
                top
            }
            Some(saved @ Checkpoint::Saved { .. }) => {
                *self.checkpoint.lock().expect("checkpoint state") = Some(saved);
                panic!("a checkpointed forward ran twice before its backward");
            }
        }
    }

    /// One decoder layer over its input `x`.
    #[allow(clippy::assign_op_pattern)] // `a = a + b` on tensors: `+=` would write in place into a tensor autograd or a view shares
    fn layer_forward(&self, i: usize, layer: &Layer, x: &Tensor, attend: &mut impl FnMut(usize, &Tensor, &Tensor, &Tensor) -> Tensor) -> Tensor {
        let h = layer.input_norm.forward(x);
        let attn = attend(i, &layer.q.forward(&h), &layer.k.forward(&h), &layer.v.forward(&h));
        let x = x + layer.o.forward(&attn);
        let h = layer.post_norm.forward(&x);
        &x + layer.down.forward(&(layer.gate.forward(&h).silu() * layer.up.forward(&h)))
    }

    /// A training step's forward and backward with activation checkpointing:
    /// `loss()` runs the forward (whose one call of this model's forward keeps
    /// only the decoder layers' inputs) and returns the loss; its backward is
    /// taken; then `forward()` must make the same forward call again, which
    /// recomputes the layers one at a time and backpropagates through them.
    /// Parameter gradients end as one backward of the plain forward leaves them.
    /// `loss()` returning `None` (nothing to train) skips both.
    pub fn checkpointed<E>(&self, loss: impl FnOnce() -> std::result::Result<Option<Tensor>, E>, forward: impl FnOnce() -> std::result::Result<Tensor, E>) -> std::result::Result<bool, E> {
        let set = |c: Option<Checkpoint>| *self.checkpoint.lock().expect("checkpoint state") = c;
        set(Some(Checkpoint::Forward));
        let out = loss();
        let state = self.checkpoint.lock().expect("checkpoint state").take();
        let Some(loss) = out? else { return Ok(false) };
        let Some(Checkpoint::Saved { inputs, top }) = state else { panic!("the checkpointed loss did not run this model's forward") };
        loss.backward();
        set(Some(Checkpoint::Backward { inputs, top }));
        let again = forward();
        set(None);
        again.map(|_| true)
    }

    /// The output projection `[V, H]` (the embedding when tied).
    pub(crate) fn lm_head(&self) -> &Tensor {
        &self.lm_head
    }

    /// Check that every id is inside the vocabulary.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if let Some(bad) = ids.iter().find(|&&i| i as i64 >= self.config.vocab_size) {
            return Err(ModelError::Input(format!("token id {bad} is out of range (vocab_size {})", self.config.vocab_size)));
        }
        Ok(())
    }
}

/// transformers' rotate_half without its negation (folded into the sin table): `[x2, x1]`.
pub(crate) fn swap_halves(x: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[&x2, &x1], -1)
}

/// Position ids from a validity mask `[B, T]`: `cumsum(valid) − 1`, 0 on padding (as transformers' generate).
pub fn positions_from_valid(valid: &Tensor) -> Tensor {
    (valid.to_kind(Kind::Int64).cumsum(1, Kind::Int64) - 1).clamp_min(0)
}

/// Causal mask `[B, 1, T, T]` over a batch with padding: a query attends to valid
/// earlier-or-same keys, and always to itself (padding rows stay finite).
pub fn causal_mask(valid: &Tensor) -> Tensor {
    let (_, t) = valid.size2().expect("valid mask is [B, T]");
    let device = valid.device();
    let causal = Tensor::ones([t, t], (Kind::Bool, device)).tril(0);
    let keys = valid.to_kind(Kind::Bool).unsqueeze(1).unsqueeze(1);
    let eye = Tensor::eye(t, (Kind::Bool, device));
    causal.logical_and(&keys).logical_or(&eye)
}
