//! The NCCL backend, through cudarc with dynamic loading.
//!
//! Nothing CUDA is linked at build time: `libcuda.so` and `libnccl.so` are
//! opened with `dlopen` on first use, so this crate builds (and its CPU
//! backend runs) on a machine with no CUDA at all, and [`NcclComm::new`]
//! returns [`CommError::NcclUnavailable`] there.
//!
//! **Finding `libnccl.so`.** cudarc tries the names `libnccl.so`,
//! `libnccl64.so`, `libnccl.so.12`, `libnccl.so.1`, … through the system
//! loader, i.e. `LD_LIBRARY_PATH`, the ld.so cache, and the usual system
//! folders; it never tries `libnccl.so.2`, which is what PyTorch's wheels ship
//! (`<venv>/lib/python3.x/site-packages/nvidia/nccl/lib/libnccl.so.2`).
//! `scripts/setup-python.sh` creates the `libnccl.so → libnccl.so.2` link in
//! that folder; put the folder on `LD_LIBRARY_PATH` before starting the
//! process (the loader reads it at start-up, so setting it from inside the
//! process is too late):
//!
//! ```text
//! export LD_LIBRARY_PATH="$("$VENV/bin/python" -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))'):$LD_LIBRARY_PATH"
//! ```
//!
//! Put the venv's folder *first*: libtorch loads `libnccl.so.2` from it, and
//! when `libnccl.so` resolves to that same file the loader hands back the
//! one copy already in the process. If it resolved to another file (say a
//! system `/usr/lib/x86_64-linux-gnu/libnccl.so`, as on the H200 test image,
//! where it is NCCL 2.28.3 while the wheel's is 2.28.9), the process would
//! hold two NCCLs side by side.
//!
//! **Threads.** An NCCL communicator is bound to one device and, like
//! cudarc's `Comm`, is `!Send`: create and use [`NcclComm`] on the one OS
//! thread that owns the device and its tensors (never a tokio worker). It
//! makes the device's primary context current on that thread, which is the
//! context the CUDA runtime (and so libtorch) uses.
//!
//! **Pointers and streams.** Collectives take [`Buf::cuda`] buffers: a raw
//! device pointer (e.g. a tch tensor's `data_ptr()`), an element count, a
//! [`DType`] and the stream to enqueue on (tch's current stream). They are
//! asynchronous like every NCCL call; [`NcclComm::synchronize`] waits with a
//! timeout and aborts the communicator if a peer has died.
//!
//! **Panics.** cudarc's dynamic loading panics when a library or symbol is
//! missing. We first check that both libraries can be opened (cudarc's own
//! `is_culib_present`, which runs `libloading` over the same candidate
//! names), and additionally run every CUDA/NCCL call under `catch_unwind`, so
//! a missing library or symbol becomes an error, never a panic.

use std::ffi::{c_void, CStr};
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::{result as cu, sys as cusys};
use cudarc::nccl::{result as nc, sys as ncsys};

use crate::buffer::{Buf, DType, Memory};
use crate::collective::{Collective, ReduceOp};
use crate::error::{CommError, Result};

/// Byte length of an NCCL unique id.
pub const NCCL_ID_BYTES: usize = 128;

/// Default bound on [`NcclComm::synchronize`] and [`Collective::barrier`].
pub const DEFAULT_NCCL_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs `f`, turning a panic from cudarc's loader into an error.
fn guard<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_loader_panic(what, CommError::NcclUnavailable, f)
}

/// Runs `f`; a panic (cudarc's dynamic loader panics on a missing library or
/// symbol) becomes `wrap("{what}: {message}")`.
pub(crate) fn catch_loader_panic<T>(what: &str, wrap: fn(String) -> CommError, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(wrap(format!("{what}: {msg}")))
        }
    }
}

