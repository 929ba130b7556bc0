//! Reward functions: process-aware reward, HierR, StepTool annotators, judges, TRL-style combination.
