//! The one interface both backends implement.
//!
//! Every collective works **in place** on a flat [`Buf`], with NCCL's in-place
//! conventions, so the same call sites serve the CPU ring and NCCL:
//!
//! | call | before | after |
//! |---|---|---|
//! | `all_reduce(buf, op)` | each rank's `buf` | every rank holds the sum (or mean) |
//! | `broadcast(buf, root)` | `buf` on `root` | every rank holds root's `buf` |
//! | `reduce_scatter(buf, op)` | `buf` of `world·m` elements | chunk `rank` (`buf[rank·m..(rank+1)·m]`) holds the reduced chunk; the rest is scratch |
//! | `all_gather(buf)` | chunk `rank` of `buf` (`world·m` elements) | every chunk holds its owner's data |
//! | `barrier()` | | every rank has entered |
//!
//! All ranks must make the same calls in the same order with the same sizes
//! and types; the CPU ring checks this and reports a [`crate::CommError::Mismatch`].

use crate::buffer::{Buf, Element};
use crate::error::Result;

/// How an all-reduce or reduce-scatter combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise sum divided by the world size (gradient averaging).
    Mean,
}

impl ReduceOp {
    /// Wire code.
    pub(crate) fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Mean => 2,
        }
    }
}

/// Collectives on flat buffers across the ranks of one group.
///
/// Object safe: a learner can hold a `Box<dyn Collective>` and not care
/// whether it is the CPU ring or NCCL. A failed call leaves the communicator
/// unusable (later calls return [`crate::CommError::Poisoned`]): rebuild it.
pub trait Collective {
    /// This process's rank, `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn world_size(&self) -> usize;
    /// Reduces `buf` across all ranks, in place; every rank ends with bit-identical contents.
    fn all_reduce(&mut self, buf: Buf<'_>, op: ReduceOp) -> Result<()>;
    /// Copies `buf` from `root` to every other rank, in place.
    fn broadcast(&mut self, buf: Buf<'_>, root: usize) -> Result<()>;
    /// Reduces `buf` (length `world·m`) so that this rank's chunk `rank·m..(rank+1)·m` holds the result.
    fn reduce_scatter(&mut self, buf: Buf<'_>, op: ReduceOp) -> Result<()>;
    /// Fills every chunk of `buf` (length `world·m`) from the rank that owns it.
    fn all_gather(&mut self, buf: Buf<'_>) -> Result<()>;
    /// Returns once every rank has entered the barrier (or with an error after the timeout).
    fn barrier(&mut self) -> Result<()>;
}

/// Typed conveniences over host slices, for every [`Collective`].
pub trait CollectiveExt: Collective {
    /// All-reduce of a host slice with `op`.
    fn all_reduce_slice<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce(Buf::host(data), op)
    }
    /// Sum all-reduce of a host slice.
    fn all_reduce_sum<T: Element>(&mut self, data: &mut [T]) -> Result<()> {
        self.all_reduce(Buf::host(data), ReduceOp::Sum)
    }
    /// Mean all-reduce of a host slice.
    fn all_reduce_mean<T: Element>(&mut self, data: &mut [T]) -> Result<()> {
        self.all_reduce(Buf::host(data), ReduceOp::Mean)
    }
    /// Broadcast of a host slice from `root`.
    fn broadcast_slice<T: Element>(&mut self, data: &mut [T], root: usize) -> Result<()> {
        self.broadcast(Buf::host(data), root)
    }
    /// Reduce-scatter of a host slice (see [`Collective::reduce_scatter`]).
    fn reduce_scatter_slice<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        self.reduce_scatter(Buf::host(data), op)
    }
    /// All-gather of a host slice (see [`Collective::all_gather`]).
    fn all_gather_slice<T: Element>(&mut self, data: &mut [T]) -> Result<()> {
        self.all_gather(Buf::host(data))
    }
}

impl<C: Collective + ?Sized> CollectiveExt for C {}
