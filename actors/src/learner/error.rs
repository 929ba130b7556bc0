//! The learner's error type: every variant names what failed and where.
use std::path::PathBuf;

/// Errors from training steps, data-parallel ranks, checkpoints and benchmarks.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    /// A train batch is malformed (sequence `index`, field `field`).
    #[error("train batch, sequence {index}, field {field}: {message}")]
    Batch {
        /// Index of the sequence in the batch.
        index: usize,
        /// The offending field.
        field: &'static str,
        /// What was expected and what was found.
        message: String,
    },
    /// The learner configuration is inconsistent.
    #[error("learner config, field {field}: {message}")]
    Config {
        /// The offending field.
        field: &'static str,
        /// What was expected.
        message: String,
    },
    /// Data-parallel ranks hold different parameters after a step: the run must stop.
    #[error("parameter digest mismatch after optimizer step {step}: {}", describe_digests(.digests))]
    DigestMismatch {
        /// The optimizer step after which the digests differed.
        step: u64,
        /// The digest of every rank, by rank.
        digests: Vec<u64>,
    },
    /// A checkpoint could not be written or read.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The checkpoint directory or file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// No usable checkpoint was found under a directory.
    #[error("no usable checkpoint under {dir}: {tried}")]
    NoCheckpoint {
        /// The checkpoint root.
        dir: PathBuf,
        /// Every candidate tried and why it was rejected.
        tried: String,
    },
    /// A benchmark peer (the PyTorch script) failed.
    #[error("benchmark: {0}")]
    Bench(String),
    /// The model failed (loading, saving, forward).
    #[error(transparent)]
    Model(#[from] rlmesh_model::ModelError),
    /// A collective failed (peer died, timeout, mismatch).
    #[error("data-parallel collective: {0}")]
    Comm(#[from] rlmesh_comm::CommError),
    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// I/O error on a path.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// How the message of an error that broke the rank's collective begins, as it
/// travels: the node hosting the rank leaves on seeing it (`node::serve`).
pub const GROUP_BROKEN: &str = "learner group broken: ";

impl LearnerError {
    /// A collective failed (a peer gone or stalled, a timed-out NCCL call that
    /// aborted the communicator): this rank cannot train on with its group.
    /// The group is formed again from scratch, from the newest checkpoint.
    pub fn breaks_the_group(&self) -> bool {
        matches!(self, LearnerError::Comm(_))
    }

    /// The message as it travels: [`GROUP_BROKEN`] first when [`Self::breaks_the_group`].
    pub fn travelling(&self) -> String {
        if self.breaks_the_group() {
            format!("{GROUP_BROKEN}{self}")
        } else {
            self.to_string()
        }
    }
}

/// Result alias for the learner.
pub type Result<T, E = LearnerError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> LearnerError {
    let path = path.into();
    move |source| LearnerError::Io { path, source }
}

fn describe_digests(d: &[u64]) -> String {
    d.iter().enumerate().map(|(r, h)| format!("rank {r} {h:016x}")).collect::<Vec<_>>().join(", ")
}
