//! Benchmark: training tokens/s of one learner step (forward, loss, backward,
//! optimizer) against the same step written in PyTorch eager
//! (`tests/oracle/loss_oracle.py bench`) on the same weights and batch, run in
//! the same invocation.
use super::batch::{TrainBatch, TrainSequence};
use super::config::{KlCoef, KlConfig, KlPlacement, LearnerConfig};
use super::error::{LearnerError, Result};
use super::loss::KlEstimator;
use super::trainer::{splitmix, Learner};
use rlmesh_model::Transformer;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;
use tch::{Device, Kind};

/// What to measure.
#[derive(Clone, Debug)]
pub struct LearnerBench {
    /// A transformers model directory.
    pub model_dir: PathBuf,
    /// The Python with PyTorch and transformers (the set-up's venv).
    pub python: PathBuf,
    /// `tests/oracle/loss_oracle.py`.
    pub script: PathBuf,
    /// Sequences per step.
    pub batch_size: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Leading tokens of each sequence outside the loss mask.
    pub prompt_len: usize,
    /// Timed steps (the median is reported).
    pub iters: usize,
    /// Untimed steps first.
    pub warmup: usize,
    /// CPU threads for both sides.
    pub threads: i32,
    /// Device for both sides.
    pub device: Device,
    /// Parameter dtype for both sides.
    pub kind: Kind,
    /// Rounds of (rlmesh's steps, then the peer's): the reported ratio is the median of
    /// the rounds' ratios, so a shared machine's drift between the two halves cancels.
    pub rounds: usize,
    /// Give the peer `torch.optim.AdamW(fused=True)` instead of its default (on CPU,
    /// the per-tensor loop of element-wise operations).
    pub peer_fused_adamw: bool,
}

/// Medians of both sides and their ratio.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    /// Model directory.
    pub model: String,
    /// Device, as text.
    pub device: String,
    /// Parameter dtype.
    pub dtype: String,
    /// Tokens per step.
    pub tokens_per_step: usize,
    /// rlmesh's median step time (s).
    pub ours_median_s: f64,
    /// rlmesh's tokens/s at the median.
    pub ours_tokens_per_s: f64,
    /// PyTorch eager's median step time (s).
    pub torch_median_s: f64,
    /// PyTorch eager's tokens/s at the median.
    pub torch_tokens_per_s: f64,
    /// Median over rounds of `torch_median_s / ours_median_s` (> 1: rlmesh is faster).
    pub ratio: f64,
    /// Each round's ratio.
    pub round_ratios: Vec<f64>,
    /// The peer's optimiser.
    pub peer_optimizer: String,
}

/// A deterministic policy-gradient batch of `batch` sequences of `seq_len` tokens with ids in `3..vocab`.
pub fn synthetic_batch(vocab: i64, batch: usize, seq_len: usize, prompt_len: usize, seed: u64) -> TrainBatch {
    let mut s = seed;
    let mut unit = move || (splitmix(&mut s) >> 11) as f64 / (1u64 << 53) as f64;
    let sequences = (0..batch)
        .map(|_| {
            let token_ids: Vec<u32> = (0..seq_len).map(|_| 3 + (unit() * (vocab - 3) as f64) as u32).collect();
            let loss_mask: Vec<u8> = (0..seq_len).map(|i| (i >= prompt_len.max(1)) as u8).collect();
            synthetic_sequence(token_ids, loss_mask, &mut unit)
        })
        .collect();
    TrainBatch { sequences, ..Default::default() }
}

/// A sequence of the benchmarks' batches: one advantage in [−1, 1) on every trained token,
/// behaviour and reference log-probs near −12 (a random model's), drawn from `unit`.
pub(crate) fn synthetic_sequence(token_ids: Vec<u32>, loss_mask: Vec<u8>, unit: &mut dyn FnMut() -> f64) -> TrainSequence {
    let n = token_ids.len();
    let adv = (unit() * 2.0 - 1.0) as f32;
    TrainSequence {
        advantages: loss_mask.iter().map(|&m| m as f32 * adv).collect(),
        behaviour_logprobs: (0..n).map(|_| (-12.0 + unit()) as f32).collect(),
        ref_logprobs: Some((0..n).map(|_| (-12.0 + unit()) as f32).collect()),
        token_ids,
        loss_mask,
        ..Default::default()
    }
}

/// The learner configuration the benchmark uses on both sides: GRPO, k3 KL (β 0.04) in the loss, clip 1.0, one micro-batch.
pub fn bench_config(batch_size: usize) -> LearnerConfig {
    LearnerConfig {
        micro_batch_size: batch_size,
        kl: Some(KlConfig { estimator: KlEstimator::K3, coef: KlCoef::Fixed { beta: 0.04 }, placement: KlPlacement::Loss }),
        ..LearnerConfig::default()
    }
}

