//! The ring collectives over TCP.
//!
//! A buffer of `n` elements is cut into `world` chunks (chunk `c` is
//! `c·n/world .. (c+1)·n/world`, so lengths smaller than the world size just
//! leave some chunks empty). The all-reduce is a reduce-scatter followed by an
//! all-gather, `2·(world−1)` steps in all:
//!
//! - reduce-scatter step `s`: send chunk `rank−1−s`, receive chunk `rank−2−s`
//!   from the previous rank and add it in; after `world−1` steps this rank
//!   holds the finished chunk `rank`;
//! - all-gather step `s`: send chunk `rank−s`, receive chunk `rank−1−s` and
//!   overwrite.
//!
//! Each chunk is finished by exactly one rank and then copied verbatim to
//! every other rank, so all ranks end with **bit-identical** buffers whatever
//! the floating-point rounding.
//!
//! Pipelining: a sender thread writes to the next rank while this thread
//! reads from the previous one. Everything received (except in the final
//! step) is forwarded in the next step, so the receiver hands each finished
//! block (default 256 KiB) to the sender as soon as it is reduced: block `k`
//! of a step travels on while block `k+1` is still arriving.
//!
//! Memory discipline: the sender only reads blocks the receiver has finished
//! (handed over through a channel), and the receiver only overwrites a block
//! after the peer has sent the chunk's next version, which the peer can only
//! do after our earlier send of that chunk was fully received.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use super::rendezvous::{rendezvous, RingLinks};
use super::shm::{self, Segment};
use super::wire::{self, OpHeader, OpKind, HEADER_LEN};
use super::RingConfig;
use crate::buffer::{as_bytes, as_bytes_mut, Bf16, Buf, DType, Element, Memory};
use crate::collective::{Collective, ReduceOp};
use crate::error::{CommError, Result};

/// A CPU communicator: this process's place in a ring of TCP connections.
///
/// Blocking; every wait on a peer is bounded by [`RingConfig::timeout`].
/// `Send` (move it to the thread that runs the learner), not shared.
pub struct RingComm {
    rank: usize,
    world: usize,
    links: Option<RingLinks>,
    timeout: Duration,
    block_bytes: usize,
    seq: u64,
    poisoned: Option<String>,
    /// The shared segment broadcasts go through, when every rank mapped it.
    shm: Option<Segment>,
}

/// Aborts a [`RingComm`] from any thread ([`RingComm::abort_handle`]).
#[derive(Debug)]
pub struct RingAbort {
    links: Vec<TcpStream>,
}

impl RingAbort {
    /// Shuts both links down (idempotent).
    pub fn abort(&self) {
        for l in &self.links {
            let _ = l.shutdown(Shutdown::Both);
        }
    }
}

/// A pointer the sender thread may read through (see the module's memory discipline).
struct SharedPtr<T>(*mut T);
// SAFETY: only used for disjoint, handed-over ranges as described above.
unsafe impl<T> Send for SharedPtr<T> {}
impl<T> SharedPtr<T> {
    fn get(&self) -> *mut T {
        self.0
    }
}

impl RingComm {
    /// Joins the ring described by `cfg` (blocks until every rank has joined or the rendezvous times out).
    pub fn connect(cfg: RingConfig) -> Result<RingComm> {
        if cfg.world == 0 || cfg.rank >= cfg.world {
            return Err(CommError::InvalidArgument {
                rank: cfg.rank,
                op: "connect",
                reason: format!("rank {} is outside 0..{}", cfg.rank, cfg.world),
            });
        }
        if cfg.cookie.len() > wire::MAX_COOKIE {
            return Err(CommError::InvalidArgument {
                rank: cfg.rank,
                op: "connect",
                reason: format!("cookie longer than {} bytes", wire::MAX_COOKIE),
            });
        }
        let links = if cfg.world == 1 { None } else { Some(rendezvous(&cfg)?) };
        let mut comm = RingComm {
            rank: cfg.rank,
            world: cfg.world,
            links,
            timeout: cfg.timeout,
            block_bytes: cfg.block_bytes.max(64),
            seq: 0,
            poisoned: None,
            shm: None,
        };
        if cfg.shared_memory && cfg.world > 1 {
            comm.shm = comm.probe_shared_memory()?;
        }
        Ok(comm)
    }

