//! The weight-sync group on GPUs: the same versions as the CPU ring, with the
//! image broadcast by NCCL from device memory to device memory.
//!
//! The group's TCP ring stays connected beside the NCCL communicator: it
//! carries the vote that every member can use NCCL, rank 0's unique id, and
//! each version's header (version, the image's bucket digests, and the
//! WordMix64 digest of each bucket as rank 0's GPU holds it). The image goes
//! over NCCL; each receiver digests every bucket on its GPU (the NVRTC kernel
//! of `rlmesh_comm::device_digest`); the rollout actor refuses the version,
//! naming the bucket and counting it, when one differs from rank 0's (the
//! check `weight_sync::image::verify` makes), and otherwise loads it from that
//! GPU buffer ([`crate::weight_sync::image::load_tensor`]): no host copy on
//! the receiving side. A learner on a GPU packs the image there
//! ([`crate::weight_sync::image::pack_on_device`]), so no host copy on the
//! sending side either; its header then names the version by the device
//! digests (a host image, from a CPU learner, is copied up and keeps its XXH3
//! digests).
//!
//! The image crosses NCCL as 32-bit words (NCCL's broadcast copies bits
//! unchanged; the last word is zero-padded on every member).
//!
//! NCCL refuses two ranks of one communicator on one GPU; on a node with
//! `share_gpus` the plan gives each process its own `NCCL_HOSTID`, so NCCL
//! treats them as different hosts and moves the bytes over its network
//! transport (a development set-up, not a fast one).
use super::weights::{receive_header, send_header, Header, GROUP_TIMEOUT};
use crate::weight_sync::image::{DeviceImage, WeightUpdate};
use rlmesh_comm::device_digest::DeviceDigest;
use rlmesh_comm::digest::BucketDigests;
use rlmesh_comm::nccl::NCCL_ID_BYTES;
use rlmesh_comm::{nccl_available, Buf, Collective, CollectiveExt, DType, NcclComm, NcclId, RingComm};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// A member's NCCL link: the ring for the small things, NCCL for the image.
pub(super) struct NcclLink {
    ring: RingComm,
    comm: NcclComm,
    digest: DeviceDigest,
    device: usize,
}

/// The null stream: libtorch's copies here run on the legacy default stream, and
/// so do the broadcast and the digest kernel, so each waits for the one before.
fn stream() -> *mut std::ffi::c_void {
    std::ptr::null_mut()
}

impl NcclLink {
    /// Forms the NCCL communicator over a connected ring. Every member first
    /// says whether it can (a GPU, libnccl, and on rank 0 a unique id); if
    /// one cannot, every member fails at once with the count, instead of the
    /// others waiting in NCCL's bootstrap for a rank that never comes.
    /// `cancel`: the member's abort flag; a broadcast waiting on a member known
    /// to be gone ends when it is set (the communicator aborted, its kernels
    /// released), not at the group's timeout.
    pub(super) fn form(mut ring: RingComm, device: Option<usize>, cancel: Arc<AtomicBool>) -> Result<NcclLink, String> {
        let (rank, world) = (ring.rank(), ring.world_size());
        let mut reason = match device {
            None => Some("this member computes on the CPU".to_string()),
            Some(_) => nccl_available().err().map(|e| e.to_string()),
        };
        let mut id = [0u8; NCCL_ID_BYTES];
        if rank == 0 && reason.is_none() {
            match NcclId::new() {
                Ok(i) => id = i.to_bytes(),
                Err(e) => reason = Some(e.to_string()),
            }
        }
        let mut able = [if reason.is_none() { 1.0f32 } else { 0.0 }];
        ring.all_reduce_sum(&mut able).map_err(|e| format!("NCCL vote over the ring: {e}"))?;
        let able = able[0].round() as usize;
        if able != world {
            let this = reason.map(|r| format!("; this member (rank {rank}): {r}")).unwrap_or_default();
            return Err(format!("NCCL weight-sync group: {} of {world} members cannot use NCCL{this}", world - able));
        }
        let device = device.expect("voted able");
        ring.broadcast_bytes_with(&mut id, 0, &mut |_: &mut [u8]| {}).map_err(|e| format!("sending the NCCL id over the ring: {e}"))?;
        let id = NcclId::from_bytes(&id).map_err(|e| e.to_string())?;
        let comm = NcclComm::new(device, rank, world, &id).map_err(|e| e.to_string())?.with_timeout(GROUP_TIMEOUT).with_cancel(cancel);
        let digest = DeviceDigest::new(device).map_err(|e| e.to_string())?;
        Ok(NcclLink { ring, comm, digest, device })
    }

