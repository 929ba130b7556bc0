//! The weight-sync group: learner rank 0 (or the controller, when the learner
//! is in its process) and every rollout process, joined in a `comm`
//! collective of their own, apart from the learners' all-reduce ring.
//!
//! Each version is two broadcasts from rank 0: a fixed-size header (version,
//! length, the per-bucket XXH3 digests) and the safetensors image itself. A
//! member's collective runs on its own thread, so a rollout process keeps
//! generating while the next version arrives; the receiver checks the digests
//! when its rollout actor loads the version, between two requests. On CPU the
//! collective is `comm`'s TCP ring (every byte crosses each process once,
//! pipelined in blocks, or one shared-memory segment when every member is on
//! one host). When every member computes on a GPU (the plan's `nccl` weight
//! transport) the image goes by NCCL from GPU to GPU instead, with rank 0's
//! id sent over the ring ([`super::nccl_weights`]).
use super::nccl_weights::NcclLink;
use crate::weight_sync::image::{Arrived, WeightUpdate};
use rlmesh_comm::digest::{BucketDigests, BucketHasher};
use rlmesh_comm::cpu::RingAbort;
use rlmesh_comm::{RingComm, RingConfig};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use serde::{Deserialize, Serialize};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Bytes of the header broadcast: room for ~8,000 buckets with both digests
/// (the XXH3 of the host image and, over NCCL, the device WordMix64), 64 GiB
/// of weights in 8 MiB buckets; 128 KiB a version, small beside the image.
const HEADER_BYTES: usize = 128 << 10;

/// A member's place in the group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// 0 sends; the others receive.
    pub rank: u32,
    /// Members.
    pub world: u32,
    /// Rank 0's rendezvous, `host:port`.
    pub addr: String,
    /// The group's generation: it is formed again, one higher, whenever its
    /// members change (a rollout process lost or back). Each epoch has its own
    /// cookie, so a straggler of an earlier one is refused at the rendezvous.
    #[serde(default)]
    pub epoch: u32,
    /// Every member computes on a GPU: the image goes over NCCL.
    #[serde(default)]
    pub nccl: bool,
}

impl GroupSpec {
    /// The collective's cookie for this epoch, from the run's.
    pub fn cookie(&self, run_cookie: &str) -> String {
        format!("{run_cookie}:weights-{}", self.epoch)
    }
}

/// Longest wait on one read or write of the group's collective: a member
/// that is gone without closing its sockets (a lost host) fails the
/// broadcast after this, and the group is formed again without it.
pub(super) const GROUP_TIMEOUT: Duration = Duration::from_secs(120);

/// What rank 0 says about a version before its image: sent over the ring.
#[derive(Serialize, Deserialize)]
pub(super) struct Header {
    pub(super) version: u64,
    pub(super) digest: u64,
    pub(super) buckets: BucketDigests,
    /// Over NCCL: WordMix64 of each bucket as rank 0's GPU holds it (empty on the ring).
    pub(super) device_digests: Vec<u64>,
}

/// A member's collective: the CPU ring, or NCCL beside it.
enum Link {
    Ring(RingComm),
    Nccl(Box<NcclLink>),
}

enum Job {
    Send(WeightUpdate, oneshot::Sender<Result<f64, String>>),
    Receive(oneshot::Sender<Result<WeightUpdate, String>>),
}

/// This process's member of the group: a thread holding the collective.
pub struct WeightGroup {
    tx: mpsc::Sender<Job>,
    rank: u32,
    nccl: bool,
    abort: Arc<Abort>,
}

/// Aborts the member's collective from outside its thread.
#[derive(Default)]
struct Abort {
    /// Set once aborted; an NCCL member's wait polls it too.
    asked: Arc<AtomicBool>,
    handle: Mutex<Option<RingAbort>>,
}

