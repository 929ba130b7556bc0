//! The memory plan: the bytes each process of a run will hold on its device,
//! item by item, from the placement ([`Plan`]), the recipe and the model's
//! `config.json` — no weights needed.
//!
//! `launcher plan TOPOLOGY --recipe R` prints it; `launcher up` refuses a run
//! whose plan does not fit a GPU's memory ([`MemoryPlan::check`]), naming the
//! process and its largest item. The capacity of a GPU comes from its node's
//! `gpu_type` ([`gpu_memory`]).
//!
//! What is counted, per process (every figure is what the code of this build
//! allocates, not what a better implementation could):
//!
//! - a **learner rank**: its parameters in `[learner] dtype`; the frozen
//!   reference (when the recipe has a KL term); gradients (the whole float32
//!   flat buffer on every rank — each float32 parameter's `.grad` is a view of
//!   it — plus bf16 `.grad`s with bf16 parameters); AdamW's two moments and, with bf16
//!   parameters, float32 master weights, divided by the ranks under
//!   `[learner] shard`; the activations of one micro-batch (below); on rank 0
//!   the float32 weight image it publishes;
//! - a **rollout actor**: its float32 weights, the KV cache of one request
//!   (`groups_per_step × group_size` rows of a whole sequence), the largest
//!   transient of a prefill over those rows (one layer's MLP), and the
//!   received weight image;
//! - on a GPU, the CUDA context ([`CUDA_CONTEXT_BYTES`]).
//!
//! Activations: a micro-batch of the RL phase, laid out as the learner lays
//! it out (`pack`, `shared_prefix`, `micro_batch_tokens`) with whole groups of
//! an assumed prompt length ([`Assumptions::prompt_tokens`]) and every rollout
//! as long as the recipe allows (`max_new_tokens × max_turns + 256` tokens
//! after the prompt). Per decoder layer autograd keeps, per computed token,
//! `6h + 4i + 3q + 2k + heads + 2` float32 elements (`h` the width, `i` the MLP
//! width, `q`/`k` the query and key/value widths: the norms' inputs, outputs
//! and scales, the attention's gathered queries, keys, values, output and
//! log-sum-exp, the output projection's input, the MLP's four `[tokens, i]`
//! tensors; with bf16 parameters `16h + 8i + 6q + 4k + 4·heads + 8` bytes, the
//! norms computing in float32), and two key/value widths per extra key slot a
//! shared prompt is gathered into; counted from libtorch's saved tensors of
//! exactly these operations (a `saved_tensors_hooks` probe of the same graph). The output
//! head keeps the picked hidden states and three `[targets, vocab]` float32
//! tensors at its peak (log-softmax, its gradient, the logits' gradient).
//! With `checkpoint_activations` a layer keeps only its input, and one
//! layer's full set exists while it is recomputed, after the output head's
//! tensors are gone: the larger of the two counts.
use super::plan::Plan;
use super::recipe::Recipe;
pub use super::shape::{MicroLayout, MicroShape, ModelShape};
use super::topology::{Device, Role, Topology};
use crate::learner::config::{Precision, Shard};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The CUDA context and libraries a process on a GPU holds before its first
/// tensor (about 0.5 GiB for libtorch with lazy module loading).
pub const CUDA_CONTEXT_BYTES: u64 = 512 << 20;

/// Rows per padded RL micro-batch (`[learner] pack = false`), as the run configures the learner.
pub const PADDED_RL_ROWS: usize = 16;

/// Bytes of one float32 element.
const F32: u64 = 4;

/// GPU memory by type, in MiB as `nvidia-smi` reports the total of each board.
const GPU_MIB: &[(&str, u64)] = &[
    ("H100", 81_559),
    ("H100-80GB", 81_559),
    ("H100-SXM", 81_559),
    ("H100-NVL", 95_830),
    ("H100-94GB", 95_830),
    ("H200", 143_771),
    ("H200-141GB", 143_771),
    ("A100-80GB", 81_920),
    ("A100-40GB", 40_960),
    ("L40S", 46_068),
    ("L4", 23_034),
    ("A10G", 23_028),
];

