//! Data-parallel ranks: the gradient all-reduce in flat buckets, small
//! collectives for batch totals and statistics, and the parameter digest.
//!
//! On CPU the buffers are host memory handed to the collective in place (the
//! CPU ring); on CUDA they are device pointers (`data_ptr`) enqueued on the
//! legacy default stream, the stream libtorch computes on (NCCL), so no copy
//! to the host is made.
use super::error::Result;
use super::optim::{AdamW, ParamSet};
use rlmesh_comm::{all_gather_sharded, reduce_scatter_sharded, Buf, Collective, DType, ReduceOp, ShardLayout};
use rlmesh_comm::device_digest::DeviceDigest;
use tch::{Device, Kind, Tensor};

/// A communicator plus the device whose memory it reduces.
pub(crate) struct DataParallel {
    comm: Box<dyn Collective>,
    device: Device,
}

impl DataParallel {
    pub(crate) fn new(comm: Box<dyn Collective>, device: Device) -> Self {
        DataParallel { comm, device }
    }

    pub(crate) fn into_comm(self) -> Box<dyn Collective> {
        self.comm
    }

    pub(crate) fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub(crate) fn world(&self) -> usize {
        self.comm.world_size()
    }

    /// Sums a flat contiguous float32 tensor across ranks, in place, in buckets of `bucket_bytes`.
    pub(crate) fn all_reduce_flat(&mut self, flat: &Tensor, bucket_bytes: usize) -> Result<()> {
        assert!(flat.kind() == Kind::Float && flat.is_contiguous() && flat.device() == self.device, "flat float32 buffer on the learner's device");
        let total = flat.numel();
        let per_bucket = (bucket_bytes / 4).max(1);
        let base = flat.data_ptr() as *mut f32;
        let mut off = 0;
        while off < total {
            let len = per_bucket.min(total - off);
            // SAFETY: `flat` is a contiguous float32 tensor of `total` elements that
            // outlives the call, and nothing else touches it meanwhile; on CUDA the
            // collective is enqueued on the default stream that libtorch also uses.
            let buf = unsafe {
                let ptr = base.add(off);
                match self.device {
                    Device::Cpu => Buf::host(std::slice::from_raw_parts_mut(ptr, len)),
                    _ => Buf::cuda(ptr as *mut std::ffi::c_void, len, DType::F32, std::ptr::null_mut()),
                }
            };
            self.comm.all_reduce(buf, ReduceOp::Sum)?;
            off += len;
        }
        Ok(())
    }

    /// ZeRO-2: reduce-scatters the flat float32 gradients by `layout`'s buckets, in
    /// place: this rank's owned ranges hold the sums; the rest is scratch.
    pub(crate) fn reduce_scatter_flat(&mut self, flat: &Tensor, layout: &ShardLayout) -> Result<()> {
        // SAFETY: as `whole`'s contract; `flat` outlives the call and nothing else touches it.
        let buf = unsafe { self.whole(flat) };
        Ok(reduce_scatter_sharded(self.comm.as_mut(), buf, layout, ReduceOp::Sum)?)
    }

    /// After a sharded update: every rank's owned elements reach every rank. The
    /// flat gradient buffer (spent by now) carries them: this rank's parameters
    /// are copied into its owned ranges, the buffer is all-gathered by bucket,
    /// and every other rank's ranges are copied out into the parameters.
    pub(crate) fn gather_parameters(&mut self, params: &ParamSet, optim: &AdamW) -> Result<()> {
        let (flat, layout) = (&params.grads, &optim.layout);
        tch::no_grad(|| {
            for s in optim.segments() {
                flat.narrow(0, s.flat as i64, s.len as i64).copy_(&params.flat_param(s.param).narrow(0, s.at as i64, s.len as i64));
            }
        });
        // SAFETY: as `whole`'s contract; `flat` outlives the call and nothing else touches it.
        let buf = unsafe { self.whole(flat) };
        all_gather_sharded(self.comm.as_mut(), buf, layout)?;
        tch::no_grad(|| {
            for r in (0..layout.world).filter(|&r| r != optim.rank) {
                for s in params.segments(&layout.owned(r)) {
                    params.flat_param(s.param).narrow(0, s.at as i64, s.len as i64).copy_(&flat.narrow(0, s.flat as i64, s.len as i64));
                }
            }
        });
        Ok(())
    }

