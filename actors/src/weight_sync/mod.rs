//! The weight-sync actor: moves each new policy version from the learner to
//! every rollout actor.
//!
//! On CPU the weights travel as a safetensors image in a message (the data
//! plane); on GPUs the same versioned protocol would carry an NCCL broadcast.
//! Every receiver checks the image's per-bucket XXH3 digests
//! (`rlmesh_comm::digest`) before loading it, refusing a version whose bytes
//! changed and naming the bucket, and reports the version it now holds.
use crate::rollout::actor::RolloutMsg;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rlmesh_comm::digest::BucketDigests;
use rlmesh_model::Transformer;
use safetensors::tensor::{Dtype, View};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Instant;
use tch::{Kind, Tensor};

/// Bucket size of a weight image's digests (and of its transfer across processes).
pub const WEIGHT_BUCKET_BYTES: usize = 8 << 20;

/// One policy version as a safetensors image plus its digests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WeightUpdate {
    /// Policy version.
    pub version: u64,
    /// The combined digest of `image` (see [`BucketDigests::combined`]).
    pub digest: u64,
    /// XXH3-64 of each [`WEIGHT_BUCKET_BYTES`] bucket of `image`.
    pub buckets: BucketDigests,
    /// The parameters as one safetensors file (float32).
    pub image: Vec<u8>,
    /// The digests this process computed of `image` as it arrived (a receiver
    /// of the weight-sync group hashes each piece while copying it in), so
    /// that checking it need not read the image again. Never sent.
    #[serde(skip)]
    pub arrived: Option<Arrived>,
}

/// Digests computed of an image while it arrived, and the seconds they took.
#[derive(Clone, Debug, PartialEq)]
pub struct Arrived {
    /// The image's bucket digests, as this process received its bytes.
    pub digests: BucketDigests,
    /// Seconds spent hashing (inside the receive).
    pub seconds: f64,
}

/// A receiver's answer to a [`WeightUpdate`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WeightAck {
    /// Version now held.
    pub version: u64,
    /// The digest the receiver computed.
    pub digest: u64,
}

/// Errors of weight transfer.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    /// The received image does not hash to the sender's digests.
    #[error("weight update v{version}: digest mismatch in bucket {bucket} (sent {sent:016x}, received {received:016x}); version refused")]
    Digest {
        /// Version.
        version: u64,
        /// The first bucket that differs.
        bucket: usize,
        /// Sender's combined digest.
        sent: u64,
        /// Receiver's combined digest.
        received: u64,
    },
    /// The image is not a valid safetensors file.
    #[error("weight update v{version}: {message}")]
    Image {
        /// Version.
        version: u64,
        /// What was wrong.
        message: String,
    },
    /// Loading into the model failed.
    #[error(transparent)]
    Model(#[from] rlmesh_model::ModelError),
}

struct Host {
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Host {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Pack a model's parameters as version `version`.
pub fn pack(model: &Transformer, version: u64) -> WeightUpdate {
    let mut vars: Vec<(String, Tensor)> = model.vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let host: Vec<(String, Host)> = vars
        .iter()
        .map(|(n, t)| {
            let t = t.detach().to_kind(Kind::Float).to_device(tch::Device::Cpu).contiguous();
            let numel = t.numel();
            let mut bytes = vec![0u8; numel * 4];
            t.copy_data_u8(&mut bytes, numel);
            (n.clone(), Host { shape: t.size().iter().map(|&d| d as usize).collect(), bytes })
        })
        .collect();
    let image = safetensors::tensor::serialize(host.iter().map(|(n, h)| (n.as_str(), h)), None).expect("in-memory safetensors");
    let buckets = BucketDigests::of(&image, WEIGHT_BUCKET_BYTES);
    WeightUpdate { version, digest: buckets.combined(), buckets, image, arrived: None }
}

/// Verify and load an update into a model.
pub fn apply(model: &Transformer, update: &WeightUpdate) -> Result<WeightAck, WeightError> {
    let received = verify(update)?;
    load(model, update, received)
}

/// Checks every bucket's digest of the update against the sender's (hashing
/// the image unless its digests were computed as it arrived, in buckets of the
/// sender's size); returns the combined digest.
pub fn verify(update: &WeightUpdate) -> Result<u64, WeightError> {
    let ours = match &update.arrived {
        Some(a) if a.digests.bucket_bytes == update.buckets.bucket_bytes && a.digests.len == update.image.len() => a.digests.clone(),
        _ => BucketDigests::of(&update.image, update.buckets.bucket_bytes),
    };
    let received = ours.combined();
    if let Some(bucket) = ours.first_mismatch(&update.buckets).or((received != update.digest).then_some(0)) {
        return Err(WeightError::Digest { version: update.version, bucket, sent: update.digest, received });
    }
    Ok(received)
}

/// Loads a verified update (`received`: its digest, from [`verify`]) into a model.
pub fn load(model: &Transformer, update: &WeightUpdate, received: u64) -> Result<WeightAck, WeightError> {
    let st = safetensors::SafeTensors::deserialize(&update.image)
        .map_err(|e| WeightError::Image { version: update.version, message: e.to_string() })?;
    let mut map = HashMap::new();
    for (name, view) in st.tensors() {
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        let t = Tensor::f_from_data_size(view.data(), &shape, Kind::Float).map_err(rlmesh_model::ModelError::from)?;
        map.insert(name, t);
    }
    model.copy_from(std::path::Path::new("<weight update>"), &map)?;
    Ok(WeightAck { version: update.version, digest: received })
}

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
