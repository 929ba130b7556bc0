//! # rlmesh-mesh: where things run
//!
//! rlmesh's actors (rollout, reward, learner, weight-sync, controller) are
//! about *what* is computed; this crate is about *where*: which OS process on
//! which host runs them, how those processes are started, and how bytes move
//! between them. It knows nothing about RL.
//!
//! - [`launch`]: start a process on a host, as a local child or through the
//!   system OpenSSH client (so `~/.ssh/config`, keys, agents and ProxyJump
//!   work as users expect), and stop only what the run itself started.
//! - [`testing`]: fixtures for tests: hosts as Linux network namespaces on a
//!   private bridge, each with its own sshd and a throw-away key.
#![warn(missing_docs)]

pub mod launch;
pub mod testing;
