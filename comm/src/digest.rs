//! Digests of weight buffers, per bucket: XXH3-64, computed where the bytes are.
//!
//! A weight sync moves a flat buffer in fixed buckets; each receiver hashes a
//! bucket as soon as it has arrived and compares it with the sender's digest
//! of the same bucket, so a corrupted transfer is caught and named by bucket.
//! XXH3 runs at tens of GB/s per core (twox-hash picks AVX2 at run time:
//! 42 GB/s on a cached piece on this project's Xeon, twice its SSE2 path), where the FNV-1a the project used before, one byte at a time,
//! managed about 1 GB/s: slower than the network it was meant to check.
//! `launcher bench weight-sync` reports the digest's share of the sync time.
//!
//! The digest of a whole buffer is the XXH3 of its bucket size, length and
//! bucket digests, so it is the same whether computed in one pass or bucket by
//! bucket as they arrive.
//!
//! Where the bytes pass through this process's memory (the CPU ring, the
//! shared segment), a [`BucketHasher`] digests each piece as it passes: out
//! of the shared segment, in the same pass as the copy ([`crate::xxh3`]: each
//! stripe loaded once, stored and hashed from the same registers); from a
//! socket, as soon as a block has arrived, while it is in cache. Hashing a
//! bucket after it has arrived reads it from memory a second time, and on a
//! machine whose cores all move weights that second pass cost over a third of
//! the sync time. The sender's digests come from `twox-hash`, the receivers'
//! from [`crate::xxh3`]: every sync cross-checks the two implementations.
use crate::xxh3::Xxh3Stream;
use std::hash::Hasher;
use std::time::Instant;
use twox_hash::XxHash3_64;

/// XXH3-64 of one bucket's bytes.
pub fn bucket_digest(bytes: &[u8]) -> u64 {
    XxHash3_64::oneshot(bytes)
}

/// The digests of a buffer's buckets, in order.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BucketDigests {
    /// Bucket size in bytes (the last bucket may be shorter).
    pub bucket_bytes: usize,
    /// Total bytes.
    pub len: usize,
    /// One digest per bucket.
    pub digests: Vec<u64>,
}

impl BucketDigests {
    /// Digests `bytes` in buckets of `bucket_bytes` (at least 1).
    pub fn of(bytes: &[u8], bucket_bytes: usize) -> BucketDigests {
        let bucket_bytes = bucket_bytes.max(1);
        BucketDigests { bucket_bytes, len: bytes.len(), digests: bytes.chunks(bucket_bytes).map(bucket_digest).collect() }
    }

    /// One 64-bit digest of the whole buffer.
    pub fn combined(&self) -> u64 {
        let mut h = XxHash3_64::with_seed(0);
        h.write(&(self.bucket_bytes as u64).to_le_bytes());
        h.write(&(self.len as u64).to_le_bytes());
        for d in &self.digests {
            h.write(&d.to_le_bytes());
        }
        h.finish()
    }

    /// The first bucket whose digest differs from `other`'s (or where the layouts differ).
    pub fn first_mismatch(&self, other: &BucketDigests) -> Option<usize> {
        if self.bucket_bytes != other.bucket_bytes || self.len != other.len || self.digests.len() != other.digests.len() {
            return Some(0);
        }
        self.digests.iter().zip(&other.digests).position(|(a, b)| a != b)
    }
}

/// Digests a byte stream in buckets as it passes, piece by piece: the same
/// digests as [`BucketDigests::of`] over the whole stream, whatever the pieces.
/// [`BucketHasher::copy_in`] copies a piece and digests it in one pass
/// ([`crate::xxh3`]); [`BucketHasher::update`] digests bytes already in place.
pub struct BucketHasher {
    bucket_bytes: usize,
    len: usize,
    filled: usize,
    stream: Xxh3Stream,
    digests: Vec<u64>,
    seconds: f64,
}

impl BucketHasher {
    /// A hasher for buckets of `bucket_bytes` (at least 1).
    pub fn new(bucket_bytes: usize) -> BucketHasher {
        BucketHasher { bucket_bytes: bucket_bytes.max(1), len: 0, filled: 0, stream: Xxh3Stream::default(), digests: Vec::new(), seconds: 0.0 }
    }

    /// Feeds the next piece of the stream.
    pub fn update(&mut self, bytes: &[u8]) {
        let t = Instant::now();
        self.feed(bytes, None);
        self.seconds += t.elapsed().as_secs_f64();
    }