/// Checks that the CUDA driver and NCCL libraries can be loaded and the driver initialised.
///
/// Returns [`CommError::NcclUnavailable`] naming what is missing and how to provide it.
pub fn nccl_available() -> Result<()> {
    // SAFETY: these only try to dlopen the candidate names.
    if !unsafe { cusys::is_culib_present() } {
        return Err(CommError::NcclUnavailable(format!(
            "the CUDA driver library was not found (searched {:?}); is an NVIDIA driver installed?",
            cudarc::get_lib_name_candidates("cuda")
        )));
    }
    if !unsafe { ncsys::is_culib_present() } {
        return Err(CommError::NcclUnavailable(format!(
            "libnccl was not found (searched {:?} on LD_LIBRARY_PATH and the system folders); \
             PyTorch's wheels ship nvidia/nccl/lib/libnccl.so.2: scripts/setup-python.sh links \
             libnccl.so beside it; add that folder to LD_LIBRARY_PATH",
            cudarc::get_lib_name_candidates("nccl")
        )));
    }
    guard("initialising the CUDA driver", || {
        cu::init().map_err(|e| CommError::NcclUnavailable(format!("cuInit failed: {e:?} (no usable GPU?)")))
    })
}

/// The installed NCCL's version code (e.g. 22805 for 2.28.5).
pub fn nccl_version() -> Result<i32> {
    nccl_available()?;
    guard("ncclGetVersion", || {
        nc::get_nccl_version().map_err(|e| CommError::Nccl {
            rank: 0,
            call: "ncclGetVersion",
            detail: nccl_error_text(e.0),
        })
    })
}

fn nccl_error_text(r: ncsys::ncclResult_t) -> String {
    // SAFETY: ncclGetErrorString returns a static string.
    let s = unsafe {
        let p = ncsys::ncclGetErrorString(r);
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    format!("{r:?}: {s}")
}

/// Rank 0's NCCL unique id: 128 opaque bytes to send to every other rank over the control channel.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclId([u8; NCCL_ID_BYTES]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclId({:02x?}…)", &self.0[..8])
    }
}

impl NcclId {
    /// Asks NCCL for a fresh id (rank 0 does this once per communicator).
    pub fn new() -> Result<NcclId> {
        nccl_available()?;
        guard("ncclGetUniqueId", || {
            let id = nc::get_uniqueid().map_err(|e| CommError::Nccl {
                rank: 0,
                call: "ncclGetUniqueId",
                detail: nccl_error_text(e.0),
            })?;
            let mut b = [0u8; NCCL_ID_BYTES];
            for (d, s) in b.iter_mut().zip(id.internal.iter()) {
                *d = *s as u8;
            }
            Ok(NcclId(b))
        })
    }

    /// The id's bytes, to serialise.
    pub fn to_bytes(&self) -> [u8; NCCL_ID_BYTES] {
        self.0
    }

    /// Rebuilds an id from the bytes rank 0 sent.
    pub fn from_bytes(b: &[u8]) -> Result<NcclId> {
        let arr: [u8; NCCL_ID_BYTES] = b.try_into().map_err(|_| CommError::InvalidArgument {
            rank: 0,
            op: "NcclId::from_bytes",
            reason: format!("an NCCL unique id has {NCCL_ID_BYTES} bytes, got {}", b.len()),
        })?;
        Ok(NcclId(arr))
    }

    fn raw(&self) -> ncsys::ncclUniqueId {
        let mut internal = [0 as std::ffi::c_char; NCCL_ID_BYTES];
        for (d, s) in internal.iter_mut().zip(self.0.iter()) {
            *d = *s as std::ffi::c_char;
        }
        ncsys::ncclUniqueId { internal }
    }
}

