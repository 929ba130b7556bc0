//! A policy version as it travels: a safetensors image with per-bucket XXH3
//! digests ([`WeightUpdate`]), packed from the learner's model ([`pack`]),
//! checked by every receiver before it loads a byte ([`verify`], naming the
//! bucket whose bytes changed) and loaded into a rollout model ([`load`]).
//!
//! Loading reads the image through one function, [`load_tensor`], whether its
//! bytes are in host memory (a view, not a copy) or already on the rollout
//! actor's GPU (an NCCL receiver's [`DeviceImage`]): the tensors are views into
//! the image, copied into the model's parameters.
use rlmesh_comm::digest::BucketDigests;
use rlmesh_model::Transformer;
use safetensors::tensor::{Dtype, Metadata};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tch::{Device, Kind, Tensor};

/// Bucket size of a weight image's digests (and of its transfer across processes).
pub const WEIGHT_BUCKET_BYTES: usize = 8 << 20;

/// One policy version as a safetensors image plus its digests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WeightUpdate {
    /// Policy version.
    pub version: u64,
    /// The combined digest of `image` (see [`BucketDigests::combined`]).
    pub digest: u64,
    /// XXH3-64 of each [`WEIGHT_BUCKET_BYTES`] bucket of `image` (of an
    /// image sent over NCCL from a device, [`pack_on_device`], WordMix64 as
    /// the sender's GPU computed it).
    pub buckets: BucketDigests,
    /// The parameters as one safetensors file (float32).
    pub image: Vec<u8>,
    /// The digests this process computed of `image` as it arrived (a receiver
    /// of the weight-sync group hashes each piece while copying it in), so
    /// that checking it need not read the image again. Never sent.
    #[serde(skip)]
    pub arrived: Option<Arrived>,
    /// The image already on this process's GPU, every bucket's digest computed
    /// there as it arrived and compared with the sender's (an NCCL receiver);
    /// `image` is then empty. Never sent.
    #[serde(skip)]
    pub on_device: Option<DeviceImage>,
}

/// A weight image in a 1-D `Uint8` tensor on a GPU (shared by the clones of
/// its update), with the outcome of its receiver's digest check there.
#[derive(Clone)]
pub struct DeviceImage {
    /// The image's bytes.
    pub bytes: Arc<Mutex<Tensor>>,
    /// The first bucket whose device digest differed from the sender's:
    /// (bucket, sent, received). [`verify`] refuses the version then.
    pub mismatch: Option<(usize, u64, u64)>,
}

impl DeviceImage {
    /// Wraps a 1-D `Uint8` tensor holding exactly the image's bytes, and its check.
    pub fn new(t: Tensor, mismatch: Option<(usize, u64, u64)>) -> DeviceImage {
        DeviceImage { bytes: Arc::new(Mutex::new(t)), mismatch }
    }
}

impl PartialEq for DeviceImage {
    fn eq(&self, other: &DeviceImage) -> bool {
        Arc::ptr_eq(&self.bytes, &other.bytes) && self.mismatch == other.mismatch
    }
}

impl std::fmt::Debug for DeviceImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.bytes.lock().expect("device image lock");
        write!(f, "DeviceImage({} bytes on {:?}, mismatch {:?})", t.numel(), t.device(), self.mismatch)
    }
}

