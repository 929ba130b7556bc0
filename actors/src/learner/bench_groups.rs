//! Benchmark of the grouped workload (`launcher bench learner --workload groups`):
//! G rollouts per prompt, a long shared prompt (system prompt and tool schemas),
//! long-tailed completions and some multi-turn rollouts with tool results, trained
//! in four ways in alternating rounds on the same weights and batch:
//!
//! - `shared`: packed, a group's prompt forwarded once (the default);
//! - `packed`: packed, every sequence whole;
//! - `padded`: one right-padded sequence per row, a group per micro-batch (the plain path);
//! - `torch`: the same step in PyTorch eager (`tests/oracle/loss_oracle.py bench`),
//!   padded as TRL pads (each micro-batch of G rows to its longest) and, as TRL's
//!   `logits_to_keep`, projecting onto the vocabulary only from the first trained position.
use super::batch::TrainBatch;
use super::bench::{bench_config, peer_config, run_peer, synthetic_sequence, LearnerBench};
use super::error::{LearnerError, Result};
use super::trainer::{splitmix, Learner};
use rlmesh_model::Transformer;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::time::Instant;
use tch::Device;

/// The shape of the grouped workload.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupsWorkload {
    /// Prompt groups per step.
    pub groups: usize,
    /// Rollouts per group (G).
    pub group_size: usize,
    /// Tokens of the shared prompt.
    pub prompt_len: usize,
    /// Shortest and longest completion (tokens under the loss mask, tool results excluded).
    pub completion: (usize, usize),
    /// Share of rollouts with a tool call, a tool result (masked out) and an answer.
    pub multi_turn: f64,
    /// Computed tokens per packed micro-batch.
    pub micro_batch_tokens: usize,
}

impl Default for GroupsWorkload {
    fn default() -> Self {
        GroupsWorkload { groups: 4, group_size: 8, prompt_len: 300, completion: (20, 200), multi_turn: 0.25, micro_batch_tokens: 4096 }
    }
}

/// A deterministic grouped batch: per group one prompt of `prompt_len` tokens; per rollout a
/// completion whose length is long-tailed (most near the shortest, a few near the longest);
/// multi-turn rollouts carry a call, a tool result of 10–40 tokens outside the loss mask, and an answer.
pub fn grouped_batch(vocab: i64, w: &GroupsWorkload, seed: u64) -> TrainBatch {
    let mut s = seed;
    let mut unit = move || (splitmix(&mut s) >> 11) as f64 / (1u64 << 53) as f64;
    let token = |u: f64| 3 + (u * (vocab - 3) as f64) as u32;
    let groups = (0..w.groups).map(|_| {
        let prompt: Vec<u32> = (0..w.prompt_len.max(1)).map(|_| token(unit())).collect();
        (0..w.group_size)
            .map(|_| {
                // Long tail: the cube of a uniform draw puts most lengths near the shortest.
                let (lo, hi) = w.completion;
                let n = lo + ((hi - lo) as f64 * unit().powi(3)).round() as usize;
                let mut token_ids = prompt.clone();
                let mut loss_mask = vec![0u8; prompt.len()];
                let push = |ids: &mut Vec<u32>, mask: &mut Vec<u8>, k: usize, m: u8, u: &mut dyn FnMut() -> f64| {
                    for _ in 0..k {
                        ids.push(token(u()));
                        mask.push(m);
                    }
                };
                if unit() < w.multi_turn {
                    let call = (n / 3).max(1);
                    let result = 10 + (unit() * 30.0) as usize;
                    push(&mut token_ids, &mut loss_mask, call, 1, &mut unit);
                    push(&mut token_ids, &mut loss_mask, result, 0, &mut unit);
                    push(&mut token_ids, &mut loss_mask, n - call, 1, &mut unit);
                } else {
                    push(&mut token_ids, &mut loss_mask, n.max(1), 1, &mut unit);
                }
                synthetic_sequence(token_ids, loss_mask, &mut unit)
            })
            .collect::<Vec<_>>()
    });
    TrainBatch::of_groups(groups.collect::<Vec<_>>())
}

/// One layout's figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LayoutFigures {
    /// `shared`, `packed`, `padded` or `torch`.
    pub layout: String,
    /// Median step time over all rounds (s).
    pub median_s: f64,
    /// Positions computed per step (rlmesh's layouts; the peer's padded rows).
    pub computed_tokens: usize,
}

/// The grouped workload's report for one model.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupsReport {
    /// Model directory.
    pub model: String,
    /// Device, as text.
    pub device: String,
    /// The workload.
    pub workload: GroupsWorkload,
    /// Tokens under the loss mask per step.
    pub trained_tokens: usize,
    /// Tokens of the sequences per step (no padding, every prompt G times).
    pub sequence_tokens: usize,
    /// Each layout.
    pub layouts: Vec<LayoutFigures>,
    /// Median over rounds of padded / shared step time (> 1: the shared prefix is faster).
    pub shared_over_padded: f64,
    /// Median over rounds of padded / packed.
    pub packed_over_padded: f64,
    /// Median over rounds of torch / shared.
    pub shared_over_torch: f64,
}

