//! # rlmesh-verifiers: external verifiers as reward functions
//!
//! A user scores rollouts with their own program, written in any language: a
//! `[[reward_function]]` with a `command` (a long-lived child process that
//! speaks JSON lines on stdin/stdout) or a `url` (the same JSON by HTTP POST).
//! This crate is the transport: it starts, feeds, times and restarts those
//! programs. It knows nothing about RL beyond the request it sends and the
//! [`Score`] it returns; combining scores into a reward is
//! [`rlmesh_core::reward::functions`].
//!
//! The protocol ([`protocol`]), one JSON object a line each way:
//! - request `{"id": 7, "task": {…}, "messages": […], "completion": "…"}`;
//! - response `{"id": 7, "score": 0.5}`, `{"id": 7, "score": null}` (does not
//!   apply) or `{"id": 7, "error": "…"}` (could not score).
//!
//! Every failure — the verifier's `error`, a timeout, a crash, a line that is
//! not a response, an HTTP error — is [`Score::Unscorable`] with its reason,
//! and is counted in [`VerifierStats`]. Never a 0: an unscorable rollout's
//! group is dropped by the caller, so infrastructure failures never enter
//! group statistics.
//!
//! - [`protocol`]: the request and response lines, as plain functions.
//! - [`command`]: a child process (own process group, killed on drop and when
//!   this process dies; restarted with back-off within a budget). Several
//!   requests may be in flight; responses are matched by id.
//! - [`http`]: POST to a URL (reqwest with rustls, on a runtime of its own).
//!
//! ```no_run
//! use rlmesh_verifiers::{Verifier, VerifierSpec, Request};
//! # let (task, messages) = (rlmesh_core::Task::default(), Vec::<rlmesh_core::Message>::new());
//! let spec = VerifierSpec::command("math", ["python3", "verify.py"]);
//! let verifier = Verifier::start(spec).expect("a verifier that cannot start is refused before the run");
//! let score = verifier.score(&Request { task: &task, messages: &messages, completion: "408" });
//! ```
#![warn(missing_docs)]

pub mod command;
pub mod http;
pub mod protocol;

pub use rlmesh_core::reward::functions::{RewardFunction, Score};
use rlmesh_core::{Message, Task};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What one request carries: the task (as a row of the task-file format,
/// [`rlmesh_core::dataset::task_row`]), the whole conversation (prompt and
/// rollout, transformers format), and the text of the last assistant turn.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The task the rollout ran on.
    pub task: &'a Task,
    /// The prompt's messages followed by the rollout's.
    pub messages: &'a [Message],
    /// The final assistant text (the answer a simple verifier checks).
    pub completion: &'a str,
}

/// Where a verifier runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A child process: program and arguments.
    Command(Vec<String>),
    /// An HTTP URL that takes the request by POST.
    Url(String),
}

/// A `[[reward_function]]` that is an external verifier.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifierSpec {
    /// Its name (the reward function is `verifier:<name>` in metrics).
    pub name: String,
    /// Command or URL.
    pub endpoint: Endpoint,
    /// Its weight in the reward sum.
    pub weight: f64,
    /// How long one request may take (default 30 s).
    pub timeout: Duration,
    /// How many times a command verifier is restarted after a crash or a hang
    /// before it is given up (default 5).
    pub max_restarts: u32,
    /// Working directory of a command verifier (default: this process's).
    pub cwd: Option<PathBuf>,
}

impl VerifierSpec {
    /// A command verifier with the defaults.
    pub fn command<S: Into<String>>(name: impl Into<String>, argv: impl IntoIterator<Item = S>) -> Self {
        Self::new(name, Endpoint::Command(argv.into_iter().map(Into::into).collect()))
    }

    /// An HTTP verifier with the defaults.
    pub fn url(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self::new(name, Endpoint::Url(url.into()))
    }

    fn new(name: impl Into<String>, endpoint: Endpoint) -> Self {
        VerifierSpec { name: name.into(), endpoint, weight: 1.0, timeout: Duration::from_secs(30), max_restarts: 5, cwd: None }
    }

    /// The reward function it is in the sum: `verifier:<name>` with its weight.
    pub fn function(&self) -> RewardFunction {
        RewardFunction::new(format!("verifier:{}", self.name), self.weight)
    }
}

/// Errors of starting a verifier (before any request).
#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    /// The spec cannot work (an empty command, a URL that is not http(s)).
    #[error("verifier \"{name}\": {reason}")]
    Invalid {
        /// The verifier's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The process could not be started, or ended at once.
    #[error("verifier \"{name}\": `{command}` did not start: {reason}")]
    Start {
        /// The verifier's name.
        name: String,
        /// The command line.
        command: String,
        /// The OS error, or how it ended and the end of its stderr.
        reason: String,
    },
}

