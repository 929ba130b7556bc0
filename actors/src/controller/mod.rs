//! The controller: owns the run (dataset cursor, dispatch, ledger, staleness, supervision).
//!
//! Its foundations are plain data and plain functions, testable without actors:
//! - [`topology`] — `deploy/*.toml`: nodes, ports and where each role's actors run;
//! - [`plan`] — the placement of a topology: processes, hosts, devices, ranks, ports, environment;
//! - [`recipe`] — `configs/*.toml`: model, tasks, tools, reward, estimator, SFT and RL settings;
//! - [`ledger`] — the durable record that trains every prompt group exactly once;
//! - [`staleness`] — which scored groups the learner may train on, per mode;
//! - [`dispatch`] — how rollout work is cut into requests and spread over every rollout actor;
//! - [`source`] — TOML loading whose errors name the file, line and field;
//! - [`status`] — `RUN_DIR/status.json`, written by the job, read by `launcher status`/`down`;
//! - [`run_dir`] — a run directory's owner: the lock the live job holds.
//! - [`memory`] — `launcher plan --recipe`: the bytes each process holds on its device, read
//!   from the model's shape ([`shape`]: `config.json`, the recipe's largest RL micro-batch).
//!
//! On them, a run is sequenced by [`run`], one file per phase: `setup` (the
//! run directory, `/metrics`, the other processes, the policy, the actors),
//! [`warm_start`] (the SFT warm-up, shared between runs when asked), `rl_loop`
//! (the RL phase), `finish` (the held-out evaluation and `summary.json`);
//! `resume` checks and replays a run to resume, `journal` keeps what a run
//! writes as it goes (status, logs, checkpoints with their cursor), `driver`
//! is the controller's handle on its actors, `error` says why a run stopped.
pub mod batch;
pub mod discovery;
pub mod dispatch;
mod driver;
mod error;
mod finish;
pub mod init;
mod journal;
pub mod ledger;
pub mod memory;
pub mod shape;
pub mod plan;
mod progress;
pub mod recipe;
mod record;
mod resume;
mod rl_loop;
pub mod source;
pub mod run;
pub mod run_dir;
mod setup;
pub mod staleness;
pub mod status;
pub mod supervisor;
pub mod topology;
pub mod warm_start;