    /// Whether broadcasts go through shared memory (every rank on one host).
    pub fn shares_memory(&self) -> bool {
        self.shm.is_some()
    }

    /// Rank 0 makes a segment and sends its name and nonce along the ring;
    /// every rank opens it; all use it only if every rank could (see [`shm`]).
    fn probe_shared_memory(&mut self) -> Result<Option<Segment>> {
        const NAME: usize = 256;
        let mut msg = [0u8; NAME + shm::NONCE_BYTES];
        let mut mine: Option<Segment> = None;
        let mut made: Option<std::path::PathBuf> = None;
        if self.rank == 0 {
            if let Ok((seg, path, nonce)) = shm::nonce().and_then(|n| Segment::create(&n).map(|(s, p)| (s, p, n))) {
                let name = path.as_os_str().as_encoded_bytes();
                if name.len() < NAME {
                    msg[..name.len()].copy_from_slice(name);
                    msg[NAME..].copy_from_slice(&nonce);
                    mine = Some(seg);
                }
                made = Some(path);
            }
        }
        let got = self.guarded(|c| c.ring_broadcast(&mut msg, 0, &mut |_: &mut [u8]| ()));
        if let Err(e) = got {
            if let Some(p) = &made {
                shm::unlink(p);
            }
            return Err(e);
        }
        if self.rank != 0 {
            let end = msg[..NAME].iter().position(|&b| b == 0).unwrap_or(NAME);
            let nonce: [u8; shm::NONCE_BYTES] = msg[NAME..].try_into().expect("nonce bytes");
            if end > 0 {
                let path = std::path::PathBuf::from(std::ffi::OsStr::new(std::str::from_utf8(&msg[..end]).unwrap_or("")));
                mine = Segment::open(&path, &nonce).ok();
            }
        }
        let mut able = [if mine.is_some() { 1.0f32 } else { 0.0 }];
        let agreed = self.guarded(|c| c.ring(&mut able, true, true, ReduceOp::Sum));
        if let Some(p) = &made {
            shm::unlink(p);
        }
        agreed?;
        Ok(if able[0] as usize == self.world { mine } else { None })
    }

    /// A barrier inside a collective (no header: the caller exchanged one).
    fn sync(&mut self) -> Result<()> {
        let mut tokens = vec![1.0f32; self.world];
        self.ring(&mut tokens, true, true, ReduceOp::Sum)
    }

    /// Broadcast through the shared segment: the root writes, a barrier, the
    /// others read, a barrier (the segment may then be written again). The
    /// copies go in pieces of [`PIECE_BYTES`] through [`Pieces::copy`], so a
    /// sink that hashes every byte does it in the copy's pass.
    fn shm_broadcast(&mut self, bytes: &mut [u8], root: usize, each: &mut dyn Pieces) -> Result<()> {
        let mut seg = self.shm.take().expect("shared memory");
        let (rank, n) = (self.rank, bytes.len());
        let io = |e: std::io::Error| CommError::Io { rank, peer: root, what: "mapping the shared broadcast segment of".into(), source: e };
        let r = (|| {
            if rank == root {
                seg.grow(n).map_err(io)?;
                for (src, dst) in bytes.chunks_mut(PIECE_BYTES).zip(seg.bytes(n).chunks_mut(PIECE_BYTES)) {
                    each.copy(dst, src);
                }
            }
            self.sync()?;
            if rank != root {
                seg.map(n).map_err(io)?;
                for (dst, src) in bytes.chunks_mut(PIECE_BYTES).zip(seg.bytes(n).chunks(PIECE_BYTES)) {
                    each.copy(dst, src);
                }
            }
            self.sync()
        })();
        self.shm = Some(seg);
        r
    }

    /// A handle that aborts this communicator from another thread (the CPU
    /// ring's `ncclCommAbort`): both links are shut down, so a collective
    /// blocked on a peer fails at once, here and, through the closed links, at
    /// its neighbours. Later collectives fail too.
    pub fn abort_handle(&self) -> std::io::Result<RingAbort> {
        let links = match &self.links {
            None => vec![],
            Some(l) => vec![l.next.try_clone()?, l.prev.try_clone()?],
        };
        Ok(RingAbort { links })
    }