    /// Copies `src` into `dst` (the same length) and feeds it as the next
    /// piece, reading each byte once. The seconds it takes are the copy's and
    /// are not counted in [`BucketHasher::seconds`].
    pub fn copy_in(&mut self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "copy between slices of different lengths");
        self.feed(src, Some(dst));
    }

    fn feed(&mut self, mut src: &[u8], mut dst: Option<&mut [u8]>) {
        while !src.is_empty() {
            let take = (self.bucket_bytes - self.filled).min(src.len());
            match dst.take() {
                Some(d) => {
                    let (now, later) = d.split_at_mut(take);
                    self.stream.copy(now, &src[..take]);
                    dst = Some(later);
                }
                None => self.stream.update(&src[..take]),
            }
            (self.filled, self.len) = (self.filled + take, self.len + take);
            if self.filled == self.bucket_bytes {
                self.digests.push(self.stream.digest());
                self.stream = Xxh3Stream::default();
                self.filled = 0;
            }
            src = &src[take..];
        }
    }

    /// Seconds spent in [`BucketHasher::update`] so far (hashing bytes in place).
    pub fn seconds(&self) -> f64 {
        self.seconds
    }

    /// Bytes fed so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was fed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The digests of the stream (the last bucket may be shorter).
    pub fn finish(mut self) -> BucketDigests {
        if self.filled > 0 {
            self.digests.push(self.stream.digest());
        }
        BucketDigests { bucket_bytes: self.bucket_bytes, len: self.len, digests: self.digests }
    }
}

/// The combined digest of `bytes` in buckets of `bucket_bytes` (see [`BucketDigests::combined`]).
pub fn buffer_digest(bytes: &[u8], bucket_bytes: usize) -> u64 {
    BucketDigests::of(bytes, bucket_bytes).combined()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xxh3_matches_the_reference_vectors() {
        // From the xxHash reference implementation (XXH3_64bits, seed 0).
        assert_eq!(bucket_digest(b""), 0x2D06_8005_38D3_94C2);
        assert_eq!(bucket_digest(b"a"), 0xE6C6_32B6_1E96_4E1F);
    }

    #[test]
    fn a_changed_byte_is_found_in_its_bucket() {
        let a: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let da = BucketDigests::of(&a, 1024);
        assert_eq!(da.digests.len(), 10);
        let mut b = a.clone();
        b[5 * 1024 + 3] ^= 0x10;
        let db = BucketDigests::of(&b, 1024);
        assert_eq!(da.first_mismatch(&db), Some(5));
        assert_ne!(da.combined(), db.combined());
        assert_eq!(da.first_mismatch(&da.clone()), None);
        // Same bytes, other bucketing: another combined digest, and layouts differ.
        assert_ne!(da.combined(), BucketDigests::of(&a, 2048).combined());
        assert_eq!(da.first_mismatch(&BucketDigests::of(&a, 2048)), Some(0));
    }

    #[test]
    fn digests_fed_piece_by_piece_equal_those_of_the_whole() {
        let a: Vec<u8> = (0..100_003u32).map(|i| (i * 31 % 253) as u8).collect();
        // Pieces smaller than, equal to and straddling buckets, and buckets
        // below XXH3's 240-byte short-input path.
        for bucket in [1, 100, 240, 241, 4096, 65_536, 1 << 20] {
            let whole = BucketDigests::of(&a, bucket);
            for piece in [1, 7, 239, 4096, 10_000, 200_000] {
                if piece == 1 && bucket > 4096 {
                    continue;
                }
                let mut h = BucketHasher::new(bucket);
                a.chunks(piece).for_each(|p| h.update(p));
                assert_eq!(h.finish(), whole, "bucket {bucket}, piece {piece}");
                let (mut h, mut out) = (BucketHasher::new(bucket), vec![0u8; a.len()]);
                out.chunks_mut(piece).zip(a.chunks(piece)).for_each(|(d, s)| h.copy_in(d, s));
                assert_eq!(h.finish(), whole, "copied: bucket {bucket}, piece {piece}");
                assert_eq!(out, a);
            }
        }
        assert_eq!(BucketHasher::new(64).finish(), BucketDigests::of(&[], 64));
        let mut h = BucketHasher::new(64);
        h.update(&[]);
        assert!(h.is_empty());
        assert_eq!(h.finish(), BucketDigests::of(&[], 64));
    }
}
