//! Offline re-scoring: the logic behind `launcher advantages` and `launcher reward` (JSON in, JSON out).