/// Normalises a GPU type for lookup: upper case, without spaces, `-` and `_`.
fn gpu_key(name: &str) -> String {
    name.chars().filter(|c| !matches!(c, ' ' | '-' | '_')).flat_map(char::to_uppercase).collect()
}

/// The memory of one GPU of `gpu_type` in bytes: from the table above, else
/// from a size the name spells (`"MI300X-192GB"`: 192 GiB); `None` when the
/// name says neither (`"any"`, or `"A100"`, which comes in 40 and 80 GB).
pub fn gpu_memory(gpu_type: &str) -> Option<u64> {
    let key = gpu_key(gpu_type);
    if let Some((_, mib)) = GPU_MIB.iter().find(|(n, _)| gpu_key(n) == key) {
        return Some(mib << 20);
    }
    let digits = key.strip_suffix("GB")?;
    let start = digits.rfind(|c: char| !c.is_ascii_digit()).map_or(0, |i| i + 1);
    digits[start..].parse::<u64>().ok().filter(|&g| g > 0).map(|g| g << 30)
}

/// What the plan assumes where the recipe does not say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assumptions {
    /// Tokens of a task's prompt (system prompt with tool schemas and the task), default 512.
    pub prompt_tokens: u64,
}

impl Default for Assumptions {
    fn default() -> Self {
        Assumptions { prompt_tokens: 512 }
    }
}

/// The learner-side facts the plan needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LearnerMemory {
    /// Data-parallel ranks.
    pub world: u64,
    /// What is split across them.
    pub shard: Shard,
    /// Parameter dtype.
    pub dtype: Precision,
    /// Layers recomputed in the backward.
    pub checkpoint_activations: bool,
    /// A frozen reference policy is held (KL to the reference).
    pub reference: bool,
    /// The micro-batch.
    pub micro: MicroShape,
}

/// One thing a process holds, and its size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryItem {
    /// What it is.
    pub what: String,
    /// Bytes.
    pub bytes: u64,
}

fn item(what: &str, bytes: u64) -> MemoryItem {
    MemoryItem { what: what.to_string(), bytes }
}

/// The learner rank's items (weight image excluded: see [`MemoryPlan::of`]).
pub fn learner_items(m: &ModelShape, l: &LearnerMemory) -> Vec<MemoryItem> {
    let params = m.parameters();
    let b = l.dtype.bytes();
    let low = l.dtype != Precision::Float32;
    let shard = if l.shard.splits_optimizer() { params.div_ceil(l.world.max(1)) } else { params };
    let mut out = vec![item("weights", params * b)];
    if l.reference {
        out.push(item("reference weights", params * b));
    }
    // float32 parameters: their `.grad`s are views of the flat float32 buffer;
    // bf16 parameters keep bf16 `.grad`s and the flat float32 buffer beside them.
    // Every rank keeps the whole flat buffer (ZeRO-2 here reduce-scatters it in
    // place: it moves half the bytes of an all-reduce, it holds as many).
    out.push(item("gradients", params * F32 + if low { params * b } else { 0 }));
    out.push(item("optimizer state", shard * F32 * if low { 3 } else { 2 }));
    let head = head_bytes(m, l.micro, b);
    if l.checkpoint_activations {
        // The output head's tensors are freed before the first layer is recomputed.
        out.push(item("activations", activation_bytes(m, l.micro, b, true)));
        out.push(item("output head or recomputed layer", head.max(layer_bytes(m, l.micro, b))));
    } else {
        out.push(item("activations", activation_bytes(m, l.micro, b, false)));
        out.push(item("output head", head));
    }
    out
}

