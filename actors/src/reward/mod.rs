//! The reward actor: scores trajectories by segment and step.
