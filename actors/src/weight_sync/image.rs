//! A policy version as it travels: a safetensors image with per-bucket XXH3
//! digests ([`WeightUpdate`]), packed from the learner's model ([`pack`]),
//! checked by every receiver before it loads a byte ([`verify`], naming the
//! bucket whose bytes changed) and loaded into a rollout model ([`load`]).
use rlmesh_comm::digest::BucketDigests;
use rlmesh_model::Transformer;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
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

/// Pack a model's parameters as version `version` (float32 on the host, whatever the model's dtype and device).
pub fn pack(model: &Transformer, version: u64) -> WeightUpdate {
    let vars: Vec<(String, Tensor)> = model.vs.variables().into_iter().map(|(n, t)| (n, t.detach().to_kind(Kind::Float))).collect();
    let image = rlmesh_model::io::safetensors_bytes(&vars, None).expect("float32 tensors serialise");
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
