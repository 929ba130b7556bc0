//! The error-analysis table: one row per rollout, plus reward-hacking views.