/// Bytes autograd keeps per computed token in one decoder layer with parameters of
/// `b` bytes (module doc): per RMSNorm its input, normalised values and output (float32),
/// or with bf16 its float32 upcast and two bf16 tensors, and a float32 scale; the
/// attention's gathered query, key, value, output and the output projection's input,
/// and a float32 log-sum-exp per head; the MLP's four `[tokens, i]` tensors.
fn layer_bytes_per_token(m: &ModelShape, b: u64) -> u64 {
    let norm = if b == F32 { 3 * m.hidden * F32 } else { m.hidden * F32 + 2 * m.hidden * b } + F32;
    2 * norm + (3 * m.q_dim() + 2 * m.kv_dim()) * b + m.heads * F32 + 4 * m.intermediate * b
}

/// What one decoder layer keeps of a micro-batch, in bytes.
fn layer_bytes(m: &ModelShape, s: MicroShape, b: u64) -> u64 {
    s.tokens * layer_bytes_per_token(m, b) + s.extra_keys * 2 * m.kv_dim() * b
}

/// The decoder layers' saved activations of one micro-batch, in bytes: every
/// layer's, or with `checkpoint` each layer's input only (the layer recomputed in
/// the backward comes after the output head's tensors are freed: [`learner_items`]).
pub fn activation_bytes(m: &ModelShape, s: MicroShape, b: u64, checkpoint: bool) -> u64 {
    let saved = if checkpoint { m.layers * s.tokens * m.hidden * b } else { m.layers * layer_bytes(m, s, b) };
    // Shared by the layers: RoPE tables, and the final norm's tensors.
    let shared = s.tokens * (2 * m.head_dim * b + 3 * m.hidden * F32) + s.mask_bytes;
    saved + shared
}

/// The output head at its peak: the picked hidden states and three `[targets, vocab]`
/// float32 tensors (bf16 logits beside them with bf16 parameters).
pub fn head_bytes(m: &ModelShape, s: MicroShape, b: u64) -> u64 {
    let logits = s.targets * m.vocab;
    s.targets * m.hidden * b + 3 * logits * F32 + if b != F32 { logits * b } else { 0 }
}

/// The rollout actor's items: float32 weights, the KV cache of one request and
/// the prefill's largest transient (one layer's MLP over every row).
pub fn rollout_items(m: &ModelShape, rows: u64, sequence: u64) -> Vec<MemoryItem> {
    let kv = rows * sequence * 2 * m.layers * m.kv_dim() * F32;
    let prefill = rows * sequence * (4 * m.intermediate + 3 * m.hidden) * F32;
    vec![item("weights", m.parameters() * F32), item("KV cache", kv), item("prefill activations", prefill)]
}

/// The bytes one process holds on one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMemory {
    /// `node/process`.
    pub process: String,
    /// The node.
    pub node: String,
    /// The roles of its actors on this device (`learner`, `rollout`, joined by `+`).
    pub roles: String,
    /// Its device: `cpu` (host memory) or `gpu:N`.
    pub device: String,
    /// The GPU's type, when on a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// The device's memory (None: host memory, or a GPU type the table does not know).
    pub capacity: Option<u64>,
    /// What it holds.
    pub items: Vec<MemoryItem>,
    /// Their sum.
    pub total: u64,
}

impl ProcessMemory {
    /// The largest item.
    pub fn largest(&self) -> Option<&MemoryItem> {
        self.items.iter().max_by_key(|i| i.bytes)
    }
}

/// Why a plan does not fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overflow {
    /// The process over its device's memory (the largest holder on a shared GPU).
    pub process: String,
    /// Its actors' roles.
    pub roles: String,
    /// Its device.
    pub device: String,
    /// What everything on that device needs.
    pub needed: u64,
    /// The device's memory.
    pub capacity: u64,
    /// The process's largest item.
    pub largest: MemoryItem,
}

