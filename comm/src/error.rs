//! The one error type of the crate: every variant names the peer (rank or
//! address) and what was expected.

use std::time::Duration;

/// What went wrong in a collective, a rendezvous or a backend's set-up.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// A socket operation with a known peer failed (connection reset, refused, broken pipe…).
    #[error("rank {rank}: {what} rank {peer} failed: {source}")]
    Io {
        /// This process's rank.
        rank: usize,
        /// The rank on the other end.
        peer: usize,
        /// What this rank was doing ("sending all_reduce data", …).
        what: String,
        /// The underlying socket error.
        #[source]
        source: std::io::Error,
    },
    /// The peer closed its connection (its process exited or crashed).
    #[error("rank {rank}: connection closed by rank {peer} while {what} rank {peer} (did it exit or crash?)")]
    PeerClosed {
        /// This process's rank.
        rank: usize,
        /// The rank that went away.
        peer: usize,
        /// What this rank was doing.
        what: String,
    },
    /// A peer stayed silent for longer than the configured timeout.
    #[error("rank {rank}: timed out after {timeout:?} {what} rank {peer} (is it alive and in the same collective?)")]
    Timeout {
        /// This process's rank.
        rank: usize,
        /// The silent rank.
        peer: usize,
        /// What this rank was waiting for ("waiting for data from", …).
        what: String,
        /// The configured bound.
        timeout: Duration,
    },
    /// Rendezvous could not complete (rank 0 unreachable, peers missing) before its deadline.
    #[error("rank {rank}: rendezvous at {addr} failed: {reason}")]
    Rendezvous {
        /// This process's rank.
        rank: usize,
        /// The rendezvous address (rank 0's listener).
        addr: String,
        /// What was missing or wrong.
        reason: String,
    },
    /// A handshake was refused: wrong cookie, protocol version, world size or rank.
    #[error("rank {rank}: handshake with {peer} refused: {reason}")]
    Refused {
        /// This process's rank.
        rank: usize,
        /// The other end (a rank, or an address when the rank is not known yet).
        peer: String,
        /// Why, e.g. "cookie mismatch" or "protocol version 2, expected 1".
        reason: String,
    },
    /// Ranks called different collectives, or the same one with different sizes or types.
    #[error("rank {rank}: collective mismatch with rank {peer}: this rank runs {ours}, rank {peer} runs {theirs}")]
    Mismatch {
        /// This process's rank.
        rank: usize,
        /// The rank whose call differs.
        peer: usize,
        /// This rank's call.
        ours: String,
        /// The peer's call.
        theirs: String,
    },
    /// The arguments of a call are invalid (length not divisible by world size, bad root…).
    #[error("rank {rank}: invalid argument to {op}: {reason}")]
    InvalidArgument {
        /// This process's rank.
        rank: usize,
        /// The collective called.
        op: &'static str,
        /// What was expected.
        reason: String,
    },
    /// The buffer lives in memory this backend cannot use (host memory given to NCCL, or device memory given to the CPU ring).
    #[error("rank {rank}: {backend} backend cannot use {memory} buffers")]
    WrongMemory {
        /// This process's rank.
        rank: usize,
        /// The backend ("cpu-ring", "nccl").
        backend: &'static str,
        /// The memory kind it was given.
        memory: &'static str,
    },
    /// An earlier error left the communicator's streams out of step; it must be rebuilt.
    #[error("rank {rank}: communicator is unusable after an earlier error: {first}")]
    Poisoned {
        /// This process's rank.
        rank: usize,
        /// The first error, as text.
        first: String,
    },
    /// CUDA or NCCL libraries could not be loaded on this machine.
    #[error("NCCL backend unavailable: {0}")]
    NcclUnavailable(String),
    /// An NCCL or CUDA call returned an error.
    #[error("rank {rank}: {call} failed: {detail}")]
    Nccl {
        /// This process's rank.
        rank: usize,
        /// The NCCL/CUDA function.
        call: &'static str,
        /// The error code, as text.
        detail: String,
    },
    /// The CUDA driver or NVRTC could not be loaded on this machine.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),
    /// A CUDA driver or NVRTC call outside NCCL failed.
    #[error("{call} failed: {detail}")]
    Cuda {
        /// The CUDA function.
        call: &'static str,
        /// The error, as text.
        detail: String,
    },
    /// The worker's command line is invalid.
    #[error("rlmesh-comm-worker: {0}")]
    Usage(String),
    /// A benchmark or test worker process failed.
    #[error("worker {what} failed: {detail}")]
    Worker {
        /// Which worker (rank, world, size).
        what: String,
        /// Its exit status and stderr.
        detail: String,
    },
}

/// The crate's result type.
pub type Result<T, E = CommError> = std::result::Result<T, E>;