impl WeightGroup {
    /// Joins the group on a new thread (the rendezvous waits for every member
    /// there); this member's ring listener binds `bind` (its host's address).
    /// `cuda`: this member's GPU, for a group whose image goes over NCCL.
    pub fn join(spec: &GroupSpec, cookie: &str, bind: Option<std::net::IpAddr>, cuda: Option<usize>) -> WeightGroup {
        let (tx, rx) = mpsc::channel::<Job>();
        let cfg = RingConfig::new(spec.rank as usize, spec.world as usize, spec.addr.clone()).cookie(spec.cookie(cookie)).timeout(GROUP_TIMEOUT).connect_timeout(GROUP_TIMEOUT).bind(bind);
        let (rank, epoch, nccl) = (spec.rank, spec.epoch, spec.nccl);
        let abort = Arc::new(Abort::default());
        let aborts = abort.clone();
        std::thread::Builder::new()
            .name(format!("weights-{rank}"))
            .spawn(move || {
                let failed = |e: String| format!("weight-sync group (epoch {epoch}), rank {rank}: {e}");
                let mut comm = RingComm::connect(cfg).map_err(|e| failed(e.to_string())).and_then(|c| {
                    *aborts.handle.lock().expect("abort lock") = c.abort_handle().ok();
                    if nccl {
                        NcclLink::form(c, cuda, aborts.asked.clone()).map(|l| Link::Nccl(Box::new(l))).map_err(failed)
                    } else {
                        Ok(Link::Ring(c))
                    }
                });
                if let Ok(c) = &comm {
                    let how = match c {
                        Link::Nccl(_) => "over NCCL, GPU to GPU",
                        Link::Ring(c) if c.shares_memory() => "through shared memory (every member on this host)",
                        Link::Ring(_) => "along the TCP ring",
                    };
                    let verb = if rank == 0 { "sends" } else { "receives" };
                    eprintln!("[weights] group epoch {epoch} formed: rank {rank} {verb} versions {how}");
                    if aborts.asked.load(Ordering::SeqCst) {
                        comm = Err(format!("the weight-sync group (epoch {epoch}) was aborted"));
                    }
                }
                for job in rx {
                    let failed = match (&mut comm, job) {
                        (Err(e), Job::Send(_, done)) => {
                            let _ = done.send(Err(e.clone()));
                            None
                        }
                        (Err(e), Job::Receive(done)) => {
                            let _ = done.send(Err(e.clone()));
                            None
                        }
                        (Ok(c), Job::Send(update, done)) => {
                            let out = match c {
                                Link::Ring(c) => send(c, update),
                                Link::Nccl(l) => l.send(update),
                            };
                            let failed = out.as_ref().err().cloned();
                            let _ = done.send(out);
                            failed
                        }
                        (Ok(c), Job::Receive(done)) => {
                            let out = match c {
                                Link::Ring(c) => receive(c),
                                Link::Nccl(l) => l.receive(),
                            };
                            let failed = out.as_ref().err().cloned();
                            let _ = done.send(out);
                            failed
                        }
                    };
                    // A broken ring closes its sockets at once, so its neighbours fail
                    // too instead of waiting out their timeout; the controller forms
                    // the group again.
                    if let Some(e) = failed {
                        comm = Err(format!("the weight-sync group (epoch {epoch}) broke: {e}"));
                    }
                }
            })
            .expect("spawn the weight-sync thread");
        WeightGroup { tx, rank, nccl, abort }
    }

    /// Aborts this member's collective: a broadcast blocked on a member that is
    /// gone without closing its sockets (a lost host) fails at once, here and
    /// along the ring, instead of waiting out its timeout; over NCCL the wait
    /// sees the flag within microseconds and aborts the communicator, which
    /// releases its kernels from the GPU. Queued work fails.
    pub fn abort(&self) {
        self.abort.asked.store(true, Ordering::SeqCst);
        if let Some(h) = self.abort.handle.lock().expect("abort lock").as_ref() {
            h.abort();
        }
    }

    /// This member's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Whether the group's images go over NCCL (device to device) rather than the ring.
    pub fn over_nccl(&self) -> bool {
        self.nccl
    }

