//! The learner: policy-gradient losses, optimiser, data-parallel ranks, checkpoints.
