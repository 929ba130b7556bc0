//! The binary's error: usage/config/input errors exit 2, run-time failures exit 1.
use std::fmt;

/// An error with its exit code.
pub struct CliError {
    code: u8,
    inner: anyhow::Error,
}

impl CliError {
    /// Bad input, usage or configuration (exit 2).
    pub fn usage(e: impl Into<anyhow::Error>) -> Self {
        CliError { code: 2, inner: e.into() }
    }
    /// A run that stopped on SIGTERM after its checkpoint: exit 143 (128 + SIGTERM), as schedulers expect of a terminated job.
    pub fn terminated(e: impl Into<anyhow::Error>) -> Self {
        CliError { code: 143, inner: e.into() }
    }
    /// The exit code.
    pub fn exit_code(&self) -> u8 {
        self.code
    }
}

impl<E: Into<anyhow::Error>> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError { code: 1, inner: e.into() }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            write!(f, "{:#}", self.inner)
        } else {
            write!(f, "{}", self.inner)
        }
    }
}

/// Result alias for subcommands.
pub type CliResult<T = ()> = Result<T, CliError>;

/// Attach a usage classification to a fallible value.
pub trait UsageContext<T> {
    /// Map the error to a usage error (exit 2) with a context line.
    fn usage(self, what: impl fmt::Display) -> CliResult<T>;
}

impl<T, E: Into<anyhow::Error>> UsageContext<T> for Result<T, E> {
    fn usage(self, what: impl fmt::Display) -> CliResult<T> {
        self.map_err(|e| CliError::usage(e.into().context(what.to_string())))
    }
}
