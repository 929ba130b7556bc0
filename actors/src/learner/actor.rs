//! The learner actor: a [`Learner`] on its own device thread, taking SFT and
//! policy-gradient batches, publishing weight images and writing checkpoints.
use super::{CheckpointMeta, Learner, LearnerConfig, SftBatch, StepStats, TrainBatch};
use crate::device::DeviceThread;
use crate::weight_sync::image::{pack, pack_on_device, WeightUpdate};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rlmesh_comm::cpu::RingAbort;
use rlmesh_comm::{Buf, Collective, DType, NcclComm, NcclId, ReduceOp, RingComm, RingConfig};
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
    /// The current weights as policy version `u64`; with `true` (for an NCCL
    /// weight-sync group) a GPU learner keeps the image on its GPU
    /// ([`pack_on_device`]), otherwise it is packed into host memory.
    Snapshot(u64, bool, RpcReplyPort<WeightUpdate>),
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
    /// Where it trains. On a CUDA device, ranks all-reduce by NCCL; the ring
    /// then only carries rank 0's unique id.
    pub device: tch::Device,
    /// Fault injection for tests: shut this rank's ring down before its N-th
    /// policy-gradient step, the process staying alive (a collective that broke).
    pub abort_ring_before_step: Option<u64>,
}

/// The learner actor.
pub struct LearnerActor;

/// State of a running learner actor.
pub struct LearnerState {
    device: DeviceThread<Learner>,
    /// (step, the ring's abort handle): see [`LearnerArgs::abort_ring_before_step`].
    fault: Option<(u64, RingAbort)>,
    trains: u64,
}

impl Actor for LearnerActor {
    type Msg = LearnerMsg;
    type State = LearnerState;
    type Arguments = LearnerArgs;

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, args: LearnerArgs) -> Result<Self::State, ActorProcessingErr> {
        let name = format!("learner-{}", args.ring.as_ref().map_or(0, |r| r.rank));
        let abort_at = args.abort_ring_before_step;
        let (abort_tx, abort_rx) = std::sync::mpsc::channel::<RingAbort>();
        let device = DeviceThread::spawn(&name, move || -> Result<Learner, String> {
            tch::set_num_threads(args.threads);
            let comm: Option<Box<dyn Collective>> = match &args.ring {
                Some(cfg) if cfg.world > 1 => {
                    let ring = RingComm::connect(cfg.clone()).map_err(|e| format!("learner rank {}: ring at {}: {e}", cfg.rank, cfg.addr))?;
                    if abort_at.is_some() {
                        let _ = abort_tx.send(ring.abort_handle().map_err(|e| e.to_string())?);
                    }
                    match args.device {
                        tch::Device::Cuda(ordinal) => Some(Box::new(nccl_group(ring, ordinal).map_err(|e| format!("learner rank {}: NCCL: {e}", cfg.rank))?)),
                        _ => Some(Box::new(ring)),
                    }
                }
                _ => None,
            };
            let model = Transformer::load(&args.model_dir, args.device, Some(args.config.precision_on(args.device).kind())).map_err(|e| e.to_string())?;
            Learner::new(model, args.config, comm).map_err(|e| e.to_string())
        })
        .await??;
        let fault = abort_at.zip(abort_rx.try_recv().ok());
        Ok(LearnerState { device, fault, trains: 0 })
    }

    async fn handle(&self, _myself: ActorRef<Self::Msg>, msg: Self::Msg, state: &mut Self::State) -> Result<(), ActorProcessingErr> {
        let device = &mut state.device;
        match msg {
            LearnerMsg::Sft(batch, reply) => {
                let out = device
                    .run(move |l| {
                        let (rank, world) = l.rank();
                        l.sft_step(&if world > 1 { batch.shard(rank, world) } else { batch }).map_err(|e| e.travelling())
                    })
                    .await?;
                let _ = reply.send(out);
            }
            LearnerMsg::Train(mut batch, reply) => {
                state.trains += 1;
                if let Some((at, ring)) = &state.fault {
                    if *at == state.trains {
                        eprintln!("[learner] fault injection: shutting this rank's ring down before policy step {at}");
                        ring.abort();
                    }
                }
                let out = device
                    .run(move |l| {
                        let (rank, world) = l.rank();
                        // GAE advantages are whitened over the whole batch: every rank computes them, then takes its shard.
                        l.prepare(&mut batch).map_err(|e| e.travelling())?;
                        l.train_step(&if world > 1 { batch.shard(rank, world) } else { batch }).map_err(|e| e.travelling())
                    })
                    .await?;
                let _ = reply.send(out);
            }
            LearnerMsg::Configure(config, reply) => {
                let out = device.run(move |l| l.reconfigure(config).map_err(|e| e.to_string())).await?;
                let _ = reply.send(out);
            }
            LearnerMsg::Snapshot(version, on_device, reply) => {
                let out = device.run(move |l| if on_device && l.model().device().is_cuda() { pack_on_device(l.model(), version) } else { pack(l.model(), version) }).await?;
                let _ = reply.send(out);
            }
            LearnerMsg::Checkpoint(root, meta, reply) => {
                // Every rank: rank 0 writes the checkpoint, and with sharded state each rank its own optimizer file.
                let out = device.run(move |l| l.save_checkpoint(&root, &meta).map_err(|e| e.to_string())).await?;
                let _ = reply.send(out);
            }
            LearnerMsg::Resume(root, config, reply) => {
                let out = device
                    .run(move |l| {
                        let comm = l.take_comm();
                        let kind = Some(config.precision_on(l.model().device()).kind());
                        let r = Learner::resume(&root, config, l.model().device(), kind, comm).map_err(|e| e.to_string())?;
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

/// The learners' NCCL communicator on CUDA device `ordinal`, formed over the
/// CPU ring that is already connected: rank 0 makes the unique id and
/// broadcasts its 128 bytes on the ring, every rank joins, and a warm-up
/// all-reduce of `rank + 1` must give `world·(world+1)/2` before the group is
/// trusted with gradients. The ring is closed after.
pub fn nccl_group(mut ring: RingComm, ordinal: usize) -> Result<NcclComm, String> {
    let (rank, world) = (ring.rank(), ring.world_size());
    let mut id = if rank == 0 { NcclId::new().map_err(|e| e.to_string())?.to_bytes() } else { [0u8; rlmesh_comm::nccl::NCCL_ID_BYTES] };
    ring.broadcast_bytes_with(&mut id, 0, &mut |_: &mut [u8]| {}).map_err(|e| format!("sending the unique id over the ring: {e}"))?;
    let id = NcclId::from_bytes(&id).map_err(|e| e.to_string())?;
    let mut comm = NcclComm::new(ordinal, rank, world, &id).map_err(|e| e.to_string())?;
    let probe = tch::Tensor::from_slice(&[rank as f32 + 1.0]).to_device(tch::Device::Cuda(ordinal));
    // SAFETY: a one-element contiguous f32 device tensor, alive until synchronized below; the legacy default stream.
    comm.all_reduce(unsafe { Buf::cuda(probe.data_ptr(), 1, DType::F32, std::ptr::null_mut()) }, ReduceOp::Sum).map_err(|e| e.to_string())?;
    comm.synchronize(std::ptr::null_mut()).map_err(|e| e.to_string())?;
    let (got, want) = (probe.double_value(&[0]), (world * (world + 1) / 2) as f64);
    if got != want {
        return Err(format!("warm-up all-reduce gave {got}, expected {want}"));
    }
    Ok(comm)
}
