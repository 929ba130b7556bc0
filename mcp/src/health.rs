//! A server's restart budget: failures in a row, the back-off before the next
//! start, and the verdict once the budget is spent.
//!
//! Every failure (a call that timed out, a server that died or would not
//! start) counts; a call the server answers resets the count. Each start after
//! a failure waits `BACKOFF_BASE · 2^(failures − 1)` (at most
//! `BACKOFF_MAX`) from that failure. The failure past `max_restarts` gives the
//! server up for good: every later start or call reports
//! [`McpError::BudgetExhausted`].
use crate::error::McpError;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The back-off after the first failure.
pub(crate) const BACKOFF_BASE: Duration = Duration::from_millis(200);
/// The longest back-off.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// The back-off before the start that follows the `failures`-th failure in a row.
pub(crate) fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (BACKOFF_BASE * (1u32 << doublings)).min(BACKOFF_MAX)
}

#[derive(Debug)]
struct State {
    failures: u32,
    retry_at: Option<Instant>,
    given_up: bool,
    last: String,
}

/// The restart budget of one server (shared by all its sessions).
#[derive(Debug)]
pub(crate) struct Health {
    max_restarts: u32,
    state: Mutex<State>,
}

impl Health {
    /// A fresh budget of `max_restarts` failures in a row.
    pub(crate) fn new(max_restarts: u32) -> Self {
        Health { max_restarts, state: Mutex::new(State { failures: 0, retry_at: None, given_up: false, last: String::new() }) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a failure; past the budget the server is given up.
    pub(crate) fn failed(&self, reason: String) {
        let mut s = self.state();
        s.failures += 1;
        s.given_up |= s.failures > self.max_restarts;
        s.retry_at = Some(Instant::now() + backoff(s.failures));
        s.last = reason;
    }

    /// Records a call the server answered: the failures in a row start over.
    pub(crate) fn succeeded(&self) {
        let mut s = self.state();
        if !s.given_up {
            s.failures = 0;
        }
    }

    /// `Err(BudgetExhausted)` once the server is given up.
    pub(crate) fn check(&self, server: &str) -> Result<(), McpError> {
        let s = self.state();
        match s.given_up {
            true => Err(McpError::BudgetExhausted {
                server: server.to_string(),
                failures: s.failures,
                max_restarts: self.max_restarts,
                last: s.last.clone(),
            }),
            false => Ok(()),
        }
    }

    /// How long a start must wait for the back-off, or `Err` once given up.
    pub(crate) fn admit(&self, server: &str) -> Result<Duration, McpError> {
        self.check(server)?;
        let s = self.state();
        Ok(s.retry_at.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let ms: Vec<u128> = (1..=8).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(ms, [200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn the_failure_past_the_budget_gives_the_server_up_and_a_success_resets_the_count() {
        let h = Health::new(2);
        h.failed("one".into());
        h.failed("two".into());
        assert!(h.admit("s").unwrap() > Duration::from_millis(300), "the second back-off is 400 ms");
        h.succeeded();
        h.failed("three".into());
        h.failed("four".into());
        assert_eq!(h.check("s"), Ok(()));
        h.failed("five".into());
        let e = h.admit("s").unwrap_err();
        assert!(e.is_fatal());
        assert_eq!(e.to_string(), "tool server \"s\" is given up after 3 failures in a row (max_restarts = 2); the last: five");
        h.succeeded();
        assert!(h.check("s").is_err(), "given up for good");
    }
}
