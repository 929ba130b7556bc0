//! The learner actor: a [`Learner`] on its own device thread, taking SFT and
//! policy-gradient batches, publishing weight images and writing checkpoints.
use super::{CheckpointMeta, Learner, LearnerConfig, SftBatch, StepStats, TrainBatch};
use crate::device::DeviceThread;
use crate::weight_sync::image::{pack, WeightUpdate};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rlmesh_comm::{Collective, RingComm, RingConfig};
use rlmesh_model::Transformer;
use std::path::PathBuf;

/// Messages of the learner actor.
pub enum LearnerMsg {
    /// One supervised step.
    Sft(SftBatch, RpcReplyPort<Result<StepStats, String>>),
    /// One policy-gradient step.
    Train(TrainBatch, RpcReplyPort<Result<StepStats, String>>),
    /// Change the learning rate and clip settings (SFT → RL).
    Configure(LearnerConfig, RpcReplyPort<Result<(), String>>),
    /// The current weights as policy version `u64`.
    Snapshot(u64, RpcReplyPort<WeightUpdate>),
    /// Write a checkpoint under the root directory.
    Checkpoint(PathBuf, CheckpointMeta, RpcReplyPort<Result<PathBuf, String>>),
    /// Replace the learner by the newest usable checkpoint under the root directory
    /// (weights, optimiser state, step counters, RNG), trained on with `LearnerConfig`;
    /// replies with the pipeline's record from that checkpoint.
    Resume(PathBuf, LearnerConfig, RpcReplyPort<Result<CheckpointMeta, String>>),
}

// In-process only: never serialised (ractor's `cluster` feature asks every message type to say so).
impl ractor::Message for LearnerMsg {}

/// Start-up arguments of the learner actor.
#[derive(Clone)]
pub struct LearnerArgs {
    /// Model directory to start from.
    pub model_dir: PathBuf,
    /// Learner settings.
    pub config: LearnerConfig,
    /// Intra-op threads.
    pub threads: i32,
    /// A data-parallel rank's ring (rank, world, rank 0's address, cookie,
    /// bind address); `None` is a single learner. Each rank trains on its
    /// shard of every batch.
    pub ring: Option<RingConfig>,
}

/// The learner actor.
pub struct LearnerActor;

impl Actor for LearnerActor {
    type Msg = LearnerMsg;
    type State = DeviceThread<Learner>;
    type Arguments = LearnerArgs;

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, args: LearnerArgs) -> Result<Self::State, ActorProcessingErr> {
        let name = format!("learner-{}", args.ring.as_ref().map_or(0, |r| r.rank));
        let device = DeviceThread::spawn(&name, move || -> Result<Learner, String> {
            tch::set_num_threads(args.threads);
            let comm: Option<Box<dyn Collective>> = match &args.ring {
                Some(cfg) if cfg.world > 1 => Some(Box::new(RingComm::connect(cfg.clone()).map_err(|e| format!("learner rank {}: ring at {}: {e}", cfg.rank, cfg.addr))?)),
                _ => None,
            };
            let model = Transformer::load(&args.model_dir, tch::Device::Cpu, Some(tch::Kind::Float)).map_err(|e| e.to_string())?;
            Learner::new(model, args.config, comm).map_err(|e| e.to_string())
        })
        .await??;
        Ok(device)
    }

    async fn handle(&self, _myself: ActorRef<Self::Msg>, msg: Self::Msg, device: &mut Self::State) -> Result<(), ActorProcessingErr> {
        match msg {
            LearnerMsg::Sft(batch, reply) => {
                let out = device
                    .run(move |l| {
                        let (rank, world) = l.rank();
                        l.sft_step(&if world > 1 { batch.shard(rank, world) } else { batch }).map_err(|e| e.to_string())
                    })
                    .await?;
                let _ = reply.send(out);
            }
            LearnerMsg::Train(mut batch, reply) => {
                let out = device
                    .run(move |l| {
                        let (rank, world) = l.rank();
                        // GAE advantages are whitened over the whole batch: every rank computes them, then takes its shard.
                        l.prepare(&mut batch).map_err(|e| e.to_string())?;
                        l.train_step(&if world > 1 { batch.shard(rank, world) } else { batch }).map_err(|e| e.to_string())
                    })
                    .await?;
                let _ = reply.send(out);
            }
            LearnerMsg::Configure(config, reply) => {
                let out = device.run(move |l| l.reconfigure(config).map_err(|e| e.to_string())).await?;
                let _ = reply.send(out);
            }
            LearnerMsg::Snapshot(version, reply) => {
                let out = device.run(move |l| pack(l.model(), version)).await?;
                let _ = reply.send(out);
            }
            LearnerMsg::Checkpoint(root, meta, reply) => {
                // Ranks hold identical state after every step: rank 0 writes for all.
                let out = device.run(move |l| if l.rank().0 == 0 { l.save_checkpoint(&root, &meta).map_err(|e| e.to_string()) } else { Ok(root) }).await?;
                let _ = reply.send(out);
            }
            LearnerMsg::Resume(root, config, reply) => {
                let out = device
                    .run(move |l| {
                        let comm = l.take_comm();
                        let r = Learner::resume(&root, config, tch::Device::Cpu, Some(tch::Kind::Float), comm).map_err(|e| e.to_string())?;
                        *l = r.learner;
                        Ok(r.meta)
                    })
                    .await?;
                let _ = reply.send(out);
            }
        }
        Ok(())
    }
}