impl std::fmt::Display for Overflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} needs {} on {}, which holds {}; its largest item is {} ({})",
            self.process,
            human(self.needed),
            self.device,
            human(self.capacity),
            self.largest.what,
            human(self.largest.bytes)
        )
    }
}

/// Per process, the bytes a run will hold on its device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// The model directory (or `tiny`).
    pub model: String,
    /// Its shape.
    pub shape: ModelShape,
    /// Trained parameters.
    pub parameters: u64,
    /// The learner's settings.
    pub learner: LearnerMemory,
    /// Rows of one rollout request (`groups_per_step × group_size`).
    pub rollout_rows: u64,
    /// Tokens of the longest sequence (prompt and everything after it, within the context).
    pub sequence_tokens: u64,
    /// What the plan assumed.
    pub assumptions: Assumptions,
    /// Every process that holds something on a device.
    pub processes: Vec<ProcessMemory>,
}

impl MemoryPlan {
    /// The memory plan of `recipe` placed by `plan` on `topology`'s nodes.
    pub fn of(plan: &Plan, topology: &Topology, recipe: &Recipe, shape: ModelShape, assumptions: Assumptions) -> MemoryPlan {
        let nodes = topology.node_index();
        let parameters = shape.parameters();
        let after_prompt = (recipe.rl.max_new_tokens * recipe.rl.max_turns + 256) as u64;
        let sequence = (assumptions.prompt_tokens + after_prompt).min(shape.max_positions.max(1));
        let prompt = assumptions.prompt_tokens.min(sequence.saturating_sub(1));
        let micro = MicroShape::of_recipe(recipe, prompt, sequence - prompt);
        let learner = LearnerMemory {
            world: u64::from(plan.world_size.max(1)),
            shard: recipe.learner.shard,
            // Unset: bf16 where the learner ranks are on GPUs.
            dtype: recipe.learner.dtype.unwrap_or(Precision::default_on(plan.processes.iter().flat_map(|p| &p.actors).any(|a| a.role == Role::Learner && a.device != Device::Cpu))),
            checkpoint_activations: recipe.learner.checkpoint_activations,
            reference: recipe.estimator.kl_coef > 0.0,
            micro,
        };
        let rows = (recipe.rl.groups_per_step * recipe.rl.group_size) as u64;
        let nccl_weights = plan.weight_transport == super::plan::WeightTransport::Nccl;
        let image = parameters * F32;
        let mut processes = Vec::new();
        for p in &plan.processes {
            let mut by_device: BTreeMap<String, (Vec<MemoryItem>, Vec<String>)> = BTreeMap::new();
            for a in &p.actors {
                let on_gpu = a.device != Device::Cpu;
                let items: Vec<MemoryItem> = match a.role {
                    Role::Learner => {
                        let mut v = learner_items(&shape, &learner);
                        // Rank 0 packs each version it publishes (on its GPU for an NCCL group).
                        if a.rank == 0 && (nccl_weights || !on_gpu) {
                            v.push(item("weight-sync image", image));
                        }
                        v
                    }
                    Role::Rollout => {
                        let mut v = rollout_items(&shape, rows, sequence);
                        if nccl_weights || !on_gpu {
                            v.push(item("weight-sync receive buffer", image));
                        }
                        v
                    }
                    _ => continue,
                };
                let (entry, roles) = by_device.entry(a.device.to_string()).or_default();
                if !roles.contains(&a.role.to_string()) {
                    roles.push(a.role.to_string());
                }
                if on_gpu && entry.is_empty() {
                    entry.push(item("CUDA context", CUDA_CONTEXT_BYTES));
                }
                // Several actors of one kind in a process on one device: name each item once, summed.
                for it in items {
                    match entry.iter_mut().find(|e| e.what == it.what) {
                        Some(e) => e.bytes += it.bytes,
                        None => entry.push(it),
                    }
                }
            }
            for (device, (items, roles)) in by_device {
                let gpu_type = (device != "cpu").then(|| nodes.get(p.node.as_str()).and_then(|n| n.gpu_type.clone())).flatten();
                let capacity = gpu_type.as_deref().and_then(gpu_memory);
                let total = items.iter().map(|i| i.bytes).sum();
                processes.push(ProcessMemory { process: p.name.clone(), node: p.node.clone(), roles: roles.join("+"), device, gpu_type, capacity, items, total });
            }
        }
        MemoryPlan {
            model: recipe.model.path.clone(),
            shape,
            parameters,
            learner,
            rollout_rows: rows,
            sequence_tokens: sequence,
            assumptions,
            processes,
        }
    }

