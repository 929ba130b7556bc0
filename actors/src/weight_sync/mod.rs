//! The weight-sync actor: moves each new policy version from the learner to
//! every rollout actor.
//!
//! Within one process the weights travel as a safetensors image in a message;
//! across processes the weight-sync group (`node::weights`) broadcasts the
//! same image, along a CPU ring or, between GPUs, by NCCL. Every receiver
//! checks the image's per-bucket digests (`rlmesh_comm::digest`; on a GPU the
//! device kernel of `rlmesh_comm::device_digest`) before loading it, refusing
//! a version whose bytes changed and naming the bucket, and reports the
//! version it now holds.
//!
//! [`image`] is the version as it travels and how a receiver checks and loads it;
//! [`parts`] the same version in bounded parts, for the data plane (a restarted
//! rollout process catching up).
pub mod image;
pub mod parts;

use self::image::WeightUpdate;
use crate::rollout::actor::RolloutMsg;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::time::Instant;

/// Messages of the weight-sync actor.
pub enum WeightSyncMsg {
    /// Send a version to every rollout actor. The first port answers once the
    /// update is queued at every receiver (so a request sent after it is served
    /// with the new version); the second once all acked, with the seconds it took.
    Publish(WeightUpdate, Vec<ActorRef<RolloutMsg>>, RpcReplyPort<()>, RpcReplyPort<Result<f64, String>>),
}

// In-process only: never serialised (ractor's `cluster` feature asks every message type to say so).
impl ractor::Message for WeightSyncMsg {}

/// The weight-sync actor (stateless between versions).
pub struct WeightSync;

impl Actor for WeightSync {
    type Msg = WeightSyncMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, _args: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(&self, _myself: ActorRef<Self::Msg>, msg: Self::Msg, _state: &mut ()) -> Result<(), ActorProcessingErr> {
        match msg {
            WeightSyncMsg::Publish(update, targets, queued, done) => {
                let t = Instant::now();
                let mut acks = vec![];
                for target in &targets {
                    let (tx, rx) = ractor::concurrency::oneshot();
                    if target.send_message(RolloutMsg::LoadWeights(update.clone(), tx.into())).is_ok() {
                        acks.push(rx);
                    } else {
                        acks.push({
                            let (tx, rx) = ractor::concurrency::oneshot();
                            let _ = tx.send(Err("rollout actor is gone".to_string()));
                            rx
                        });
                    }
                }
                let _ = queued.send(());
                let (version, digest) = (update.version, update.digest);
                tokio::spawn(async move {
                    let mut result = Ok(());
                    for rx in acks {
                        match rx.await {
                            Ok(Ok(a)) if a.version == version && a.digest == digest => {}
                            Ok(Ok(a)) => result = Err(format!("rollout acked v{} digest {:016x}, expected v{version} {digest:016x}", a.version, a.digest)),
                            Ok(Err(e)) => result = Err(e),
                            Err(_) => result = Err("rollout actor stopped before acking".to_string()),
                        }
                    }
                    let _ = done.send(result.map(|()| t.elapsed().as_secs_f64()));
                });
            }
        }
        Ok(())
    }
}