    /// Rank 0: queues a broadcast of `update` (broadcasts run in the order they
    /// are queued); the receiver yields the seconds it took.
    pub fn send(&self, update: WeightUpdate) -> Pending<f64> {
        assert_eq!(self.rank, 0, "only rank 0 sends");
        let (done, rx) = oneshot::channel();
        let _ = self.tx.send(Job::Send(update, done));
        Pending(rx)
    }

    /// Any other rank: queues the receipt of the next version rank 0 broadcasts.
    pub fn receive(&self) -> Pending<WeightUpdate> {
        let (done, rx) = oneshot::channel();
        let _ = self.tx.send(Job::Receive(done));
        Pending(rx)
    }
}

/// A queued broadcast's outcome.
pub struct Pending<T>(oneshot::Receiver<Result<T, String>>);

impl<T> Pending<T> {
    /// Waits for it.
    pub async fn wait(self) -> Result<T, String> {
        self.0.await.map_err(|_| "the weight-sync thread is gone".to_string())?
    }
}

/// Rank 0: a version's header, as one fixed-size broadcast over the ring.
pub(super) fn send_header(c: &mut RingComm, header: &Header) -> Result<(), String> {
    let header = bincode::serde::encode_to_vec(header, bincode::config::standard()).map_err(|e| format!("weight header: {e}"))?;
    if header.len() + 8 > HEADER_BYTES {
        return Err(format!("weight header of {} bytes exceeds {HEADER_BYTES}", header.len()));
    }
    let mut h = vec![0u8; HEADER_BYTES];
    h[..8].copy_from_slice(&(header.len() as u64).to_le_bytes());
    h[8..8 + header.len()].copy_from_slice(&header);
    c.broadcast_bytes_with(&mut h, 0, &mut |_: &mut [u8]| ()).map_err(|e| format!("weight header broadcast: {e}"))
}

/// Any other rank: the next header, decoded within its bounds.
pub(super) fn receive_header(c: &mut RingComm) -> Result<Header, String> {
    let mut h = vec![0u8; HEADER_BYTES];
    c.broadcast_bytes_with(&mut h, 0, &mut |_: &mut [u8]| ()).map_err(|e| format!("weight header broadcast: {e}"))?;
    let n = u64::from_le_bytes(h[..8].try_into().expect("8 bytes")) as usize;
    if n + 8 > HEADER_BYTES {
        return Err(format!("weight header claims {n} bytes"));
    }
    let limit = bincode::config::standard().with_limit::<{ HEADER_BYTES }>();
    let (header, _): (Header, usize) = bincode::serde::decode_from_slice(&h[8..8 + n], limit).map_err(|e| format!("weight header: {e}"))?;
    if header.buckets.len > (1usize << 40) {
        return Err(format!("weight header claims {} bytes of weights", header.buckets.len));
    }
    Ok(header)
}

fn send(c: &mut RingComm, update: WeightUpdate) -> Result<f64, String> {
    // The ring carries host bytes: an image packed on a device comes down first.
    let update = update.to_host();
    let t0 = Instant::now();
    send_header(c, &Header { version: update.version, digest: update.digest, buckets: update.buckets.clone(), device_digests: vec![] })?;
    // Rank 0 digested the image when it packed it.
    let mut image = update.image;
    c.broadcast_bytes_with(&mut image, 0, &mut |_: &mut [u8]| ()).map_err(|e| format!("weight broadcast v{}: {e}", update.version))?;
    Ok(t0.elapsed().as_secs_f64())
}

fn receive(c: &mut RingComm) -> Result<WeightUpdate, String> {
    let header = receive_header(c)?;
    let mut image = vec![0u8; header.buckets.len];
    // Each piece is hashed as it is copied in, while it is in cache.
    let mut hasher = BucketHasher::new(header.buckets.bucket_bytes);
    c.broadcast_digested(&mut image, 0, &mut hasher).map_err(|e| format!("weight broadcast v{}: {e}", header.version))?;
    let arrived = Arrived { seconds: hasher.seconds(), digests: hasher.finish() };
    Ok(WeightUpdate { version: header.version, digest: header.digest, buckets: header.buckets, image, arrived: Some(arrived), on_device: None })
}