    /// A communicator of world size 1 (every collective is a no-op; no sockets).
    pub fn single() -> RingComm {
        RingComm {
            rank: 0,
            world: 1,
            links: None,
            timeout: super::DEFAULT_TIMEOUT,
            block_bytes: super::DEFAULT_BLOCK_BYTES,
            seq: 0,
            poisoned: None,
            shm: None,
        }
    }

    fn next_rank(&self) -> usize {
        (self.rank + 1) % self.world
    }

    fn prev_rank(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }

    fn invalid(&self, op: &'static str, reason: String) -> CommError {
        CommError::InvalidArgument { rank: self.rank, op, reason }
    }

    /// Checks the memory kind and the poison flag before a collective.
    fn precheck(&self, buf: &Buf<'_>) -> Result<()> {
        if let Some(first) = &self.poisoned {
            return Err(CommError::Poisoned { rank: self.rank, first: first.clone() });
        }
        if buf.memory() != Memory::Host {
            return Err(CommError::WrongMemory {
                rank: self.rank,
                backend: "cpu-ring",
                memory: buf.memory().name(),
            });
        }
        Ok(())
    }

    /// Runs one collective's network part; any error poisons the communicator
    /// and shuts both links so the neighbours fail fast instead of timing out.
    fn guarded(&mut self, f: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        let r = f(self);
        if let Err(e) = &r {
            self.poisoned = Some(e.to_string());
            if let Some(l) = &self.links {
                let _ = l.next.shutdown(Shutdown::Both);
                let _ = l.prev.shutdown(Shutdown::Both);
            }
        }
        r
    }

    /// Sends our header to the next rank and checks the previous rank's.
    fn exchange_header(&mut self, mut h: OpHeader) -> Result<()> {
        h.seq = self.seq;
        self.seq += 1;
        let (rank, next_rank, prev_rank, timeout) = (self.rank, self.next_rank(), self.prev_rank(), self.timeout);
        let links = self.links.as_ref().expect("world > 1 has links");
        (&links.next)
            .write_all(&h.encode())
            .map_err(|e| wire::io_error(rank, next_rank, "sending a collective header to", e, timeout))?;
        let mut b = [0u8; HEADER_LEN];
        (&links.prev)
            .read_exact(&mut b)
            .map_err(|e| wire::io_error(rank, prev_rank, "waiting for a collective header from", e, timeout))?;
        match OpHeader::decode(&b) {
            Some(theirs) if theirs == h => Ok(()),
            Some(theirs) => Err(CommError::Mismatch {
                rank,
                peer: prev_rank,
                ours: h.describe(),
                theirs: theirs.describe(),
            }),
            None => Err(CommError::Mismatch {
                rank,
                peer: prev_rank,
                ours: h.describe(),
                theirs: "a garbled header (streams out of step)".into(),
            }),
        }
    }