/// An NCCL communicator for one rank on one device. `!Send`: it stays on the thread that owns the device.
pub struct NcclComm {
    comm: ncsys::ncclComm_t,
    rank: usize,
    world: usize,
    device: cusys::CUdevice,
    ctx: cusys::CUcontext,
    barrier_buf: cusys::CUdeviceptr,
    timeout: Duration,
    /// Set from another thread to end a wait in [`NcclComm::synchronize`] at once.
    cancel: Option<Arc<AtomicBool>>,
    poisoned: Option<String>,
    aborted: bool,
    _not_send: PhantomData<*mut ()>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm").field("rank", &self.rank).field("world", &self.world).finish()
    }
}

impl NcclComm {
    /// Joins the communicator `id` as `rank` of `world` on CUDA device `device`.
    ///
    /// Blocks until all `world` ranks have called it with the same id (NCCL's
    /// own bootstrap). Errors, never panics, when CUDA or NCCL is missing.
    pub fn new(device: usize, rank: usize, world: usize, id: &NcclId) -> Result<NcclComm> {
        if world == 0 || rank >= world {
            return Err(CommError::InvalidArgument {
                rank,
                op: "NcclComm::new",
                reason: format!("rank {rank} is outside 0..{world}"),
            });
        }
        nccl_available()?;
        let drv = |call: &'static str| move |e: cu::DriverError| CommError::Nccl { rank, call, detail: format!("{e:?}") };
        guard("creating the NCCL communicator", || {
            let dev = cu::device::get(device as i32).map_err(drv("cuDeviceGet"))?;
            // SAFETY: `dev` came from cuDeviceGet; the retained primary context
            // is released in Drop.
            let ctx = unsafe { cu::primary_ctx::retain(dev) }.map_err(drv("cuDevicePrimaryCtxRetain"))?;
            unsafe { cu::ctx::set_current(ctx) }.map_err(drv("cuCtxSetCurrent"))?;
            let barrier_buf = unsafe { cu::malloc_sync(4) }.map_err(drv("cuMemAlloc"))?;
            let mut comm: ncsys::ncclComm_t = std::ptr::null_mut();
            // SAFETY: `comm` is a valid out-pointer; the id is 128 bytes.
            let init = unsafe { nc::comm_init_rank(&mut comm, world as i32, id.raw(), rank as i32) };
            if let Err(e) = init {
                unsafe {
                    let _ = cu::free_sync(barrier_buf);
                    let _ = cu::primary_ctx::release(dev);
                }
                return Err(CommError::Nccl {
                    rank,
                    call: "ncclCommInitRank",
                    detail: nccl_error_text(e.0),
                });
            }
            Ok(NcclComm {
                comm,
                rank,
                world,
                device: dev,
                ctx,
                barrier_buf,
                timeout: DEFAULT_NCCL_TIMEOUT,
                cancel: None,
                poisoned: None,
                aborted: false,
                _not_send: PhantomData,
            })
        })
    }

