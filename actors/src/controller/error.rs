//! Why a run stops: one error type for the run driver and its phases.
use super::ledger::LedgerError;
use std::path::{Path, PathBuf};

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Set-up failed (model, tokenizer, tools, tasks).
    #[error("set-up: {0}")]
    Setup(String),
    /// The request is refused before anything was changed (a live run owns the
    /// directory, nothing to resume, another recipe, a port in use): the user's to fix.
    #[error("{0}")]
    Refused(String),
    /// Stopped on request (SIGTERM, e.g. from `launcher down`), after a checkpoint where one can be taken.
    #[error("{0}")]
    Stopped(String),
    /// An actor failed beyond recovery.
    #[error("{actor}: {message}")]
    Actor {
        /// Which actor.
        actor: &'static str,
        /// What happened.
        message: String,
    },
    /// A learner rank's process was lost: the run cannot go on, and is to be
    /// started again from its newest checkpoint (`launcher up` does so by
    /// itself, within its restart budget).
    #[error("a learner rank is lost ({why}): {cause}")]
    LearnerLost {
        /// Which process, and how it was lost.
        why: String,
        /// The error the run stopped on.
        cause: String,
        /// The process exited (a crash), so the run can start again at once;
        /// otherwise it fell silent (its host unreachable?), and a start would wait for it.
        exited: bool,
    },
    /// The ledger refused a transition.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// Writing the run directory failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io { path: path.to_path_buf(), source }
}

pub(super) fn actor_err<E: std::fmt::Display>(actor: &'static str) -> impl Fn(E) -> RunError {
    move |e| RunError::Actor { actor, message: e.to_string() }
}

/// The answer to a call on `actor`: the call's failure (the actor is gone) or
/// the actor's own, as the run's error.
pub(super) fn answered<T, M>(actor: &'static str, r: Result<Result<T, String>, ractor::RactorErr<M>>) -> Result<T, RunError> {
    r.map_err(actor_err(actor))?.map_err(actor_err(actor))
}

