//! # rlmesh-actors — the actors of the RL loop
//!
//! ```text
//!  prompts ──► rollout ──groups──► reward ──scored──► learner
//!                ▲                                      │
//!                └────────── weight_sync ◄── version ───┘
//!                         (controller owns the run)
//! ```
//!
//! Each actor of the architecture has a folder of its own name:
//! - [`rollout`] — generates *groups* of trajectories with the multi-turn tool
//!   loop (generate → parse → execute → append the tool results → continue).
//! - [`reward`] — scores trajectories by segment and step.
//! - [`learner`] — losses, optimiser, data-parallel all-reduce, checkpoints.
//! - [`weight_sync`] — moves each new policy version to the rollout actors.
//! - [`controller`] — the run: dataset cursor, dispatch, ledger, staleness, supervision.
//!
//! Tensor work never runs on tokio worker threads: each device is owned by one
//! OS thread.
#![warn(missing_docs)]

pub mod controller;
pub mod device;
pub mod learner;
pub mod metrics;
pub mod node;
pub mod reward;
pub mod rollout;
pub mod warmup;
pub mod weight_sync;