    /// Sets the bound on [`NcclComm::synchronize`] and the barrier.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// A flag another thread may set to end a wait in [`NcclComm::synchronize`]
    /// at once, as if it had timed out (the communicator aborted, its kernels
    /// released): a caller that knows a peer is gone need not wait out the timeout.
    pub fn with_cancel(mut self, cancel: Arc<AtomicBool>) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Waits until all work enqueued on `stream` has finished, polling NCCL
    /// for asynchronous errors; on an error, after the timeout, or when the
    /// cancel flag is set ([`NcclComm::with_cancel`]) the communicator is
    /// aborted (a dead peer cannot hang this rank forever).
    pub fn synchronize(&mut self, stream: *mut c_void) -> Result<()> {
        self.check_poison()?;
        let start = Instant::now();
        let (rank, comm, timeout) = (self.rank, self.comm, self.timeout);
        let cancel = self.cancel.clone();
        let r = guard("synchronizing", || loop {
            // SAFETY: a stream handle the caller vouches for (null = legacy default stream).
            match unsafe { cusys::cuStreamQuery(stream as cusys::CUstream) } {
                cusys::CUresult::CUDA_SUCCESS => return Ok(()),
                cusys::CUresult::CUDA_ERROR_NOT_READY => {}
                e => {
                    return Err(CommError::Nccl {
                        rank,
                        call: "cuStreamQuery",
                        detail: format!("{:?}", cu::DriverError(e)),
                    })
                }
            }
            let mut async_err = ncsys::ncclResult_t::ncclSuccess;
            // SAFETY: live communicator, valid out-pointer.
            unsafe { ncsys::ncclCommGetAsyncError(comm, &mut async_err) };
            if async_err != ncsys::ncclResult_t::ncclSuccess && async_err != ncsys::ncclResult_t::ncclInProgress {
                return Err(CommError::Nccl {
                    rank,
                    call: "ncclCommGetAsyncError",
                    detail: nccl_error_text(async_err),
                });
            }
            if cancel.as_ref().is_some_and(|c| c.load(Ordering::SeqCst)) {
                return Err(CommError::Nccl {
                    rank,
                    call: "synchronize",
                    detail: "cancelled while waiting (a peer is known to be gone); communicator aborted".into(),
                });
            }
            if start.elapsed() > timeout {
                return Err(CommError::Nccl {
                    rank,
                    call: "synchronize",
                    detail: format!("collectives did not finish within {timeout:?} (a peer died or stalled); communicator aborted"),
                });
            }
            std::thread::sleep(Duration::from_micros(20));
        });
        if let Err(e) = &r {
            self.poison(e.to_string());
        }
        r
    }

    fn poison(&mut self, why: String) {
        if self.poisoned.is_none() {
            self.poisoned = Some(why);
        }
        if !self.aborted {
            self.aborted = true;
            // SAFETY: live communicator; abort is NCCL's way out of a hang.
            let _ = catch_unwind(AssertUnwindSafe(|| unsafe { nc::comm_abort(self.comm) }));
        }
    }

    fn check_poison(&self) -> Result<()> {
        match &self.poisoned {
            Some(first) => Err(CommError::Poisoned { rank: self.rank, first: first.clone() }),
            None => Ok(()),
        }
    }

    /// Validates a buffer and returns its stream.
    fn prepare(&self, buf: &Buf<'_>) -> Result<ncsys::cudaStream_t> {
        self.check_poison()?;
        match buf.memory() {
            Memory::Cuda { stream } => Ok(stream as ncsys::cudaStream_t),
            m => Err(CommError::WrongMemory {
                rank: self.rank,
                backend: "nccl",
                memory: m.name(),
            }),
        }
    }

    fn nccl_dtype(d: DType) -> ncsys::ncclDataType_t {
        match d {
            DType::F32 => ncsys::ncclDataType_t::ncclFloat32,
            DType::F64 => ncsys::ncclDataType_t::ncclFloat64,
            DType::Bf16 => ncsys::ncclDataType_t::ncclBfloat16,
        }
    }

    fn nccl_op(op: ReduceOp) -> ncsys::ncclRedOp_t {
        match op {
            ReduceOp::Sum => ncsys::ncclRedOp_t::ncclSum,
            ReduceOp::Mean => ncsys::ncclRedOp_t::ncclAvg,
        }
    }

    /// Runs one enqueueing call, mapping its error and poisoning on failure.
    fn enqueue(&mut self, call: &'static str, f: impl FnOnce(ncsys::ncclComm_t) -> std::result::Result<nc::NcclStatus, nc::NcclError>) -> Result<()> {
        let (rank, comm) = (self.rank, self.comm);
        let r = guard(call, || {
            f(comm).map(|_| ()).map_err(|e| CommError::Nccl {
                rank,
                call,
                detail: nccl_error_text(e.0),
            })
        });
        if let Err(e) = &r {
            self.poison(e.to_string());
        }
        r
    }

