//! The rollout actor: generates groups of trajectories with the multi-turn tool loop.
