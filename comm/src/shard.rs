//! Which elements of a flat buffer each rank owns when state is sharded
//! (ZeRO-1/2: a learner's AdamW state), and the bucketed reduce-scatter and
//! all-gather over that layout.
//!
//! The flat order (for a learner, every trained parameter end to end, as its
//! gradient buffer holds them) is cut into buckets of `world × bucket` elements; in each
//! bucket, rank `r` owns the `r`-th `bucket`-element chunk. A bucket is then
//! exactly one reduce-scatter (or all-gather) of `comm`'s collectives, in
//! place, with no packing: after a reduce-scatter of bucket `k`, this rank's
//! chunk of it holds the sum over ranks. The last bucket holds what remains,
//! padded to a multiple of the world size (the flat buffer is allocated to
//! [`ShardLayout::padded`]; padding is never owned). A rank's state is its
//! chunks, bucket after bucket: about `1/world` of the whole.
//!
//! ```
//! use rlmesh_comm::shard::ShardLayout;
//! let l = ShardLayout::new(10, 2, 3);
//! // Buckets [0, 6) and [6, 10): rank 0 owns 0..3 and 6..8, rank 1 owns 3..6 and 8..10.
//! assert_eq!(l.owned(0), vec![(0, 3), (6, 2)]);
//! assert_eq!(l.owned(1), vec![(3, 3), (8, 2)]);
//! assert_eq!(l.padded(), 10);
//! ```
use crate::buffer::Buf;
use crate::collective::{Collective, ReduceOp};
use crate::error::Result;
use serde::{Deserialize, Serialize};

/// The ownership of a flat buffer of `total` elements by `world` ranks, in chunks of `bucket`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLayout {
    /// Elements of the flat parameter order.
    pub total: usize,
    /// Ranks.
    pub world: usize,
    /// Elements each rank owns of a full bucket.
    pub bucket: usize,
}

impl ShardLayout {
    /// A layout of `total` elements over `world` ranks, `bucket` elements per rank per bucket.
    pub fn new(total: usize, world: usize, bucket: usize) -> ShardLayout {
        ShardLayout { total, world: world.max(1), bucket: bucket.max(1) }
    }

    /// The layout whose collectives move about `bucket_bytes` of float32 each.
    pub fn for_bytes(total: usize, world: usize, bucket_bytes: usize) -> ShardLayout {
        ShardLayout::new(total, world, bucket_bytes / 4 / world.max(1))
    }

    /// One rank owning everything (the unsharded optimizer).
    pub fn whole(total: usize) -> ShardLayout {
        ShardLayout::new(total, 1, total)
    }

    /// The buckets, as `(start, length)` of the padded flat buffer; each length is a multiple of `world`.
    pub fn buckets(&self) -> Vec<(usize, usize)> {
        let full = self.world * self.bucket;
        let mut out = Vec::with_capacity(self.total / full + 1);
        let mut at = 0;
        while at < self.total {
            let len = if self.total - at >= full { full } else { (self.total - at).div_ceil(self.world) * self.world };
            out.push((at, len));
            at += len;
        }
        out
    }

    /// Length of the flat buffer the collectives work on: `total` plus the last bucket's padding.
    pub fn padded(&self) -> usize {
        self.buckets().last().map_or(0, |&(start, len)| start + len)
    }

    /// Rank `rank`'s ranges `(flat start, length)` in state order, padding excluded.
    pub fn owned(&self, rank: usize) -> Vec<(usize, usize)> {
        self.buckets()
            .into_iter()
            .filter_map(|(start, len)| {
                let chunk = len / self.world;
                let a = start + rank * chunk;
                let b = (a + chunk).min(self.total);
                (a < b).then(|| (a, b - a))
            })
            .collect()
    }

    /// Elements rank `rank` owns.
    pub fn owned_len(&self, rank: usize) -> usize {
        self.owned(rank).iter().map(|r| r.1).sum()
    }