    /// The ring reduce-scatter and/or all-gather phases over `data`, in place.
    fn ring<T: Element>(&mut self, data: &mut [T], rs: bool, ag: bool, op: ReduceOp) -> Result<()> {
        let (p, r, n) = (self.world, self.rank, data.len());
        let (rank, next_rank, prev_rank, timeout) = (self.rank, self.next_rank(), self.prev_rank(), self.timeout);
        let chunk = |c: usize| (c * n / p, (c + 1) * n / p);
        let wrap = |x: isize| x.rem_euclid(p as isize) as usize;
        let ri = r as isize;
        // (reduce?, chunk received) for every step, in order.
        let mut steps: Vec<(bool, usize)> = Vec::with_capacity(2 * (p - 1));
        if rs {
            steps.extend((0..p as isize - 1).map(|s| (true, wrap(ri - 2 - s))));
        }
        if ag {
            steps.extend((0..p as isize - 1).map(|s| (false, wrap(ri - 1 - s))));
        }
        let first = if rs { wrap(ri - 1) } else { r };
        let last_rs_step = if rs { Some(p - 2) } else { None };
        let block = (self.block_bytes / std::mem::size_of::<T>()).max(1);
        let links = self.links.as_ref().expect("world > 1 has links");
        let (next, prev): (&TcpStream, &TcpStream) = (&links.next, &links.prev);
        let base = data.as_mut_ptr();
        let mean = op == ReduceOp::Mean;

        let sender_failed = AtomicBool::new(false);
        let (recv_result, send_result) = std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel::<(usize, usize)>();
            let shared = SharedPtr(base);
            let sender_failed = &sender_failed;
            let sender = scope.spawn(move || -> Result<()> {
                let send = |a: usize, b: usize| -> Result<()> {
                    // SAFETY: [a, b) is the first chunk (untouched by the
                    // receiver until the peer answers it) or a range the
                    // receiver has finished and handed over.
                    let s = unsafe { std::slice::from_raw_parts(shared.get().add(a) as *const T, b - a) };
                    let mut w = next;
                    w.write_all(as_bytes(s))
                        .map_err(|e| wire::io_error(rank, next_rank, "sending ring data to", e, timeout))
                };
                let run = || -> Result<()> {
                    let (a, b) = chunk(first);
                    let mut x = a;
                    while x < b {
                        let y = (x + block).min(b);
                        send(x, y)?;
                        x = y;
                    }
                    for (a, b) in rx {
                        send(a, b)?;
                    }
                    Ok(())
                };
                let res = run();
                if res.is_err() {
                    sender_failed.store(true, Ordering::SeqCst);
                    let _ = prev.shutdown(Shutdown::Both);
                }
                res
            });

            let receive = || -> Result<()> {
                let mut scratch: Vec<T> = vec![T::from_f64(0.0); block.min(n.max(1))];
                let mut reader = prev;
                for (i, &(reduce, c)) in steps.iter().enumerate() {
                    let forward = i + 1 < steps.len();
                    let finishing = last_rs_step == Some(i) && mean;
                    let (a, b) = chunk(c);
                    let mut x = a;
                    while x < b {
                        let y = (x + block).min(b);
                        // SAFETY: the sender never reads [x, y) while we write it (module docs).
                        let dst = unsafe { std::slice::from_raw_parts_mut(base.add(x), y - x) };
                        let what = if reduce { "waiting for reduce-scatter data from" } else { "waiting for all-gather data from" };
                        let io = |e| wire::io_error(rank, prev_rank, what, e, timeout);
                        if reduce {
                            let s = &mut scratch[..y - x];
                            reader.read_exact(as_bytes_mut(s)).map_err(io)?;
                            for (d, v) in dst.iter_mut().zip(s.iter()) {
                                *d = d.add(*v);
                            }
                            if finishing {
                                for d in dst.iter_mut() {
                                    *d = d.div(p);
                                }
                            }
                        } else {
                            reader.read_exact(as_bytes_mut(dst)).map_err(io)?;
                        }
                        if forward && tx.send((x, y)).is_err() {
                            // The sender stopped: its error is the one to report.
                            return Ok(());
                        }
                        x = y;
                    }
                }
                Ok(())
            };
            let recv_result = receive();
            if recv_result.is_err() {
                let _ = next.shutdown(Shutdown::Both);
            }
            drop(tx);
            let send_result = sender.join().unwrap_or_else(|_| {
                Err(CommError::Io {
                    rank,
                    peer: next_rank,
                    what: "running the ring sender for".into(),
                    source: std::io::Error::other("sender thread panicked"),
                })
            });
            (recv_result, send_result)
        });
        if sender_failed.load(Ordering::SeqCst) {
            return send_result;
        }
        recv_result?;
        send_result?;
        // Reduce-scatter of a mean with world size 1 never reaches the dividing step.
        Ok(())
    }

    /// Dispatches on the element type of a host buffer.
    fn ring_buf(&mut self, mut buf: Buf<'_>, rs: bool, ag: bool, op: ReduceOp) -> Result<()> {
        match buf.dtype() {
            DType::F32 => self.ring(buf.host_slice::<f32>().expect("host f32"), rs, ag, op),
            DType::F64 => self.ring(buf.host_slice::<f64>().expect("host f64"), rs, ag, op),
            DType::Bf16 => self.ring(buf.host_slice::<Bf16>().expect("host bf16"), rs, ag, op),
        }
    }

    fn header(op: OpKind, buf: &Buf<'_>, reduce: Option<ReduceOp>, root: usize) -> OpHeader {
        OpHeader {
            op: op as u8,
            dtype: buf.dtype().code(),
            reduce: reduce.map(|r| r.code()).unwrap_or(0),
            root: root as u32,
            len: buf.len() as u64,
            seq: 0,
        }
    }

    /// Broadcast along the ring starting at `root`, block by block, in place;
    /// `each` sees every block as it passes (before it leaves the root, once
    /// it has arrived elsewhere).
    fn ring_broadcast(&mut self, bytes: &mut [u8], root: usize, each: &mut dyn Pieces) -> Result<()> {
        let (p, rank, next_rank, prev_rank, timeout) = (self.world, self.rank, self.next_rank(), self.prev_rank(), self.timeout);
        let links = self.links.as_ref().expect("world > 1 has links");
        let (mut next, mut prev): (&TcpStream, &TcpStream) = (&links.next, &links.prev);
        let position = (rank + p - root) % p;
        let forward = position != p - 1;
        for block in bytes.chunks_mut(self.block_bytes) {
            if position != 0 {
                prev.read_exact(block)
                    .map_err(|e| wire::io_error(rank, prev_rank, "waiting for broadcast data from", e, timeout))?;
            }
            if forward {
                next.write_all(block)
                    .map_err(|e| wire::io_error(rank, next_rank, "sending broadcast data to", e, timeout))?;
            }
            each.passed(block);
        }
        Ok(())
    }

    /// Broadcasts raw bytes from `root` in place, handing every piece to
    /// `each` as it passes this rank: on the root as it leaves, elsewhere once
    /// it has arrived, in order, each byte once. Weight sync digests a version
    /// this way ([`crate::digest::BucketHasher`]): in the copy out of the
    /// shared segment, or as each block arrives from the ring, instead of
    /// reading the whole buffer again afterwards. A closure is a sink.
    pub fn broadcast_bytes_with(&mut self, bytes: &mut [u8], root: usize, each: &mut dyn Pieces) -> Result<()> {
        if let Some(first) = &self.poisoned {
            return Err(CommError::Poisoned { rank: self.rank, first: first.clone() });
        }
        if root >= self.world {
            return Err(self.invalid("broadcast", format!("root {root} is outside 0..{}", self.world)));
        }
        if self.world == 1 {
            bytes.chunks_mut(PIECE_BYTES).for_each(|p| each.passed(p));
            return Ok(());
        }
        let h = OpHeader { op: OpKind::BroadcastBytes as u8, dtype: 0, reduce: 0, root: root as u32, len: bytes.len() as u64, seq: 0 };
        self.guarded(|c| {
            c.exchange_header(h)?;
            if c.shm.is_some() {
                c.shm_broadcast(bytes, root, each)
            } else {
                c.ring_broadcast(bytes, root, each)
            }
        })
    }

    /// [`RingComm::broadcast_bytes_with`] feeding a [`crate::digest::BucketHasher`].
    pub fn broadcast_digested(&mut self, bytes: &mut [u8], root: usize, hasher: &mut crate::digest::BucketHasher) -> Result<()> {
        self.broadcast_bytes_with(bytes, root, hasher)
    }
}

