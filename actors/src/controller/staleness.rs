//! Staleness admission: may a scored group be trained at the learner's current version?
//!
//! Every generated token records the policy version that produced it. A
//! group's *staleness* at learner version `V` is `V − v`, where `v` is the
//! version of its oldest token. The run's [`Mode`] bounds it:
//!
//! | mode | admits |
//! |---|---|
//! | `sync` | `V − v = 0` (on-policy) |
//! | `one_step_off` | `V − v ≤ 1` |
//! | `async` | `V − v ≤ k` (`max_staleness`) |
//!
//! A group over the bound is never trained on; the controller drops it (or
//! re-generates it) and [`Gate`] counts it.
use serde::{Deserialize, Serialize};

/// How far behind the learner a trained group may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum Mode {
    /// On-policy: rollouts wait for every update.
    Sync,
    /// Generation of step n+1 overlaps training of step n.
    OneStepOff,
    /// Rollouts run freely, at most `max_staleness` versions behind.
    Async {
        /// The bound k, in policy versions.
        max_staleness: u64,
    },
}

impl Mode {
    /// The largest admitted staleness: 0, 1 or k.
    pub fn max_staleness(self) -> u64 {
        match self {
            Mode::Sync => 0,
            Mode::OneStepOff => 1,
            Mode::Async { max_staleness } => max_staleness,
        }
    }
}

/// The decision for one scored group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Train on it; it is `staleness` versions behind.
    Train {
        /// `V − v`.
        staleness: u64,
    },
    /// Over the bound: never train on it.
    Stale {
        /// `V − v`.
        staleness: u64,
    },
}

/// A group claims a policy version the learner has not reached: a bookkeeping bug upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("group's oldest token has policy version {group_version}, ahead of the learner's version {learner_version}")]
pub struct AheadOfLearner {
    /// `v`, the version of the group's oldest token.
    pub group_version: u64,
    /// `V`, the learner's version.
    pub learner_version: u64,
}

/// Decides whether a group whose oldest token has version `group_version` may be trained at `learner_version`.
pub fn admit(mode: Mode, group_version: u64, learner_version: u64) -> Result<Admission, AheadOfLearner> {
    let staleness = learner_version.checked_sub(group_version).ok_or(AheadOfLearner { group_version, learner_version })?;
    Ok(if staleness <= mode.max_staleness() { Admission::Train { staleness } } else { Admission::Stale { staleness } })
}

/// [`admit`] with running counts of admitted and stale groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate {
    /// The run's mode.
    pub mode: Mode,
    /// Groups admitted so far.
    pub admitted: u64,
    /// Groups refused as stale so far.
    pub stale: u64,
}

impl Gate {
    /// A gate with zero counts.
    pub fn new(mode: Mode) -> Gate {
        Gate { mode, admitted: 0, stale: 0 }
    }

    /// [`admit`], counting the outcome (a version ahead of the learner counts as neither).
    pub fn admit(&mut self, group_version: u64, learner_version: u64) -> Result<Admission, AheadOfLearner> {
        let a = admit(self.mode, group_version, learner_version)?;
        match a {
            Admission::Train { .. } => self.admitted += 1,
            Admission::Stale { .. } => self.stale += 1,
        }
        Ok(a)
    }
}
