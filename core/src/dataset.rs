//! Datasets of tasks: the seed task mix generator and the JSONL task format.