/// Digests computed of an image while it arrived, and the seconds they took.
#[derive(Clone, Debug, PartialEq)]
pub struct Arrived {
    /// The image's bucket digests, as this process received its bytes.
    pub digests: BucketDigests,
    /// Seconds spent hashing bytes already received (the ring's blocks); a
    /// hash fused into the copy out of a shared segment counts in the
    /// receive, not here.
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

/// Pack a model's parameters as version `version` (float32 on the host,
/// whatever the model's dtype and device): each parameter copied once,
/// straight into its place in the safetensors image
/// ([`rlmesh_model::io::safetensors_image`]).
pub fn pack(model: &Transformer, version: u64) -> WeightUpdate {
    let vars: Vec<(String, Tensor)> = model.vs.variables().into_iter().collect();
    let image = rlmesh_model::io::safetensors_image(&vars, Some(Kind::Float), None).expect("float32 tensors serialise");
    let buckets = BucketDigests::of(&image, WEIGHT_BUCKET_BYTES);
    WeightUpdate { version, digest: buckets.combined(), buckets, image, arrived: None, on_device: None }
}

/// [`pack`] for an NCCL weight-sync group: the image built on the model's own
/// device ([`rlmesh_model::io::safetensors_image_on`]), so a GPU's parameters
/// never pass through the host, and held as [`WeightUpdate::on_device`] with
/// an empty host `image`. Its bucket digests are not computed here: the NCCL
/// link computes them on that device before it sends the header, so
/// `buckets.digests` is empty and `digest` 0 until then. [`WeightUpdate::to_host`]
/// turns it into what [`pack`] gives, for a group that sends host bytes.
pub fn pack_on_device(model: &Transformer, version: u64) -> WeightUpdate {
    let vars: Vec<(String, Tensor)> = model.vs.variables().into_iter().collect();
    let image = rlmesh_model::io::safetensors_image_on(&vars, Some(Kind::Float), None, model.device()).expect("float32 tensors serialise");
    let buckets = BucketDigests { bucket_bytes: WEIGHT_BUCKET_BYTES, len: image.numel(), digests: vec![] };
    WeightUpdate { version, digest: 0, buckets, image: vec![], arrived: None, on_device: Some(DeviceImage::new(image, None)) }
}

impl WeightUpdate {
    /// The update with its image in host memory and its XXH3 bucket digests
    /// (a [`pack_on_device`] image copied down; an update already on the host
    /// unchanged).
    pub fn to_host(self) -> WeightUpdate {
        let Some(dev) = self.on_device else { return self };
        let image = host_bytes(&dev.bytes.lock().expect("device image lock"));
        let buckets = BucketDigests::of(&image, self.buckets.bucket_bytes);
        WeightUpdate { version: self.version, digest: buckets.combined(), buckets, image, arrived: None, on_device: None }
    }
}

/// Verify and load an update into a model.
pub fn apply(model: &Transformer, update: &WeightUpdate) -> Result<WeightAck, WeightError> {
    let received = verify(update)?;
    load(model, update, received)
}

/// Checks every bucket's digest of the update against the sender's (hashing
/// the image unless its digests were computed as it arrived, in buckets of the
/// sender's size); returns the combined digest.
///
/// An image already on the GPU was digested there as it arrived, bucket by
/// bucket; it is refused, naming the bucket, if one differed from the sender's,
/// and otherwise stands verified with the sender's digest.
pub fn verify(update: &WeightUpdate) -> Result<u64, WeightError> {
    if let Some(dev) = &update.on_device {
        return match dev.mismatch {
            Some((bucket, sent, received)) => Err(WeightError::Digest { version: update.version, bucket, sent, received }),
            None => Ok(update.digest),
        };
    }
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
    if let Some(dev) = &update.on_device {
        return load_tensor(model, &dev.bytes.lock().expect("device image lock"), update.version, received);
    }
    // SAFETY: the tensor views `update.image`, which outlives it; `load_tensor`
    // only reads it, and every copy out of it has finished when it returns.
    let image = unsafe { Tensor::from_blob(update.image.as_ptr(), &[update.image.len() as i64], &[1], Kind::Uint8, Device::Cpu) };
    load_tensor(model, &image, update.version, received)
}

/// The longest safetensors header a weight image may have.
const MAX_HEADER_BYTES: usize = 100 << 20;

/// Loads a safetensors image held in a 1-D `Uint8` tensor, on the host or on
/// the model's GPU, into the model: its header is read on the host, every
/// tensor is a float32 view into the image, copied into its parameter.
/// The layout is checked as `safetensors` checks a file (tensors back to back,
/// sizes matching shapes, the data ending where the image ends).
pub fn load_tensor(model: &Transformer, image: &Tensor, version: u64, received: u64) -> Result<WeightAck, WeightError> {
    let bad = |message: String| WeightError::Image { version, message };
    let total = image.numel();
    if total < 8 {
        return Err(bad(format!("an image of {total} bytes has no safetensors header")));
    }
    let n = u64::from_le_bytes(host_bytes(&image.narrow(0, 0, 8)).try_into().expect("8 bytes")) as usize;
    if n > MAX_HEADER_BYTES || n > total - 8 {
        return Err(bad(format!("safetensors header of {n} bytes in an image of {total}")));
    }
    let meta: Metadata = serde_json::from_slice(&host_bytes(&image.narrow(0, 8, n as i64))).map_err(|e| bad(format!("safetensors header: {e}")))?;
    let data = 8 + n;
    let mut infos: Vec<_> = meta.tensors().into_iter().collect();
    infos.sort_by_key(|(_, info)| info.data_offsets);
    let mut end = 0usize;
    let mut map = HashMap::new();
    for (name, info) in infos {
        let (s, e) = info.data_offsets;
        let bytes = info.shape.iter().try_fold(4usize, |a, &d| a.checked_mul(d));
        if info.dtype != Dtype::F32 || s != end || e < s || bytes != Some(e - s) {
            return Err(bad(format!("tensor {name:?}: {:?} {:?} at bytes {s}..{e} is not the next float32 tensor (after byte {end})", info.dtype, info.shape)));
        }
        if data + e > total {
            return Err(bad(format!("tensor {name:?} ends at byte {}, past the image's {total}", data + e)));
        }
        end = e;
        let shape: Vec<i64> = info.shape.iter().map(|&d| d as i64).collect();
        let t = image.f_narrow(0, (data + s) as i64, (e - s) as i64).and_then(|t| t.f_view_dtype(Kind::Float)).and_then(|t| t.f_reshape(&shape));
        map.insert(name, t.map_err(|e| bad(format!("a view into the image: {e}")))?);
    }
    if data + end != total {
        return Err(bad(format!("the tensors end at byte {}, the image at {total}", data + end)));
    }
    model.copy_from(std::path::Path::new("<weight update>"), &map)?;
    Ok(WeightAck { version, digest: received })
}

/// The bytes of a 1-D `Uint8` tensor, on the host (one copy, from any device).
fn host_bytes(t: &Tensor) -> Vec<u8> {
    let mut out = vec![0u8; t.numel()];
    // SAFETY: `dst` views `out`, which outlives it; the copy into it is synchronous.
    let mut dst = unsafe { Tensor::from_blob(out.as_mut_ptr(), &[out.len() as i64], &[1], Kind::Uint8, Device::Cpu) };
    tch::no_grad(|| dst.f_copy_(t)).expect("copying an image to the host");
    out
}
