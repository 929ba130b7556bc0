//! One learner rank as a process: `rlmesh-learner-rank JOB.json --rank R --world W --addr HOST:PORT`.
//!
//! The job file ([`RankJob`]) names a model directory, a config and a list
//! of batches; step `k` trains on batch `cursor mod len` (this rank's
//! share), where the cursor is the data cursor saved in checkpoints, so a
//! resumed run continues with the right batch. Each step prints one JSON line
//! ([`RankStep`]) on stdout. Ranks join a CPU ring at `--addr` (world > 1).
use super::batch::{SftBatch, TrainBatch};
use super::checkpoint::CheckpointMeta;
use super::config::LearnerConfig;
use super::error::{io_err, LearnerError, Result};
use super::trainer::Learner;
use rlmesh_comm::{Collective, RingComm, RingConfig};
use rlmesh_model::Transformer;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::ExitCode;
use tch::Device;

/// The batches of a job: policy-gradient or SFT.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobBatches {
    /// Policy-gradient batches for [`Learner::train_step`].
    Train(Vec<TrainBatch>),
    /// Supervised batches for [`Learner::sft_step`].
    Sft(Vec<SftBatch>),
}

/// What a rank process does.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankJob {
    /// The initial model (a transformers directory).
    pub model: PathBuf,
    /// Learner configuration.
    pub config: LearnerConfig,
    /// Batches, used in turn.
    pub batches: JobBatches,
    /// Steps to run (in total, counting steps before a resume).
    pub steps: u64,
    /// Checkpoint after every step here (rank 0 writes).
    #[serde(default)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Resume from `checkpoint_dir` instead of starting from `model`.
    #[serde(default)]
    pub resume: bool,
    /// Write this rank's final parameters to `DIR/rank{R}.safetensors`.
    #[serde(default)]
    pub out_dir: Option<PathBuf>,
    /// libtorch intra-op threads.
    #[serde(default = "one")]
    pub threads: i32,
}

fn one() -> i32 {
    1
}

/// One line of a rank's output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankStep {
    /// Train steps done after this one.
    pub step: u64,
    /// The step's loss.
    pub loss: f64,
    /// Parameter digest after the step.
    pub digest: String,
    /// Warnings from resuming (first step after a resume only).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Bytes of optimizer state this rank holds ([`Learner::optimizer_state_bytes`]).
    #[serde(default)]
    pub optimizer_bytes: u64,
    /// Wall seconds of the step ([`super::StepStats::seconds`]).
    #[serde(default)]
    pub seconds: f64,
    /// Tokens the step processed over all ranks ([`super::StepStats::tokens`]).
    #[serde(default)]
    pub tokens: u64,
}

/// Parses arguments (without the program name), runs the job, and returns the exit code (0 ok, 1 failure, 2 usage).
pub fn rank_main(args: impl IntoIterator<Item = String>) -> ExitCode {
    super::retain_freed_memory();
    let args: Vec<String> = args.into_iter().collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let (Some(job), Some(rank), Some(world)) = (args.first().cloned(), flag("--rank").and_then(|r| r.parse().ok()), flag("--world").and_then(|w| w.parse().ok())) else {
        eprintln!("usage: rlmesh-learner-rank JOB.json --rank R --world W [--addr HOST:PORT]");
        return ExitCode::from(2);
    };
    match run_rank(&PathBuf::from(job), rank, world, flag("--addr")) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rlmesh-learner-rank {rank}/{world}: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs a [`RankJob`] as rank `rank` of `world`.
pub fn run_rank(job_path: &std::path::Path, rank: usize, world: usize, addr: Option<String>) -> Result<()> {
    let text = std::fs::read(job_path).map_err(io_err(job_path))?;
    let job: RankJob = serde_json::from_slice(&text).map_err(|e| LearnerError::Config { field: "job", message: format!("{}: {e}", job_path.display()) })?;
    tch::set_num_threads(job.threads);
    let comm: Option<Box<dyn Collective>> = match (world, addr) {
        (1, _) => None,
        (_, Some(addr)) => Some(Box::new(RingComm::connect(RingConfig::new(rank, world, addr))?)),
        (_, None) => return Err(LearnerError::Config { field: "--addr", message: "needed with more than one rank".into() }),
    };
    let (mut learner, mut cursor, mut warnings) = match (&job.checkpoint_dir, job.resume) {
        (Some(dir), true) => {
            let r = Learner::resume(dir, job.config.clone(), Device::Cpu, Some(job.config.precision_on(Device::Cpu).kind()), comm)?;
            let cursor = r.meta.data_cursor.as_u64().unwrap_or(0);
            (r.learner, cursor, r.warnings)
        }
        _ => (Learner::new(Transformer::load(&job.model, Device::Cpu, Some(job.config.precision_on(Device::Cpu).kind()))?, job.config.clone(), comm)?, 0, vec![]),
    };
    while learner.train_steps() < job.steps {
        let stats = match &job.batches {
            JobBatches::Train(b) => learner.train_step(&b[cursor as usize % b.len()].shard(rank, world))?,
            JobBatches::Sft(b) => learner.sft_step(&b[cursor as usize % b.len()].shard(rank, world))?,
        };
        cursor += 1;
        if let Some(dir) = &job.checkpoint_dir {
            // Every rank: rank 0 writes, and each rank its optimizer shard when sharded.
            learner.save_checkpoint(dir, &CheckpointMeta { policy_version: learner.train_steps(), data_cursor: cursor.into() })?;
        }
        let line = RankStep {
            step: learner.train_steps(),
            loss: stats.loss,
            digest: format!("{:016x}", learner.parameter_digest()?),
            warnings: std::mem::take(&mut warnings),
            optimizer_bytes: learner.optimizer_state_bytes() as u64,
            seconds: stats.seconds,
            tokens: stats.tokens as u64,
        };
        println!("{}", serde_json::to_string(&line).expect("serialises"));
    }
    if let Some(out) = &job.out_dir {
        std::fs::create_dir_all(out).map_err(io_err(out))?;
        let named: Vec<(String, tch::Tensor)> = learner.model().vs.variables().into_iter().collect();
        rlmesh_model::io::write_safetensors(&out.join(format!("rank{rank}.safetensors")), &named)?;
    }
    Ok(())
}