/// What a byte broadcast hands each piece to as it passes a rank.
pub trait Pieces {
    /// `piece` has passed this rank (sent from the root, or arrived).
    fn passed(&mut self, piece: &mut [u8]);

    /// Copies `src` into `dst` (the same length), then treats `dst` as
    /// passed; the shared-memory broadcast moves bytes this way, so a sink
    /// that reads every byte anyway can fuse its pass into the copy.
    fn copy(&mut self, dst: &mut [u8], src: &[u8]) {
        dst.copy_from_slice(src);
        self.passed(dst);
    }
}

impl<F: FnMut(&mut [u8])> Pieces for F {
    fn passed(&mut self, piece: &mut [u8]) {
        self(piece)
    }
}

/// Each piece hashed as it passes; out of a shared segment, in the copy's pass.
impl Pieces for crate::digest::BucketHasher {
    fn passed(&mut self, piece: &mut [u8]) {
        self.update(piece)
    }

    fn copy(&mut self, dst: &mut [u8], src: &[u8]) {
        self.copy_in(dst, src)
    }
}

/// Pieces in which the shared-memory broadcast copies (through its sink):
/// small enough to stay in a core's L2 for a sink that looks at them again.
pub const PIECE_BYTES: usize = 256 << 10;

impl Collective for RingComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, buf: Buf<'_>, op: ReduceOp) -> Result<()> {
        self.precheck(&buf)?;
        if self.world == 1 {
            return Ok(());
        }
        let h = Self::header(OpKind::AllReduce, &buf, Some(op), 0);
        self.guarded(|c| {
            c.exchange_header(h)?;
            c.ring_buf(buf, true, true, op)
        })
    }

    fn broadcast(&mut self, mut buf: Buf<'_>, root: usize) -> Result<()> {
        self.precheck(&buf)?;
        if root >= self.world {
            return Err(self.invalid("broadcast", format!("root {root} is outside 0..{}", self.world)));
        }
        if self.world == 1 {
            return Ok(());
        }
        let h = Self::header(OpKind::Broadcast, &buf, None, root);
        self.guarded(|c| {
            c.exchange_header(h)?;
            let bytes = match buf.dtype() {
                DType::F32 => as_bytes_mut(buf.host_slice::<f32>().expect("host f32")),
                DType::F64 => as_bytes_mut(buf.host_slice::<f64>().expect("host f64")),
                DType::Bf16 => as_bytes_mut(buf.host_slice::<Bf16>().expect("host bf16")),
            };
            if c.shm.is_some() {
                c.shm_broadcast(bytes, root, &mut |_: &mut [u8]| ())
            } else {
                c.ring_broadcast(bytes, root, &mut |_: &mut [u8]| ())
            }
        })
    }

    fn reduce_scatter(&mut self, buf: Buf<'_>, op: ReduceOp) -> Result<()> {
        self.precheck(&buf)?;
        if buf.len() % self.world != 0 {
            return Err(self.invalid(
                "reduce_scatter",
                format!("length {} is not a multiple of the world size {}", buf.len(), self.world),
            ));
        }
        if self.world == 1 {
            return Ok(());
        }
        let h = Self::header(OpKind::ReduceScatter, &buf, Some(op), 0);
        self.guarded(|c| {
            c.exchange_header(h)?;
            c.ring_buf(buf, true, false, op)
        })
    }

    fn all_gather(&mut self, buf: Buf<'_>) -> Result<()> {
        self.precheck(&buf)?;
        if buf.len() % self.world != 0 {
            return Err(self.invalid(
                "all_gather",
                format!("length {} is not a multiple of the world size {}", buf.len(), self.world),
            ));
        }
        if self.world == 1 {
            return Ok(());
        }
        let h = Self::header(OpKind::AllGather, &buf, None, 0);
        self.guarded(|c| {
            c.exchange_header(h)?;
            c.ring_buf(buf, false, true, ReduceOp::Sum)
        })
    }

    fn barrier(&mut self) -> Result<()> {
        if let Some(first) = &self.poisoned {
            return Err(CommError::Poisoned { rank: self.rank, first: first.clone() });
        }
        if self.world == 1 {
            return Ok(());
        }
        // One element per chunk: every ring step carries data, so no rank
        // leaves before every rank has entered.
        let mut tokens = vec![1.0f32; self.world];
        let h = Self::header(OpKind::Barrier, &Buf::host(&mut tokens), Some(ReduceOp::Sum), 0);
        self.guarded(|c| {
            c.exchange_header(h)?;
            c.ring(&mut tokens, true, true, ReduceOp::Sum)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::CollectiveExt;

    #[test]
    fn ring_comm_is_send_so_it_can_move_to_the_learner_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<RingComm>();
    }

    #[test]
    fn world_of_one_is_identity_and_still_checks_arguments() {
        let mut c = RingComm::single();
        let mut v = vec![1.5f32, -2.0, 3.25];
        c.all_reduce_mean(&mut v).unwrap();
        c.broadcast_slice(&mut v, 0).unwrap();
        c.barrier().unwrap();
        assert_eq!(v, vec![1.5, -2.0, 3.25]);
        assert!(c.broadcast_slice(&mut v, 1).is_err());
    }
}
