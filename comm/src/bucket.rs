//! Bucketed all-reduce: many tensors' worth of host data reduced as a few flat
//! buckets, never tensor by tensor.
//!
//! The slices are treated as one virtual concatenation, cut into buckets of
//! `bucket_bytes`: each bucket is packed (a slice may straddle two buckets),
//! all-reduced in one collective, and unpacked back in place. Every rank must
//! pass slices of the same lengths in the same order.
//!
//! ```
//! use rlmesh_comm::{Bucketer, ReduceOp, RingComm};
//! let mut comm = RingComm::single();
//! let (mut w, mut b) = (vec![1.0f32; 300], vec![2.0f32; 7]);
//! let mut bucketer = Bucketer::<f32>::new(25 << 20);
//! bucketer.all_reduce(&mut comm, &mut [&mut w[..], &mut b[..]], ReduceOp::Mean).unwrap();
//! assert_eq!(b[0], 2.0);
//! ```

use crate::buffer::{Buf, Element};
use crate::collective::{Collective, ReduceOp};
use crate::error::Result;

/// The default bucket size, as in PyTorch DDP: 25 MiB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Packs slices into reusable flat buckets and all-reduces them.
#[derive(Debug)]
pub struct Bucketer<T: Element> {
    capacity: usize,
    bucket: Vec<T>,
    /// (slice index, offset in slice, length) of each piece in the current bucket.
    pieces: Vec<(usize, usize, usize)>,
}

impl<T: Element> Bucketer<T> {
    /// A bucketer whose buckets hold `bucket_bytes` bytes (at least one element).
    pub fn new(bucket_bytes: usize) -> Self {
        Bucketer {
            capacity: (bucket_bytes / std::mem::size_of::<T>()).max(1),
            bucket: Vec::new(),
            pieces: Vec::new(),
        }
    }

    /// Elements per bucket.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// All-reduces every slice with `op`, in place, in `ceil(total / capacity)` collectives.
    pub fn all_reduce<C: Collective + ?Sized>(&mut self, comm: &mut C, slices: &mut [&mut [T]], op: ReduceOp) -> Result<()> {
        let total: usize = slices.iter().map(|s| s.len()).sum();
        if total == 0 {
            return Ok(());
        }
        if self.bucket.len() < self.capacity.min(total) {
            self.bucket.resize(self.capacity.min(total), T::from_f64(0.0));
        }
        self.pieces.clear();
        let mut fill = 0;
        for i in 0..slices.len() {
            let len = slices[i].len();
            let mut off = 0;
            while off < len {
                let take = (self.capacity - fill).min(len - off);
                self.bucket[fill..fill + take].copy_from_slice(&slices[i][off..off + take]);
                self.pieces.push((i, off, take));
                fill += take;
                off += take;
                if fill == self.capacity {
                    self.flush(comm, slices, fill, op)?;
                    fill = 0;
                }
            }
        }
        if fill > 0 {
            self.flush(comm, slices, fill, op)?;
        }
        Ok(())
    }

    fn flush<C: Collective + ?Sized>(&mut self, comm: &mut C, slices: &mut [&mut [T]], fill: usize, op: ReduceOp) -> Result<()> {
        comm.all_reduce(Buf::host(&mut self.bucket[..fill]), op)?;
        let mut at = 0;
        for &(i, off, len) in &self.pieces {
            slices[i][off..off + len].copy_from_slice(&self.bucket[at..at + len]);
            at += len;
        }
        self.pieces.clear();
        Ok(())
    }
}

/// One-shot form of [`Bucketer::all_reduce`] (allocates a bucket each call; keep a [`Bucketer`] in a training loop).
pub fn all_reduce_bucketed<C: Collective + ?Sized, T: Element>(
    comm: &mut C,
    slices: &mut [&mut [T]],
    op: ReduceOp,
    bucket_bytes: usize,
) -> Result<()> {
    Bucketer::new(bucket_bytes).all_reduce(comm, slices, op)
}
