//! The learner: policy-gradient losses, optimiser, data-parallel ranks, checkpoints.
//!
//! A [`Learner`] is one training rank. It owns the policy ([`rlmesh_model::Transformer`],
//! whose `VarStore` holds the trained parameters), an optional value head
//! ([`value::ValueHead`], StepTool's critic), an optional frozen reference policy
//! for the KL term, AdamW, and — with several ranks — a
//! [`rlmesh_comm::Collective`]. The pipeline hands it plain data
//! ([`TrainBatch`]: token ids, loss mask, per-token advantages, behaviour
//! log-probs, optional reference log-probs, values and returns) and gets
//! [`StepStats`] back.
//!
//! A step: the batch (this rank's share) is passed over `ppo_epochs` times,
//! each pass split into `mini_batches` optimizer steps, each accumulated over
//! micro-batches ([`micro`](self) lays them out: packed end to end, a group's shared
//! prompt forwarded once; or padded). The per-token losses of [`loss`] are reduced with weights
//! fixed by the *global* batch (sequences and masked tokens summed over all
//! ranks), so micro-batching and data parallelism do not change the
//! objective. Gradients are summed into one flat float32 buffer, all-reduced
//! in flat buckets, clipped, and applied by AdamW ([`optim`]); then every
//! rank's parameter digest is compared and a mismatch stops the run
//! ([`LearnerError::DigestMismatch`]).
//!
//! Precision: parameters train in the model's dtype. With bfloat16
//! parameters (GPUs) the forward and backward run in bfloat16, gradients are
//! accumulated and reduced in float32, and AdamW keeps float32 master
//! weights from which the bfloat16 weights are rounded after each step.
//!
//! [`checkpoint`] writes and restores everything a run needs to continue
//! exactly; [`bench`](mod@bench) measures a learner step against the same step in
//! PyTorch eager; [`rank`] runs one rank as a process.
//!
//! ```no_run
//! # use rlmesh_actors::learner::*;
//! # fn run(model: rlmesh_model::Transformer, batch: TrainBatch) -> Result<()> {
//! let mut learner = Learner::new(model, LearnerConfig::default(), None)?;
//! let stats = learner.train_step(&batch)?;
//! println!("loss {} kl {:?} clip {:?}", stats.loss, stats.kl, stats.clip_fraction);
//! learner.save_checkpoint("run/checkpoints".as_ref(), &CheckpointMeta::default())?;
//! # Ok(()) }
//! ```

pub mod batch;
pub mod bench;
pub mod bench_groups;
pub mod bench_shard;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod loss;
mod micro;
pub mod optim;
pub mod parallel;
pub mod rank;
pub mod actor;
mod stats;
mod trainer;
pub mod value;

pub use batch::{SftBatch, SftSequence, TrainBatch, TrainSequence};
pub use checkpoint::{list_checkpoints, CheckpointMeta, Resumed};
pub use config::{AdamWConfig, GaeConfig, KlCoef, KlConfig, KlPlacement, LearnerConfig, LrSchedule, Precision, Shard, ValueConfig};
pub use error::{LearnerError, Result, GROUP_BROKEN};
pub use loss::{Aggregation, ClipParams, KlEstimator};
pub use trainer::{Learner, RatioStats, StepStats};

/// Makes this process keep the memory it frees for its next allocations (glibc:
/// no `mmap` for large blocks, no trimming of the heap's top).
///
/// A training step allocates and frees the same large temporaries every time
/// (logits, log-softmax, activation gradients: ~100 MB each on SmolLM2-135M).
/// glibc serves any block over 32 MiB with a fresh `mmap` and unmaps it on
/// `free`, so each step page-faults (and the kernel zeroes) all of them again —
/// 8–9% of a CPU learner step in `perf`. Kept in the heap, they are reused.
/// Peak memory is unchanged (the peak is reached either way); the process just
/// does not hand the pages back between steps. Call it first thing in `main`;
/// elsewhere it does nothing.
pub fn retain_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's thresholds; valid at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
