//! `launcher bench learner --shard MODE --ranks N`: the sharded learner's step
//! against the unsharded one, the same model, batches and number of rank
//! processes on the CPU ring, in the same run. Each side runs as N
//! [`super::rank`] processes (`WorkerCommand` starts them); the figures are
//! the median step's tokens/s after the warm-up steps, rank 0's losses (which
//! must agree to float rounding), and each rank's optimizer-state bytes.
use super::bench::synthetic_batch;
use super::config::{LearnerConfig, Shard};
use super::rank::{JobBatches, RankJob, RankStep};
use rlmesh_comm::testing::{run_ranks_on_free_port, WorkerCommand};
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

/// One side of the comparison.
#[derive(Clone, Debug, Serialize)]
pub struct ShardSide {
    /// `shard` of this side.
    pub shard: &'static str,
    /// Median tokens/s of the timed steps (rank 0's step time; tokens over all ranks).
    pub tokens_per_s: f64,
    /// Rank 0's loss after each step.
    pub losses: Vec<f64>,
    /// Optimizer-state bytes per rank.
    pub optimizer_bytes: Vec<u64>,
}

/// The sharded side against the unsharded one.
#[derive(Clone, Debug, Serialize)]
pub struct ShardBench {
    /// The model directory.
    pub model: String,
    /// Rank processes per side.
    pub ranks: usize,
    /// Unsharded.
    pub none: ShardSide,
    /// Sharded.
    pub sharded: ShardSide,
    /// Sharded tokens/s over unsharded.
    pub ratio: f64,
    /// Largest |loss difference| between the sides over the steps, relative to the largest |loss|.
    pub loss_rel_diff: f64,
}

/// What to run: `batch` sequences of `seq_len` tokens a step, `warmup + iters` steps a side.
#[derive(Clone, Debug)]
pub struct ShardBenchConfig {
    /// How the rank processes are started (`launcher learner-rank`, or the test binary).
    pub command: WorkerCommand,
    /// Rank processes per side.
    pub ranks: usize,
    /// The sharded side's mode.
    pub shard: Shard,
    /// The learner's settings apart from `shard`.
    pub config: LearnerConfig,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Untimed steps first.
    pub warmup: usize,
    /// Timed steps.
    pub iters: usize,
    /// libtorch threads per rank.
    pub threads: i32,
}

/// Runs both sides on `model` (a transformers directory); `work` holds the job files.
pub fn bench_sharded(model: &Path, cfg: &ShardBenchConfig, work: &Path) -> Result<ShardBench, String> {
    let vocab = rlmesh_model::ModelConfig::load(model).map_err(|e| e.to_string())?.vocab_size;
    let steps = (cfg.warmup + cfg.iters) as u64;
    let batches: Vec<_> = (0..steps).map(|i| synthetic_batch(vocab, cfg.batch, cfg.seq_len, cfg.seq_len / 4, 7 + i)).collect();
    let side = |shard: Shard| -> Result<ShardSide, String> {
        let job = RankJob {
            model: model.to_path_buf(),
            config: LearnerConfig { shard, ..cfg.config.clone() },
            batches: JobBatches::Train(batches.clone()),
            steps,
            checkpoint_dir: None,
            resume: false,
            out_dir: None,
            threads: cfg.threads,
        };
        let path = work.join(format!("job-{}.json", shard.name()));
        std::fs::write(&path, serde_json::to_vec(&job).expect("serialises")).map_err(|e| format!("{}: {e}", path.display()))?;
        let world = cfg.ranks;
        let out = run_ranks_on_free_port(&cfg.command, world, Duration::from_secs(600), |addr, r| {
            (vec![path.display().to_string(), "--rank".into(), r.to_string(), "--world".into(), world.to_string(), "--addr".into(), addr.to_string()], vec![])
        })
        .map_err(|e| e.to_string())?;
        let mut per_rank = vec![];
        for o in &out {
            if !o.success() {
                return Err(format!("shard {}: rank {} failed: {}", shard.name(), o.rank, o.stderr));
            }
            let steps: Vec<RankStep> = o.stdout.lines().map(serde_json::from_str).collect::<Result<_, _>>().map_err(|e| format!("rank {} output: {e}", o.rank))?;
            per_rank.push(steps);
        }
        let rank0 = &per_rank[0];
        let mut rates: Vec<f64> = rank0.iter().skip(cfg.warmup).map(|s| s.tokens as f64 / s.seconds.max(1e-9)).collect();
        rates.sort_by(f64::total_cmp);
        Ok(ShardSide {
            shard: shard.name(),
            tokens_per_s: rates.get(rates.len() / 2).copied().unwrap_or(0.0),
            losses: rank0.iter().map(|s| s.loss).collect(),
            optimizer_bytes: per_rank.iter().map(|s| s.first().map_or(0, |x| x.optimizer_bytes)).collect(),
        })
    };
    let none = side(Shard::None)?;
    let sharded = side(cfg.shard)?;
    let scale = none.losses.iter().fold(f64::MIN_POSITIVE, |m, l| m.max(l.abs()));
    let loss_rel_diff = none.losses.iter().zip(&sharded.losses).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale;
    let ratio = sharded.tokens_per_s / none.tokens_per_s.max(1e-9);
    Ok(ShardBench { model: model.display().to_string(), ranks: cfg.ranks, none, sharded, ratio, loss_rel_diff })
}