    fn chunk_len(&self, op: &'static str, buf: &Buf<'_>) -> Result<usize> {
        if buf.len() % self.world != 0 {
            return Err(CommError::InvalidArgument {
                rank: self.rank,
                op,
                reason: format!("length {} is not a multiple of the world size {}", buf.len(), self.world),
            });
        }
        Ok(buf.len() / self.world)
    }
}

impl Collective for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, buf: Buf<'_>, op: ReduceOp) -> Result<()> {
        let stream = self.prepare(&buf)?;
        let (ptr, len, dt, op) = (buf.as_ptr(), buf.len(), Self::nccl_dtype(buf.dtype()), Self::nccl_op(op));
        // SAFETY: the caller vouched for the device buffer when building it (Buf::cuda).
        self.enqueue("ncclAllReduce", |c| unsafe { nc::all_reduce(ptr, ptr, len, dt, op, c, stream) })
    }

    fn broadcast(&mut self, buf: Buf<'_>, root: usize) -> Result<()> {
        let stream = self.prepare(&buf)?;
        if root >= self.world {
            return Err(CommError::InvalidArgument {
                rank: self.rank,
                op: "broadcast",
                reason: format!("root {root} is outside 0..{}", self.world),
            });
        }
        let (ptr, len, dt) = (buf.as_ptr(), buf.len(), Self::nccl_dtype(buf.dtype()));
        // SAFETY: as above.
        self.enqueue("ncclBroadcast", |c| unsafe { nc::broadcast(ptr, ptr, len, dt, root as i32, c, stream) })
    }

    fn reduce_scatter(&mut self, buf: Buf<'_>, op: ReduceOp) -> Result<()> {
        let stream = self.prepare(&buf)?;
        let m = self.chunk_len("reduce_scatter", &buf)?;
        let (ptr, dt, op) = (buf.as_ptr(), Self::nccl_dtype(buf.dtype()), Self::nccl_op(op));
        // In place: the result lands at this rank's chunk of the same buffer.
        let recv = unsafe { (ptr as *mut u8).add(self.rank * m * buf.dtype().size()) } as *mut c_void;
        // SAFETY: as above.
        self.enqueue("ncclReduceScatter", |c| unsafe { nc::reduce_scatter(ptr, recv, m, dt, op, c, stream) })
    }

    fn all_gather(&mut self, buf: Buf<'_>) -> Result<()> {
        let stream = self.prepare(&buf)?;
        let m = self.chunk_len("all_gather", &buf)?;
        let (ptr, dt) = (buf.as_ptr(), Self::nccl_dtype(buf.dtype()));
        let send = unsafe { (ptr as *mut u8).add(self.rank * m * buf.dtype().size()) } as *const c_void;
        // SAFETY: as above; in place (send is this rank's chunk of recv).
        self.enqueue("ncclAllGather", |c| unsafe { nc::all_gather(send, ptr, m, dt, c, stream) })
    }

    fn barrier(&mut self) -> Result<()> {
        self.check_poison()?;
        let ptr = self.barrier_buf as *mut c_void;
        // SAFETY: our own 4-byte device allocation, on the legacy default stream.
        let buf = unsafe { Buf::cuda(ptr, 1, DType::F32, std::ptr::null_mut()) };
        self.all_reduce(buf, ReduceOp::Sum)?;
        self.synchronize(std::ptr::null_mut())
    }
}

impl Drop for NcclComm {
    /// Never panics and never waits on a peer: `ncclCommDestroy` blocks until
    /// the communicator's pending work is done, which a dead peer never lets
    /// happen, so a communicator is always ended with `ncclCommAbort` (what a
    /// timed-out collective does too); the device memory and context are then
    /// released, each under `catch_unwind`.
    fn drop(&mut self) {
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
            if !self.aborted {
                let _ = nc::comm_abort(self.comm);
            }
            let _ = cu::ctx::set_current(self.ctx);
            let _ = cu::free_sync(self.barrier_buf);
            let _ = cu::primary_ctx::release(self.device);
        }));
    }
}