/// Counts of what a verifier did, for metrics; every failure is in one of
/// `errors`, `timeouts`, `bad_responses`, `lost` or `given_up`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifierStats {
    /// Requests made.
    pub requests: u64,
    /// Answered with a number.
    pub scored: u64,
    /// Answered `score: null` (does not apply).
    pub not_applicable: u64,
    /// Answered `error` (could not score).
    pub errors: u64,
    /// No answer within the timeout.
    pub timeouts: u64,
    /// Lines (or HTTP bodies) that were not a valid response.
    pub bad_responses: u64,
    /// Requests lost with a process that crashed or was restarted, or to a failed HTTP exchange.
    pub lost: u64,
    /// Requests refused because the verifier was given up (past its restart budget).
    pub given_up: u64,
    /// Times the process ended by itself (a crash).
    pub crashes: u64,
    /// Times the process was started again.
    pub restarts: u64,
    /// Responses that came after their request had failed (discarded).
    pub late: u64,
}

impl VerifierStats {
    /// Requests that ended unscorable.
    pub fn unscorable(&self) -> u64 {
        self.errors + self.timeouts + self.bad_responses + self.lost + self.given_up
    }
}

/// The counters behind [`VerifierStats`], shared by a verifier's threads.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) scored: AtomicU64,
    pub(crate) not_applicable: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) bad_responses: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) given_up: AtomicU64,
    pub(crate) crashes: AtomicU64,
    pub(crate) restarts: AtomicU64,
    pub(crate) late: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a verifier's answer by its kind.
    pub(crate) fn answered(&self, s: &Score) {
        Self::add(match s {
            Score::Value(_) => &self.scored,
            Score::NotApplicable => &self.not_applicable,
            Score::Unscorable { .. } => &self.errors,
        });
    }

    pub(crate) fn snapshot(&self) -> VerifierStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        VerifierStats {
            requests: g(&self.requests),
            scored: g(&self.scored),
            not_applicable: g(&self.not_applicable),
            errors: g(&self.errors),
            timeouts: g(&self.timeouts),
            bad_responses: g(&self.bad_responses),
            lost: g(&self.lost),
            given_up: g(&self.given_up),
            crashes: g(&self.crashes),
            restarts: g(&self.restarts),
            late: g(&self.late),
        }
    }
}

/// A started verifier of either kind. Share it across threads (`&self`
/// methods); calls block, so from async code run them on a blocking thread.
pub enum Verifier {
    /// A child process.
    Command(command::CommandVerifier),
    /// An HTTP endpoint.
    Http(http::HttpVerifier),
}

impl Verifier {
    /// Starts the verifier `spec` describes. A command that cannot be
    /// started, or that ends at once, is an error naming it, with the end of its stderr.
    pub fn start(spec: VerifierSpec) -> Result<Verifier, VerifierError> {
        match &spec.endpoint {
            Endpoint::Command(_) => command::CommandVerifier::start(spec).map(Verifier::Command),
            Endpoint::Url(_) => http::HttpVerifier::start(spec).map(Verifier::Http),
        }
    }

    /// Scores one rollout (waits at most the spec's timeout, plus a start
    /// that is under way).
    pub fn score(&self, req: &Request<'_>) -> Score {
        self.score_all(std::slice::from_ref(req)).pop().unwrap_or_else(|| unreachable!("one score per request"))
    }

    /// Scores rollouts concurrently: all requests are sent, then all answers
    /// awaited; one score per request, in order.
    pub fn score_all(&self, reqs: &[Request<'_>]) -> Vec<Score> {
        match self {
            Verifier::Command(v) => v.score_all(reqs),
            Verifier::Http(v) => v.score_all(reqs),
        }
    }

    /// What it did so far.
    pub fn stats(&self) -> VerifierStats {
        match self {
            Verifier::Command(v) => v.stats(),
            Verifier::Http(v) => v.stats(),
        }
    }

    /// Why it was given up (past its restart budget), if it was: every
    /// request now fails at once, and a run should stop.
    pub fn given_up(&self) -> Option<String> {
        match self {
            Verifier::Command(v) => v.given_up(),
            Verifier::Http(_) => None,
        }
    }

    /// Its spec.
    pub fn spec(&self) -> &VerifierSpec {
        match self {
            Verifier::Command(v) => v.spec(),
            Verifier::Http(v) => v.spec(),
        }
    }
}