    /// Rank 0: the image on this GPU (packed there by the learner,
    /// [`crate::weight_sync::image::pack_on_device`], or copied up from a host
    /// image), its buckets digested there, the header over the ring, the image
    /// over NCCL. Returns the seconds it took.
    pub(super) fn send(&mut self, update: WeightUpdate) -> Result<f64, String> {
        let t0 = Instant::now();
        let (dev, n) = match &update.on_device {
            Some(image) => self.on_this_gpu(&image.bytes.lock().expect("device image lock"), update.version)?,
            None => {
                let n = update.image.len();
                // SAFETY: `update.image` outlives `host`, which is only read by the synchronous copy below.
                let host = unsafe { Tensor::from_blob(update.image.as_ptr(), &[n as i64], &[1], Kind::Uint8, Device::Cpu) };
                let dev = self.words(n, update.version)?;
                dev.narrow(0, 0, n as i64).copy_(&host);
                (dev, n)
            }
        };
        let device_digests = self.bucket_digests(&dev, n, update.buckets.bucket_bytes)?;
        // A device image has no host digests: its version is named by its device digests.
        let (digest, buckets) = match update.on_device {
            Some(_) => {
                let buckets = BucketDigests { bucket_bytes: update.buckets.bucket_bytes, len: n, digests: device_digests.clone() };
                (buckets.combined(), buckets)
            }
            None => (update.digest, update.buckets),
        };
        send_header(&mut self.ring, &Header { version: update.version, digest, buckets, device_digests })?;
        self.broadcast(&dev, update.version)?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// A device image as the broadcast's buffer on this GPU: itself when it is
    /// already one here of whole 32-bit words (a float32 safetensors image
    /// always is), otherwise a device-to-device copy into one.
    fn on_this_gpu(&self, image: &Tensor, version: u64) -> Result<(Tensor, usize), String> {
        let n = image.numel();
        if image.device() == Device::Cuda(self.device) && n % 4 == 0 && image.is_contiguous() {
            return Ok((image.shallow_clone(), n));
        }
        let dev = self.words(n, version)?;
        dev.narrow(0, 0, n as i64).f_copy_(image).map_err(|e| format!("weight update v{version}: the image onto GPU {}: {e}", self.device))?;
        Ok((dev, n))
    }

    /// Any other rank: the header, the image into this GPU over NCCL, every
    /// bucket's device digest checked, then the image copied to the host.
    pub(super) fn receive(&mut self) -> Result<WeightUpdate, String> {
        let header = receive_header(&mut self.ring)?;
        let n = header.buckets.len;
        let dev = self.words(n, header.version)?;
        self.broadcast(&dev, header.version)?;
        let t = Instant::now();
        let ours = self.bucket_digests(&dev, n, header.buckets.bucket_bytes)?;
        if ours.len() != header.device_digests.len() {
            return Err(format!("weight update v{}: {} device digests sent for {} buckets; version refused", header.version, header.device_digests.len(), ours.len()));
        }
        let mismatch = ours.iter().zip(&header.device_digests).position(|(a, b)| a != b).map(|k| (k, header.device_digests[k], ours[k]));
        let digest_s = t.elapsed().as_secs_f64();
        eprintln!("[weights] v{}: {:.1} MB over NCCL, {} bucket digests on the GPU in {:.4}s", header.version, n as f64 / 1e6, ours.len(), digest_s);
        // The rollout actor loads it from this GPU buffer (views into it, copied into its parameters).
        let on_device = Some(DeviceImage::new(dev.narrow(0, 0, n as i64), mismatch));
        Ok(WeightUpdate { version: header.version, digest: header.digest, buckets: header.buckets, image: vec![], arrived: None, on_device })
    }

    /// A zeroed device buffer of whole 32-bit words holding `n` bytes (an
    /// error, not a panic, when the GPU cannot hold it).
    fn words(&self, n: usize, version: u64) -> Result<Tensor, String> {
        Tensor::f_zeros([(n.div_ceil(4) * 4) as i64], (Kind::Uint8, Device::Cuda(self.device)))
            .map_err(|e| format!("weight update v{version}: a GPU buffer of {n} bytes: {}", e.to_string().lines().next().unwrap_or("")))
    }

    fn broadcast(&mut self, dev: &Tensor, version: u64) -> Result<(), String> {
        let words = dev.numel() / 4;
        // SAFETY: `dev` is a contiguous device tensor of `words` 32-bit words on this
        // member's GPU, alive until the synchronize below returns.
        let buf = unsafe { Buf::cuda(dev.data_ptr(), words, DType::F32, stream()) };
        self.comm.broadcast(buf, 0).and_then(|()| self.comm.synchronize(stream())).map_err(|e| format!("weight broadcast v{version} over NCCL: {e}"))
    }

    /// WordMix64 of each `bucket_bytes` bucket of the first `n` bytes of `dev`, on the GPU.
    fn bucket_digests(&mut self, dev: &Tensor, n: usize, bucket_bytes: usize) -> Result<Vec<u64>, String> {
        let base = dev.data_ptr() as u64;
        let bucket_bytes = bucket_bytes.max(8);
        (0..n.div_ceil(bucket_bytes))
            .map(|k| {
                let (off, len) = (k * bucket_bytes, bucket_bytes.min(n - k * bucket_bytes));
                // SAFETY: bytes off..off+len of `dev`, 8-byte aligned (libtorch's
                // allocations are, and bucket sizes are multiples of 8), read on the stream that wrote them.
                unsafe { self.digest.digest(base + off as u64, len, stream()) }.map_err(|e| format!("device digest of bucket {k}: {e}"))
            })
            .collect()
    }
}
