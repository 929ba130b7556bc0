//! The memory plan's learner figures against what CPU training steps really hold.
//!
//! Each case runs in a fresh process of this test binary (the test runs itself
//! again with `RLMESH_MEMORY_PROBE` set), so nothing else lives in it. There,
//! glibc's mmap threshold is fixed at 64 KiB, so every large block freed leaves
//! the resident set at once and the resident set is the bytes held; the peak
//! resident set (`VmHWM`, reset through `/proc/self/clear_refs` after libtorch
//! has started) minus the resident set before the model is built is the
//! learner's peak. The plan ([`learner_items`]) must be within 15% of it.
use rlmesh_actors::controller::memory::{learner_items, human, LearnerMemory, MicroLayout, MicroShape, ModelShape};
use rlmesh_actors::learner::{AdamWConfig, Learner, LearnerConfig, Precision, Shard, TrainBatch, TrainSequence};
use rlmesh_model::config::ModelConfig;
use rlmesh_model::Transformer;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tch::{Device, Kind, Tensor};

const PROBE: &str = "RLMESH_MEMORY_PROBE";

/// One measured case: a model shape and a batch of whole groups in one micro-batch.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Case {
    name: String,
    hidden: i64,
    intermediate: i64,
    layers: i64,
    heads: i64,
    kv_heads: i64,
    vocab: i64,
    groups: usize,
    group: usize,
    prompt: usize,
    completion: usize,
    dtype: Precision,
    checkpoint: bool,
}

impl Case {
    fn config(&self) -> ModelConfig {
        let c = json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": self.vocab,
            "hidden_size": self.hidden, "intermediate_size": self.intermediate, "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu", "dtype": "float32"
        });
        ModelConfig::from_json(c, "memory-case/config.json".as_ref()).unwrap()
    }

    fn budget(&self) -> usize {
        self.groups * (self.prompt + self.group * self.completion)
    }

    /// Whole groups, every continuation token trained: one packed micro-batch.
    fn batch(&self) -> TrainBatch {
        let mut s = 7u64;
        let mut token = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            3 + (s >> 33) as u32 % (self.vocab as u32 - 3)
        };
        let groups: Vec<Vec<TrainSequence>> = (0..self.groups)
            .map(|_| {
                let prompt: Vec<u32> = (0..self.prompt).map(|_| token()).collect();
                (0..self.group)
                    .map(|_| {
                        let mut ids = prompt.clone();
                        ids.extend((0..self.completion).map(|_| token()));
                        let n = ids.len();
                        let mask: Vec<u8> = (0..n).map(|i| u8::from(i >= self.prompt)).collect();
                        TrainSequence {
                            advantages: mask.iter().map(|&m| f32::from(m) * 0.5).collect(),
                            behaviour_logprobs: vec![-4.0; n],
                            loss_mask: mask,
                            token_ids: ids,
                            ..Default::default()
                        }
                    })
                    .collect::<Vec<TrainSequence>>()
            })
            .collect();
        TrainBatch::of_groups(groups)
    }

    fn learner_config(&self) -> LearnerConfig {
        LearnerConfig {
            optim: AdamWConfig { lr: 1e-5, ..Default::default() },
            micro_batch_tokens: self.budget(),
            dtype: Some(self.dtype),
            checkpoint_activations: self.checkpoint,
            ..Default::default()
        }
    }

    /// What the plan says one rank holds.
    fn planned(&self, shard: Shard, world: u64) -> Vec<(String, u64)> {
        let shape = ModelShape::of(&self.config());
        let micro = MicroShape::of_groups(MicroLayout::SharedPrefix { budget: self.budget() as u64 }, self.prompt as u64, self.completion as u64, self.group as u64);
        let l = LearnerMemory { world, shard, dtype: self.dtype, checkpoint_activations: self.checkpoint, reference: false, micro };
        learner_items(&shape, &l).into_iter().map(|i| (i.what, i.bytes)).collect()
    }
}

/// What a probe process measured.
#[derive(Debug, Serialize, Deserialize)]
struct Measured {
    /// Resident bytes after the learner was built (weights, gradients, AdamW), over the baseline.
    built: u64,
    /// Peak resident bytes over the baseline, through a training step.
    peak: u64,
}

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// In the probe process: build the learner and take one step, measuring as the module doc says.
fn probe(case: &Case) -> Measured {
    // SAFETY: only changes glibc's thresholds, before any large allocation.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 10);
    }
    tch::set_num_threads(2);
    let batch = case.batch();
    // libtorch's threads, kernels and autograd engine start before the baseline.
    let w = Tensor::randn([64, 64], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    w.matmul(&w).sum(Kind::Float).backward();
    let base = status_kib("VmRSS:") * 1024;
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting the peak resident set (Linux ≥ 4.0)");
    tch::manual_seed(0);
    let model = Transformer::new(case.config(), Device::Cpu, case.dtype.kind());
    let mut learner = Learner::new(model, case.learner_config(), None).unwrap();
    let built = status_kib("VmRSS:") * 1024 - base;
    let stats = learner.train_step(&batch).unwrap();
    assert!(stats.loss.is_finite());
    assert_eq!(stats.computed_tokens, case.budget(), "one micro-batch of the whole batch");
    Measured { built, peak: status_kib("VmHWM:") * 1024 - base }
}