/// Measures the four layouts round after round and prints one line per model.
pub fn bench_groups(b: &LearnerBench, w: &GroupsWorkload) -> Result<GroupsReport> {
    tch::set_num_threads(b.threads);
    let model = Transformer::load(&b.model_dir, b.device, Some(b.kind))?;
    let batch = grouped_batch(model.config.vocab_size, w, 1);
    let mut config = bench_config(w.group_size);
    config.micro_batch_tokens = w.micro_batch_tokens;
    let mut learner = Learner::new(model, config.clone(), None)?;
    let sync = || {
        if let Device::Cuda(i) = b.device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    let layouts = [("shared", true, true), ("packed", true, false), ("padded", false, false)];
    let mut times: Vec<Vec<f64>> = vec![vec![]; layouts.len() + 1];
    let mut computed = vec![0usize; layouts.len() + 1];
    let mut trained = 0;
    let mut ratios: [Vec<f64>; 3] = Default::default();
    for round in 0..b.rounds.max(1) {
        let mut medians = vec![];
        for (k, &(name, pack, shared)) in layouts.iter().enumerate() {
            learner.config.pack = pack;
            learner.config.shared_prefix = shared;
            let warmup = if round == 0 { b.warmup } else { 0 };
            let mut mine = vec![];
            for i in 0..warmup + b.iters.max(1) {
                sync();
                let t0 = Instant::now();
                let stats = learner.train_step(&batch)?;
                sync();
                if i >= warmup {
                    mine.push(t0.elapsed().as_secs_f64());
                }
                computed[k] = stats.computed_tokens;
                trained = stats.trained_tokens;
            }
            let m = rlmesh_comm::bench::median(&mine);
            eprintln!("round {}/{} {name}: {m:.3}s per step, {} computed tokens", round + 1, b.rounds, computed[k]);
            times[k].extend(mine);
            medians.push(m);
        }
        let peer = run_peer(
            &b.python,
            &b.script,
            "bench",
            &json!({
                "model": b.model_dir, "batch": batch, "objective": "policy", "config": peer_config(&config),
                "iters": b.iters.max(1), "warmup": if round == 0 { b.warmup } else { 0 }, "threads": b.threads,
                "device": if b.device == Device::Cpu { "cpu" } else { "cuda" }, "micro_batch": w.group_size, "logits_to_keep": true,
                "dtype": rlmesh_model::io::kind_name(b.kind), "fused_adamw": b.peer_fused_adamw,
            }),
        )?;
        let torch = peer["median_s"].as_f64().ok_or_else(|| LearnerError::Bench(format!("peer output lacks median_s: {peer}")))?;
        computed[layouts.len()] = peer["computed_tokens"].as_u64().unwrap_or(0) as usize;
        eprintln!("round {}/{} torch: {torch:.3}s per step", round + 1, b.rounds);
        times[layouts.len()].extend(peer["seconds"].as_array().map(|v| v.iter().filter_map(|x| x.as_f64()).collect::<Vec<_>>()).unwrap_or_default());
        ratios[0].push(medians[2] / medians[0]);
        ratios[1].push(medians[2] / medians[1]);
        ratios[2].push(torch / medians[0]);
    }
    let names = ["shared", "packed", "padded", "torch"];
    let report = GroupsReport {
        model: b.model_dir.display().to_string(),
        device: format!("{:?}", b.device),
        workload: w.clone(),
        trained_tokens: trained,
        sequence_tokens: batch.sequences.iter().map(|s| s.token_ids.len()).sum(),
        layouts: names
            .iter()
            .zip(&times)
            .zip(&computed)
            .map(|((n, t), &c)| LayoutFigures { layout: n.to_string(), median_s: rlmesh_comm::bench::median(t), computed_tokens: c })
            .collect(),
        shared_over_padded: rlmesh_comm::bench::median(&ratios[0]),
        packed_over_padded: rlmesh_comm::bench::median(&ratios[1]),
        shared_over_torch: rlmesh_comm::bench::median(&ratios[2]),
    };
    let f = |i: usize| &report.layouts[i];
    println!(
        "learner step, grouped workload, {} [{}]: {} groups x G={}, prompt {} tokens, {} trained tokens; step s (computed tokens): shared {:.3} ({}), packed {:.3} ({}), padded {:.3} ({}), PyTorch eager padded {:.3} ({}); shared is {:.2}x padded, {:.2}x PyTorch; packed {:.2}x padded (medians of {} rounds)",
        report.model,
        report.device,
        w.groups,
        w.group_size,
        w.prompt_len,
        trained,
        f(0).median_s,
        f(0).computed_tokens,
        f(1).median_s,
        f(1).computed_tokens,
        f(2).median_s,
        f(2).computed_tokens,
        f(3).median_s,
        f(3).computed_tokens,
        report.shared_over_padded,
        report.shared_over_torch,
        report.packed_over_padded,
        b.rounds.max(1)
    );
    Ok(report)
}