    /// All of a flat contiguous float32 tensor on the learner's device, as a collective's buffer.
    ///
    /// # Safety
    /// The tensor must outlive the returned buffer's use, and nothing else may touch it
    /// meanwhile; on CUDA the collective is enqueued on the default stream libtorch uses.
    unsafe fn whole(&self, flat: &Tensor) -> Buf<'static> {
        assert!(flat.kind() == Kind::Float && flat.is_contiguous() && flat.device() == self.device, "flat float32 buffer on the learner's device");
        let (ptr, len) = (flat.data_ptr() as *mut f32, flat.numel());
        match self.device {
            // SAFETY: the caller's contract; `len` floats at `ptr`.
            Device::Cpu => Buf::host(unsafe { std::slice::from_raw_parts_mut(ptr, len) }),
            // SAFETY: the caller's contract.
            _ => unsafe { Buf::cuda(ptr as *mut std::ffi::c_void, len, DType::F32, std::ptr::null_mut()) },
        }
    }

    /// Returns once every rank has entered.
    pub(crate) fn barrier(&mut self) -> Result<()> {
        Ok(self.comm.barrier()?)
    }

    /// Sums a few host numbers across ranks.
    pub(crate) fn sum(&mut self, data: &mut [f64]) -> Result<()> {
        self.small(data, |comm, buf| comm.all_reduce(buf, ReduceOp::Sum))
    }

    /// Every rank's copy of `data` (same length on every rank), by rank.
    pub(crate) fn gather(&mut self, data: &[f64]) -> Result<Vec<Vec<f64>>> {
        let (m, world, rank) = (data.len(), self.world(), self.rank());
        let mut all = vec![0.0; m * world];
        all[rank * m..(rank + 1) * m].copy_from_slice(data);
        self.small(&mut all, |comm, buf| comm.all_gather(buf))?;
        Ok(all.chunks(m.max(1)).map(<[f64]>::to_vec).collect())
    }

    fn small(&mut self, data: &mut [f64], op: impl FnOnce(&mut dyn Collective, Buf<'_>) -> rlmesh_comm::Result<()>) -> Result<()> {
        if self.device == Device::Cpu {
            return Ok(op(self.comm.as_mut(), Buf::host(data))?);
        }
        let t = Tensor::from_slice(data).to_device(self.device);
        // SAFETY: a fresh contiguous f64 device tensor of `data.len()` elements, alive until copied back.
        let buf = unsafe { Buf::cuda(t.data_ptr(), data.len(), DType::F64, std::ptr::null_mut()) };
        op(self.comm.as_mut(), buf)?;
        t.to_device(Device::Cpu).f_copy_data(data, data.len())?;
        Ok(())
    }
}

/// Mixes bytes into a 64-bit hash, eight at a time (fast; not cryptographic).
pub(crate) fn hash_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 29;
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3);
    }
    h ^ (bytes.len() as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9)
}

/// Digest of named tensors: names, shapes, dtypes and every byte, in the given order,
/// computed where the bytes are: a CPU tensor's bytes hashed in place (no copy), a GPU
/// tensor's by the WordMix64 kernel on its device (`rlmesh_comm::device_digest`), so
/// only 8 bytes per tensor come to the host. Ranks on the same kind of device agree.
pub fn digest_tensors(named: &[(String, Tensor)]) -> Result<u64> {
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for (name, t) in named {
        h = hash_bytes(h, name.as_bytes());
        h = hash_bytes(h, format!("{:?}{:?}", t.size(), t.kind()).as_bytes());
        let t = t.contiguous();
        let n = t.numel() * t.kind().elt_size_in_bytes();
        h = match t.device() {
            _ if n == 0 => hash_bytes(h, &[]),
            Device::Cuda(i) => hash_bytes(h, &on_device(i, &t, n)?.to_le_bytes()),
            // SAFETY: `t` is a contiguous CPU tensor of `n` bytes, alive and unwritten while it is read.
            _ => hash_bytes(h, unsafe { std::slice::from_raw_parts(t.data_ptr() as *const u8, n) }),
        };
    }
    Ok(h)
}

thread_local! {
    /// The digest kernel of the device this thread last digested on (a learner's device thread keeps one).
    static DEVICE_DIGEST: std::cell::RefCell<Option<(usize, DeviceDigest)>> = const { std::cell::RefCell::new(None) };
}

/// WordMix64 of the `n` bytes of contiguous tensor `t` on CUDA device `device`, computed there.
fn on_device(device: usize, t: &Tensor, n: usize) -> Result<u64> {
    DEVICE_DIGEST.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|(d, _)| *d != device) {
            *cell = Some((device, DeviceDigest::new(device)?));
        }
        let (_, kernel) = cell.as_mut().expect("set above");
        // The kernel reads 8-byte words: a view starting off a word boundary is copied to a fresh allocation.
        let t = if t.data_ptr() as usize % 8 == 0 { t.shallow_clone() } else { t.copy() };
        // SAFETY: `t` is contiguous on `device` and 8-byte aligned, alive until the digest
        // returns; the null stream orders the kernel after libtorch's writes.
        Ok(unsafe { kernel.digest(t.data_ptr() as u64, n, std::ptr::null_mut()) }?)
    })
}