    /// Where the ranges of `self` (rank `rank`) lie in another layout's ranks:
    /// `(offset in my state, other rank, offset in its state, length)` pieces
    /// covering all of my state (resharding a checkpoint to another world size).
    pub fn pieces_from(&self, rank: usize, other: &ShardLayout) -> Vec<(usize, usize, usize, usize)> {
        assert_eq!(self.total, other.total, "layouts of different parameter counts");
        // Every rank's ranges of the other layout, as (flat start, length, rank, state offset), sorted.
        let mut theirs: Vec<(usize, usize, usize, usize)> = Vec::new();
        for r in 0..other.world {
            let mut at = 0;
            for (start, len) in other.owned(r) {
                theirs.push((start, len, r, at));
                at += len;
            }
        }
        theirs.sort_unstable();
        let mut out = Vec::new();
        let mut mine_at = 0;
        for (start, len) in self.owned(rank) {
            let end = start + len;
            let first = theirs.partition_point(|t| t.0 + t.1 <= start);
            for &(s, l, r, off) in &theirs[first..] {
                if s >= end {
                    break;
                }
                let (a, b) = (start.max(s), end.min(s + l));
                out.push((mine_at + a - start, r, off + a - s, b - a));
            }
            mine_at += len;
        }
        out
    }
}

/// Reduce-scatters `buf` (at least [`ShardLayout::padded`] elements) bucket by
/// bucket, in place: afterwards this rank's owned ranges hold the reduction over
/// ranks; the rest of the buffer is scratch. One collective per bucket.
pub fn reduce_scatter_sharded<C: Collective + ?Sized>(comm: &mut C, mut buf: Buf<'_>, layout: &ShardLayout, op: ReduceOp) -> Result<()> {
    check_len("reduce_scatter_sharded", comm.rank(), &buf, layout)?;
    for (start, len) in layout.buckets() {
        comm.reduce_scatter(buf.slice(start, len), op)?;
    }
    Ok(())
}

/// All-gathers `buf` bucket by bucket, in place: every rank's owned ranges
/// (as it holds them) reach every rank. One collective per bucket.
pub fn all_gather_sharded<C: Collective + ?Sized>(comm: &mut C, mut buf: Buf<'_>, layout: &ShardLayout) -> Result<()> {
    check_len("all_gather_sharded", comm.rank(), &buf, layout)?;
    for (start, len) in layout.buckets() {
        comm.all_gather(buf.slice(start, len))?;
    }
    Ok(())
}

fn check_len(op: &'static str, rank: usize, buf: &Buf<'_>, layout: &ShardLayout) -> Result<()> {
    if buf.len() < layout.padded() {
        return Err(crate::error::CommError::InvalidArgument {
            rank,
            op,
            reason: format!("buffer of {} elements, the layout needs {} (padded)", buf.len(), layout.padded()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element is owned by exactly one rank, chunks of a bucket by rank order.
    #[test]
    fn ranks_partition_the_elements() {
        for (total, world, bucket) in [(10, 2, 3), (1000, 4, 7), (5, 4, 1), (97, 3, 100), (64, 4, 16), (1, 2, 5)] {
            let l = ShardLayout::new(total, world, bucket);
            let mut seen = vec![0u8; total];
            for r in 0..world {
                for (a, n) in l.owned(r) {
                    seen[a..a + n].iter_mut().for_each(|s| *s += 1);
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{total}/{world}/{bucket}: {seen:?}");
            assert!(l.padded() >= total && l.padded() % world == 0);
            for (_, len) in l.buckets() {
                assert_eq!(len % world, 0);
            }
            let most = (0..world).map(|r| l.owned_len(r)).max().unwrap();
            assert!(most <= total.div_ceil(world) + bucket, "{total}/{world}/{bucket}: a rank owns {most}");
        }
    }

    /// Pieces from another layout cover a rank's state exactly and point at the same flat elements.
    #[test]
    fn resharding_pieces_map_each_element_to_its_old_owner() {
        let flat: Vec<usize> = (0..1000).collect();
        for (old, new) in [((2, 37), (4, 11)), ((4, 11), (2, 37)), ((1, 1000), (3, 5)), ((3, 5), (1, 1000))] {
            let a = ShardLayout::new(1000, old.0, old.1);
            let b = ShardLayout::new(1000, new.0, new.1);
            let state = |l: &ShardLayout, r: usize| -> Vec<usize> { l.owned(r).iter().flat_map(|&(s, n)| flat[s..s + n].to_vec()).collect() };
            for r in 0..b.world {
                let want = state(&b, r);
                let mut got = vec![usize::MAX; want.len()];
                for (mine, other, off, n) in b.pieces_from(r, &a) {
                    got[mine..mine + n].copy_from_slice(&state(&a, other)[off..off + n]);
                }
                assert_eq!(got, want, "{old:?} → {new:?}, rank {r}");
            }
        }
    }
}