    /// Every GPU's processes fit its memory; else every GPU that does not, each
    /// with the process holding the most on it and that process's largest item.
    pub fn check(&self) -> Result<(), Vec<Overflow>> {
        let mut devices: BTreeMap<(&str, &str), Vec<&ProcessMemory>> = BTreeMap::new();
        for p in self.processes.iter().filter(|p| p.device != "cpu") {
            devices.entry((p.node.as_str(), p.device.as_str())).or_default().push(p);
        }
        let mut over = Vec::new();
        for ((node, device), procs) in devices {
            let needed: u64 = procs.iter().map(|p| p.total).sum();
            let Some(capacity) = procs[0].capacity else { continue };
            if needed > capacity {
                let worst = procs.iter().max_by_key(|p| p.total).expect("a device has a process");
                over.push(Overflow {
                    process: worst.process.clone(),
                    roles: worst.roles.clone(),
                    device: format!("{device} of {node} ({})", worst.gpu_type.as_deref().unwrap_or("?")),
                    needed,
                    capacity,
                    largest: worst.largest().cloned().unwrap_or_else(|| item("nothing", 0)),
                });
            }
        }
        if over.is_empty() {
            Ok(())
        } else {
            Err(over)
        }
    }

    /// The first overflow of each kind of process (by roles), and how many more there are.
    pub fn describe(over: &[Overflow]) -> String {
        let mut seen: Vec<&str> = Vec::new();
        let mut parts = Vec::new();
        for o in over {
            if !seen.contains(&o.roles.as_str()) {
                seen.push(&o.roles);
                parts.push(o.to_string());
            }
        }
        let more = over.len() - parts.len();
        let tail = if more > 0 { format!(" (and {more} more GPU(s) like these)") } else { String::new() };
        format!("{}{tail}", parts.join("; "))
    }

    /// GPUs whose type names no known memory size (their plan is not checked).
    pub fn unknown_gpus(&self) -> Vec<String> {
        let mut v: Vec<String> = self.processes.iter().filter(|p| p.device != "cpu" && p.capacity.is_none()).map(|p| p.gpu_type.clone().unwrap_or_else(|| "(no gpu_type)".into())).collect();
        v.sort();
        v.dedup();
        v
    }

    /// A human table: what was assumed, then one line per process and device.
    pub fn table(&self) -> String {
        let l = &self.learner;
        let m = &l.micro;
        let mut out = format!(
            "memory plan: {} ({:.3} B parameters); learner: {} rank(s), shard {}, {}, activations {}; RL micro-batch {} tokens computed, {} trained (prompt {} tokens assumed, sequences up to {}); rollout requests of {} rows\n",
            self.model,
            self.parameters as f64 / 1e9,
            l.world,
            l.shard.name(),
            l.dtype.name(),
            if l.checkpoint_activations { "recomputed per layer" } else { "kept" },
            m.tokens,
            m.targets,
            self.assumptions.prompt_tokens,
            self.sequence_tokens,
            self.rollout_rows,
        );
        let rows: Vec<[String; 5]> = std::iter::once(["PROCESS", "DEVICE", "TOTAL", "CAPACITY", "FITS"].map(String::from))
            .chain(self.processes.iter().map(|p| {
                let device = match &p.gpu_type {
                    Some(t) => format!("{} ({t})", p.device),
                    None => p.device.clone(),
                };
                let (cap, fits) = match p.capacity {
                    Some(c) => (human(c), if p.total <= c { "yes" } else { "NO" }.to_string()),
                    None => ("-".into(), "-".into()),
                };
                [p.process.clone(), device, human(p.total), cap, fits]
            }))
            .collect();
        let widths: Vec<usize> = (0..5).map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
        for (i, r) in rows.iter().enumerate() {
            let cells: Vec<String> = r.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
            let _ = write!(out, "{}", cells.join("  "));
            if i > 0 {
                let p = &self.processes[i - 1];
                let items: Vec<String> = p.items.iter().map(|it| format!("{} {}", it.what, human(it.bytes))).collect();
                let _ = write!(out, "  {}", items.join(", "));
            }
            out.push('\n');
        }
        out
    }
}

