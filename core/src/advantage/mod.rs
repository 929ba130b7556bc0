//! Advantage estimators on per-token data: GRPO, Dr.GRPO, RLOO, SLCA-GRPO, StepTool GAE.