/// The subset of a config the PyTorch peer reads (its own field layout).
pub fn peer_config(cfg: &LearnerConfig) -> Value {
    let kl = cfg.kl.map(|k| {
        let beta = match k.coef {
            KlCoef::Fixed { beta } => beta,
            KlCoef::Adaptive { init, .. } => init,
        };
        json!({"estimator": k.estimator, "beta": beta, "placement": k.placement})
    });
    json!({
        "optim": cfg.optim, "clip": cfg.clip, "aggregation": cfg.aggregation,
        "max_completion_length": cfg.max_completion_length, "entropy_coef": cfg.entropy_coef,
        "kl": kl, "value": cfg.value, "max_grad_norm": cfg.max_grad_norm,
    })
}

/// Runs `loss_oracle.py CMD` with `input` on stdin and parses its last output line.
pub fn run_peer(python: &std::path::Path, script: &std::path::Path, cmd: &str, input: &Value) -> Result<Value> {
    let mut child = Command::new(python)
        .arg(script)
        .arg(cmd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| LearnerError::Bench(format!("cannot start {} {}: {e}", python.display(), script.display())))?;
    child.stdin.take().expect("piped").write_all(input.to_string().as_bytes()).map_err(|e| LearnerError::Bench(format!("writing to the peer: {e}")))?;
    let out = child.wait_with_output().map_err(|e| LearnerError::Bench(format!("waiting for the peer: {e}")))?;
    if !out.status.success() {
        return Err(LearnerError::Bench(format!("{} {cmd} failed ({}): {}", script.display(), out.status, String::from_utf8_lossy(&out.stderr))));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().ok_or_else(|| LearnerError::Bench(format!("{} {cmd} printed nothing", script.display())))?;
    serde_json::from_str(last).map_err(|e| LearnerError::Bench(format!("{} {cmd}: output is not JSON ({e}): {last}", script.display())))
}


/// Measures both sides, round after round, and prints one line with the ratio.
pub fn bench_learner_step(b: &LearnerBench) -> Result<BenchReport> {
    tch::set_num_threads(b.threads);
    let model = Transformer::load(&b.model_dir, b.device, Some(b.kind))?;
    let batch = synthetic_batch(model.config.vocab_size, b.batch_size, b.seq_len, b.prompt_len, 1);
    let config = bench_config(b.batch_size);
    let tokens = b.batch_size * b.seq_len;
    let mut learner = Learner::new(model, config.clone(), None)?;
    let sync = || {
        if let Device::Cuda(i) = b.device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    let (mut ours_all, mut torch_all, mut round_ratios) = (vec![], vec![], vec![]);
    for round in 0..b.rounds.max(1) {
        let mut times = Vec::with_capacity(b.iters);
        // The learner lives across rounds: later rounds need no warm-up of their own.
        let warmup = if round == 0 { b.warmup } else { 0 };
        for i in 0..warmup + b.iters.max(1) {
            sync();
            let t0 = Instant::now();
            learner.train_step(&batch)?;
            sync();
            if i >= warmup {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        let ours = rlmesh_comm::bench::median(&times);
        let peer = run_peer(
            &b.python,
            &b.script,
            "bench",
            &json!({
                "model": b.model_dir, "batch": batch, "objective": "policy", "config": peer_config(&config),
                "iters": b.iters.max(1), "warmup": b.warmup, "threads": b.threads,
                "device": if b.device == Device::Cpu { "cpu" } else { "cuda" },
                "dtype": rlmesh_model::io::kind_name(b.kind), "fused_adamw": b.peer_fused_adamw,
            }),
        )?;
        let torch = peer["median_s"].as_f64().ok_or_else(|| LearnerError::Bench(format!("peer output lacks median_s: {peer}")))?;
        if b.rounds > 1 {
            eprintln!("round {}/{}: rlmesh {ours:.4}s, PyTorch {torch:.4}s, ratio {:.3}x", round + 1, b.rounds, torch / ours);
        }
        ours_all.push(ours);
        torch_all.push(torch);
        round_ratios.push(torch / ours);
    }
    drop(learner);
    let (ours, torch) = (rlmesh_comm::bench::median(&ours_all), rlmesh_comm::bench::median(&torch_all));
    let report = BenchReport {
        model: b.model_dir.display().to_string(),
        device: format!("{:?}", b.device),
        dtype: rlmesh_model::io::kind_name(b.kind).to_string(),
        tokens_per_step: tokens,
        ours_median_s: ours,
        ours_tokens_per_s: tokens as f64 / ours,
        torch_median_s: torch,
        torch_tokens_per_s: tokens as f64 / torch,
        ratio: rlmesh_comm::bench::median(&round_ratios),
        round_ratios,
        peer_optimizer: if b.peer_fused_adamw { "torch.optim.AdamW(fused=True)" } else { "torch.optim.AdamW (default)" }.to_string(),
    };
    println!(
        "learner step {} [{} {}], {} tokens: rlmesh {:.0} tok/s (median {:.4}s), PyTorch eager with {} {:.0} tok/s (median {:.4}s), ratio {:.3}x (median of {} rounds)",
        report.model,
        report.device,
        report.dtype,
        tokens,
        report.ours_tokens_per_s,
        ours,
        report.peer_optimizer,
        report.torch_tokens_per_s,
        torch,
        report.ratio,
        report.round_ratios.len()
    );
    Ok(report)
}
