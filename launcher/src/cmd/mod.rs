//! One module per group of subcommands.
pub mod bench;
pub mod bench_grpo;
pub mod bench_pack;
pub mod bench_pipeline;
pub mod bench_rollout;
pub mod chat;
pub mod inspect;
pub mod k8s;
pub mod monitor;
pub mod plan;
pub mod report;
pub mod serve;
pub mod slurm;
pub mod status;
pub mod submit;
pub mod up;

use crate::error::{CliResult, UsageContext};
use std::path::Path;

/// Load a model and its tokenizer from a directory on the CPU.
pub fn load_model(dir: &Path) -> CliResult<(rlmesh_model::Transformer, rlmesh_model::Tokenizer)> {
    let model = rlmesh_model::Transformer::load(dir, tch::Device::Cpu, Some(tch::Kind::Float)).usage("loading the model")?;
    let tok = rlmesh_model::Tokenizer::load(dir).usage("loading the tokenizer")?;
    Ok((model, tok))
}