/// Bytes in binary units, one decimal (`1.5 GiB`).
pub fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlmesh_model::config::ModelConfig;
    use std::path::Path;

    #[test]
    fn gpu_types_name_their_memory() {
        assert_eq!(gpu_memory("H100-80GB"), Some(81_559 << 20));
        assert_eq!(gpu_memory("h100 80gb"), Some(81_559 << 20));
        assert_eq!(gpu_memory("H200"), Some(143_771 << 20));
        assert_eq!(gpu_memory("A100-40GB"), Some(40_960 << 20));
        assert_eq!(gpu_memory("A100_80GB"), Some(81_920 << 20));
        assert_eq!(gpu_memory("MI300X-192GB"), Some(192 << 30));
        assert_eq!(gpu_memory("A100"), None, "A100 comes in 40 and 80 GB");
        assert_eq!(gpu_memory("any"), None);
    }

    fn shape(dir: &str) -> ModelShape {
        ModelShape::of(&ModelConfig::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir)).unwrap())
    }

    /// The counts transformers reports for these models.
    #[test]
    fn parameter_counts_match_the_published_models() {
        assert_eq!(shape("deploy/models/qwen2.5-7b").parameters(), 7_615_616_512);
        let smollm2 = ModelShape {
            vocab: 49_152,
            hidden: 576,
            intermediate: 1536,
            layers: 30,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            tied: true,
            max_positions: 8192,
        };
        assert_eq!(smollm2.parameters(), 134_515_008);
    }

    /// ZeRO divides AdamW's state by the ranks; bf16 halves the weights and adds master weights.
    #[test]
    fn sharding_and_precision_change_what_a_rank_holds() {
        let m = shape("deploy/models/qwen2.5-7b");
        let p = m.parameters();
        let get = |items: &[MemoryItem], what: &str| items.iter().find(|i| i.what == what).map(|i| i.bytes).unwrap();
        let base = LearnerMemory { world: 16, shard: Shard::None, dtype: Precision::Float32, checkpoint_activations: false, reference: false, micro: MicroShape::default() };
        let plain = learner_items(&m, &base);
        assert_eq!(get(&plain, "weights"), 4 * p);
        assert_eq!(get(&plain, "gradients"), 4 * p);
        assert_eq!(get(&plain, "optimizer state"), 8 * p);
        let zero1 = learner_items(&m, &LearnerMemory { shard: Shard::Optimizer, ..base });
        assert_eq!(get(&zero1, "optimizer state"), 8 * p.div_ceil(16));
        let bf16 = learner_items(&m, &LearnerMemory { shard: Shard::Gradients, dtype: Precision::Bf16, ..base });
        assert_eq!(get(&bf16, "weights"), 2 * p);
        assert_eq!(get(&bf16, "gradients"), 2 * p + 4 * p);
        assert_eq!(get(&bf16, "optimizer state"), 12 * p.div_ceil(16));
    }

    #[test]
    fn human_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