/// Runs `case` in a fresh process of this binary and returns what it measured.
fn measure(case: &Case) -> Measured {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "plan_of_a_learner_rank_is_within_15_percent_of_its_measured_peak", "--nocapture", "--test-threads=1"])
        .env(PROBE, serde_json::to_string(case).unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "probe {} failed:\n{stdout}\n{}", case.name, String::from_utf8_lossy(&out.stderr));
    // libtest may print the test's name on the same line first.
    let line = stdout.lines().find_map(|l| l.find("MEASURED ").map(|at| &l[at + "MEASURED ".len()..])).unwrap_or_else(|| panic!("no MEASURED line from the probe:\n{stdout}"));
    serde_json::from_str(line).unwrap()
}

fn within(planned: u64, measured: u64, tolerance: f64) -> bool {
    (planned as f64 - measured as f64).abs() <= tolerance * measured as f64
}

#[test]
fn plan_of_a_learner_rank_is_within_15_percent_of_its_measured_peak() {
    if let Ok(spec) = std::env::var(PROBE) {
        let m = probe(&serde_json::from_str(&spec).unwrap());
        println!("MEASURED {}", serde_json::to_string(&m).unwrap());
        return;
    }
    let smollm2 = Case {
        // SmolLM2-135M's shape (random weights), two groups of four with 96-token prompts and completions.
        name: "smollm2-135m".into(),
        hidden: 576,
        intermediate: 1536,
        layers: 30,
        heads: 9,
        kv_heads: 3,
        vocab: 49_152,
        groups: 2,
        group: 4,
        prompt: 96,
        completion: 96,
        dtype: Precision::Float32,
        checkpoint: false,
    };
    // A tiny model on a longer micro-batch: activations dominate.
    let tiny = Case { name: "tiny".into(), hidden: 256, intermediate: 768, layers: 4, heads: 4, kv_heads: 2, vocab: 4096, groups: 4, group: 8, prompt: 128, completion: 48, ..smollm2.clone() };
    let cases = [
        smollm2.clone(),
        Case { name: "smollm2-135m checkpointed".into(), checkpoint: true, ..smollm2 },
        tiny.clone(),
        Case { name: "tiny checkpointed".into(), checkpoint: true, ..tiny.clone() },
        Case { name: "tiny bf16".into(), dtype: Precision::Bf16, ..tiny },
    ];
    let mut activations = std::collections::BTreeMap::new();
    for case in &cases {
        let m = measure(case);
        let items = case.planned(Shard::None, 1);
        let planned: u64 = items.iter().map(|(_, b)| b).sum();
        let static_planned: u64 = items.iter().filter(|(w, _)| ["weights", "gradients", "optimizer state"].contains(&w.as_str())).map(|(_, b)| b).sum();
        let list: Vec<String> = items.iter().map(|(w, b)| format!("{w} {}", human(*b))).collect();
        eprintln!(
            "{}: built {} (planned {}), peak {} (planned {}: {}); off by {:+.1}%",
            case.name,
            human(m.built),
            human(static_planned),
            human(m.peak),
            human(planned),
            list.join(", "),
            100.0 * (planned as f64 / m.peak as f64 - 1.0)
        );
        // bf16 parameters get their bf16 gradients at the first backward, not when built.
        if case.dtype == Precision::Float32 {
            assert!(within(static_planned, m.built, 0.15), "{}: weights, gradients and AdamW planned {static_planned}, measured {}", case.name, m.built);
        }
        assert!(within(planned, m.peak, 0.15), "{}: planned peak {planned}, measured {}", case.name, m.peak);
        activations.insert(case.name.clone(), m.peak - m.built);
    }
    for name in ["smollm2-135m", "tiny"] {
        let (plain, kept) = (activations[name], activations[&format!("{name} checkpointed")]);
        eprintln!("{name}: a step's memory over the built learner {} plain, {} checkpointed ({:.0}% less)", human(plain), human(kept), 100.0 * (1.0 - kept as f64 / plain as f64));
        assert!(kept < plain, "{name}: checkpointing did not lower the step's peak");
    }
}
