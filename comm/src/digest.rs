//! Digests of weight buffers, per bucket: XXH3-64, computed where the bytes are.
//!
//! A weight sync moves a flat buffer in fixed buckets; each receiver hashes a
//! bucket as soon as it has arrived and compares it with the sender's digest
//! of the same bucket, so a corrupted transfer is caught and named by bucket.
//! XXH3 runs at tens of GB/s per core (memory bandwidth, not the hash, is the
//! limit), where the FNV-1a the project used before, one byte at a time,
//! managed about 1 GB/s: slower than the network it was meant to check.
//! `launcher bench weight-sync` reports the digest's share of the sync time.
//!
//! The digest of a whole buffer is the XXH3 of its bucket size, length and
//! bucket digests, so it is the same whether computed in one pass or bucket by
//! bucket as they arrive.
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// XXH3-64 of one bucket's bytes.
pub fn bucket_digest(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
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
        let mut h = Xxh3::new();
        h.update(&(self.bucket_bytes as u64).to_le_bytes());
        h.update(&(self.len as u64).to_le_bytes());
        for d in &self.digests {
            h.update(&d.to_le_bytes());
        }
        h.digest()
    }

    /// The first bucket whose digest differs from `other`'s (or where the layouts differ).
    pub fn first_mismatch(&self, other: &BucketDigests) -> Option<usize> {
        if self.bucket_bytes != other.bucket_bytes || self.len != other.len || self.digests.len() != other.digests.len() {
            return Some(0);
        }
        self.digests.iter().zip(&other.digests).position(|(a, b)| a != b)
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
}
