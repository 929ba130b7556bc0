//! # rlmesh-comm — collectives for data-parallel learner ranks
//!
//! The learner of rlmesh runs as N data-parallel ranks, one OS process per
//! training device. Each rank computes gradients on its share of a batch; the
//! ranks then **all-reduce** the gradients so that every rank applies the
//! same update and the parameters stay bit-identical (the learner checks a
//! parameter digest after every step). Rank 0 also **broadcasts** initial or
//! restored weights, and sharded optimisers need **reduce-scatter** and
//! **all-gather**. This crate puts those collectives, plus a **barrier**,
//! behind one object-safe trait, [`Collective`], working in place on flat
//! buffers ([`Buf`]: pointer, element count, [`DType`], host or CUDA memory).
//!
//! Two backends implement it:
//!
//! - [`RingComm`] — the CPU backend, for tests and the embedded CPU default.
//!   Ranks are separate processes linked in a ring of TCP connections (each
//!   writes to its next rank and reads from its previous one), found through
//!   a rendezvous at rank 0's address with a cookie-and-version handshake.
//!   The all-reduce is the bandwidth-optimal ring: a reduce-scatter then an
//!   all-gather, moving `2(n−1)/n` of the buffer over each link, pipelined in
//!   blocks. Each chunk is reduced by exactly one rank and copied verbatim to
//!   the others, so every rank ends with bit-identical results. Every wait on
//!   a peer is bounded: a dead peer is an error naming it, never a hang.
//! - [`NcclComm`] — the GPU backend, NCCL through cudarc with dynamic
//!   loading: it builds with no CUDA present and reports
//!   [`CommError::NcclUnavailable`] at run time when the libraries are
//!   missing. It takes raw device pointers and a CUDA stream (e.g. from tch
//!   tensors) and rank 0's [`NcclId`] travels as bytes over the control
//!   channel. It is `!Send`: it lives on the thread that owns the device.
//!
//! Gradients are reduced in flat buckets ([`Bucketer`], 25 MiB by default),
//! never tensor by tensor. Sharded state (ZeRO) owns buckets chunk by rank
//! ([`ShardLayout`]): [`reduce_scatter_sharded`] and [`all_gather_sharded`]
//! run one in-place collective per bucket, on the CPU ring or NCCL alike. [`worker`] is one rank as a process (the
//! `rlmesh-comm-worker` binary, also embeddable in the launcher through
//! [`worker_main`]); [`bench::bench_allreduce`] measures the ring's bus
//! bandwidth against the loopback copy bandwidth.
#![warn(missing_docs)]

pub mod bench;
pub mod bucket;
pub mod buffer;
pub mod collective;
pub mod cpu;
pub mod device_digest;
pub mod digest;
pub mod error;
pub mod nccl;
pub mod shard;
pub mod testing;
pub mod worker;
pub mod xxh3;

pub use bucket::{all_reduce_bucketed, Bucketer, DEFAULT_BUCKET_BYTES};
pub use buffer::{Bf16, Buf, DType, Element, Memory};
pub use collective::{Collective, CollectiveExt, ReduceOp};
pub use cpu::{RingComm, RingConfig};
pub use error::{CommError, Result};
pub use nccl::{nccl_available, NcclComm, NcclId};
pub use shard::{all_gather_sharded, reduce_scatter_sharded, ShardLayout};
pub use worker::{worker_main, WorkerArgs};
