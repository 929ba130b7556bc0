//! The controller: owns the run (dataset cursor, dispatch, ledger, staleness, supervision).
//!
//! Its foundations are plain data and plain functions, testable without actors:
//! - [`topology`] — `deploy/*.toml`: nodes, ports and where each role's actors run;
//! - [`plan`] — the placement of a topology: processes, hosts, devices, ranks, ports, environment;
//! - [`recipe`] — `configs/*.toml`: model, tasks, tools, reward, estimator, SFT and RL settings;
//! - [`ledger`] — the durable record that trains every prompt group exactly once;
//! - [`staleness`] — which scored groups the learner may train on, per mode;
//! - [`source`] — TOML loading whose errors name the file, line and field;
//! - [`status`] — `RUN_DIR/status.json`, written by the job, read by `launcher status`/`down`;
//! - [`run_dir`] — a run directory's owner: the lock the live job holds.
pub mod batch;
pub mod discovery;
mod driver;
pub mod init;
pub mod ledger;
pub mod plan;
mod progress;
pub mod recipe;
mod record;
mod rl_loop;
pub mod source;
pub mod run;
pub mod run_dir;
pub mod staleness;
pub mod status;
pub mod supervisor;
pub mod topology;
pub mod warm_start;
