//! The weight-sync actor: moves each new policy version from the learner to the rollout actors.
