//! A version in bounded parts, for the data plane.
//!
//! A rollout process that missed versions (started again, or a broadcast to it
//! failed) is sent the current one by the controller, which fetches it from
//! learner rank 0: both hops are data-plane messages, and the data plane caps
//! one at `node::wire::DATA_CAP` (1 GiB, 268 M float32 parameters). So a
//! version crosses as [`WeightPart`]s of at most [`WEIGHT_PART_BYTES`], sent in
//! order on one connection: the first carries the sender's digests, each the
//! next range of the image. The receiver's [`Assembly`] checks that they are
//! the next range of the same version and hashes each part's buckets as it
//! arrives (parts are whole buckets), so the finished [`WeightUpdate`] is
//! verified against the sender's digests without reading the image again.
use super::image::{Arrived, WeightUpdate, WEIGHT_BUCKET_BYTES};
use rlmesh_comm::digest::BucketDigests;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Largest part of a version on the data plane: 8 digest buckets (64 MiB).
pub const WEIGHT_PART_BYTES: usize = 8 * WEIGHT_BUCKET_BYTES;

/// One range of a version's image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WeightPart {
    /// Policy version.
    pub version: u64,
    /// The image's combined digest.
    pub digest: u64,
    /// The sender's bucket digests of the whole image: in the first part; in
    /// the others only their `bucket_bytes` and `len`.
    pub buckets: BucketDigests,
    /// Where this part starts in the image.
    pub offset: u64,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// The parts of a host image, `part_bytes` each (a multiple of the digest
/// bucket; the last may be shorter), made one at a time as they are sent.
/// An image of no bytes is one empty part.
pub fn parts(update: &WeightUpdate, part_bytes: usize) -> impl Iterator<Item = WeightPart> + '_ {
    assert!(update.on_device.is_none(), "a version on the data plane is a host image (WeightUpdate::to_host)");
    let bucket = update.buckets.bucket_bytes.max(1);
    let step = (part_bytes / bucket).max(1) * bucket;
    let count = update.image.len().div_ceil(step).max(1);
    (0..count).map(move |k| {
        let start = k * step;
        let end = (start + step).min(update.image.len());
        let digests = if k == 0 { update.buckets.digests.clone() } else { vec![] };
        WeightPart {
            version: update.version,
            digest: update.digest,
            buckets: BucketDigests { bucket_bytes: update.buckets.bucket_bytes, len: update.buckets.len, digests },
            offset: start as u64,
            bytes: update.image[start..end].to_vec(),
        }
    })
}

/// A version being put together from its parts.
#[derive(Debug)]
pub struct Assembly {
    version: u64,
    digest: u64,
    buckets: BucketDigests,
    image: Vec<u8>,
    /// Each arrived part's bucket digests, as they arrived.
    arrived: Vec<u64>,
    seconds: f64,
}

impl Assembly {
    /// Starts with a version's first part (offset 0, the sender's digests).
    /// The whole image's memory is reserved now: a size this process cannot
    /// hold is refused before anything else arrives.
    pub fn start(first: WeightPart) -> Result<Assembly, String> {
        if first.offset != 0 {
            return Err(format!("weight update v{}: the first part starts at byte {}, not 0", first.version, first.offset));
        }
        let (len, bucket) = (first.buckets.len, first.buckets.bucket_bytes.max(1));
        if first.buckets.digests.len() != len.div_ceil(bucket) {
            return Err(format!("weight update v{}: {} bucket digests for {len} bytes in buckets of {bucket}", first.version, first.buckets.digests.len()));
        }
        let mut image = Vec::new();
        image.try_reserve_exact(len).map_err(|e| format!("weight update v{}: cannot hold its {len} bytes: {e}", first.version))?;
        let mut a = Assembly { version: first.version, digest: first.digest, buckets: first.buckets.clone(), image, arrived: vec![], seconds: 0.0 };
        a.add(first)?;
        Ok(a)
    }

    /// Its version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Adds the next part: of the same version, starting where the image ends so far.
    pub fn add(&mut self, part: WeightPart) -> Result<(), String> {
        let v = self.version;
        if part.version != v || part.digest != self.digest {
            return Err(format!("weight update v{v}: a part of v{} (digest {:016x}) arrived among its own", part.version, part.digest));
        }
        if part.offset != self.image.len() as u64 {
            return Err(format!("weight update v{v}: a part at byte {} arrived where byte {} was next", part.offset, self.image.len()));
        }
        let end = self.image.len() + part.bytes.len();
        if end > self.buckets.len {
            return Err(format!("weight update v{v}: a part ends at byte {end}, past the image's {}", self.buckets.len));
        }
        let bucket = self.buckets.bucket_bytes.max(1);
        if part.bytes.len() % bucket != 0 && end != self.buckets.len {
            return Err(format!("weight update v{v}: a part of {} bytes is not whole buckets of {bucket}", part.bytes.len()));
        }
        let t = Instant::now();
        self.arrived.extend(BucketDigests::of(&part.bytes, bucket).digests);
        self.seconds += t.elapsed().as_secs_f64();
        self.image.extend_from_slice(&part.bytes);
        Ok(())
    }

    /// Has every byte arrived?
    pub fn complete(&self) -> bool {
        self.image.len() == self.buckets.len
    }

    /// The version, with the digests computed as its parts arrived (checked by
    /// [`super::image::verify`] against the sender's).
    pub fn finish(self) -> WeightUpdate {
        assert!(self.complete(), "an incomplete weight update");
        let arrived = Arrived { digests: BucketDigests { bucket_bytes: self.buckets.bucket_bytes, len: self.image.len(), digests: self.arrived }, seconds: self.seconds };
        WeightUpdate { version: self.version, digest: self.digest, buckets: self.buckets, image: self.image, arrived: Some(arrived), on_device: None }
    }
}

/// The versions a process is receiving as parts, by call id. One at a time:
/// a first part of another call drops whatever was in progress (its sender
/// gave up, or the process was asked again).
#[derive(Debug, Default)]
pub struct Assemblies {
    open: Option<(u64, Assembly)>,
}

impl Assemblies {
    /// Takes call `id`'s next part; the whole version once its last part is in.
    pub fn receive(&mut self, id: u64, part: WeightPart) -> Result<Option<WeightUpdate>, String> {
        let step = match self.open.take() {
            Some((open, mut a)) if open == id => a.add(part).map(|()| a),
            _ => Assembly::start(part),
        };
        let a = step?;
        if a.complete() {
            return Ok(Some(a.finish()));
        }
        self.open = Some((id, a));
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weight_sync::image::verify;

    fn update(len: usize, bucket: usize) -> WeightUpdate {
        let image: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let buckets = BucketDigests::of(&image, bucket);
        WeightUpdate { version: 3, digest: buckets.combined(), buckets, image, arrived: None, on_device: None }
    }

    #[test]
    fn parts_reassemble_to_the_image_and_verify_as_they_arrived() {
        for (len, bucket, part) in [(1000, 64, 256), (1024, 64, 256), (10, 64, 256), (0, 64, 256), (1000, 64, 100)] {
            let u = update(len, bucket);
            let ps: Vec<WeightPart> = parts(&u, part).collect();
            assert!(ps.iter().all(|p| p.bytes.len() <= part.max(bucket)), "{len}/{bucket}/{part}: a part over its bound");
            let mut at = Assemblies::default();
            let mut out = None;
            for (k, p) in ps.into_iter().enumerate() {
                assert!(out.is_none(), "finished before part {k}");
                out = at.receive(7, p).unwrap();
            }
            let got = out.expect("the last part finishes it");
            assert_eq!(got.image, u.image);
            assert_eq!(got.arrived.as_ref().unwrap().digests, u.buckets, "{len}/{bucket}/{part}: digests as they arrived");
            assert_eq!(verify(&got).unwrap(), u.digest);
        }
    }

    #[test]
    fn a_changed_byte_is_refused_naming_its_bucket() {
        let u = update(1000, 64);
        let mut ps: Vec<WeightPart> = parts(&u, 256).collect();
        ps[2].bytes[70] ^= 1; // byte 512 + 70: bucket 9
        let mut at = Assemblies::default();
        let got = ps.into_iter().map(|p| at.receive(1, p).unwrap()).last().flatten().unwrap();
        match verify(&got) {
            Err(crate::weight_sync::image::WeightError::Digest { bucket, .. }) => assert_eq!(bucket, 9),
            other => panic!("expected a digest error, got {other:?}"),
        }
    }

    #[test]
    fn parts_out_of_order_or_of_another_version_are_refused() {
        let u = update(1000, 64);
        let ps: Vec<WeightPart> = parts(&u, 256).collect();
        let mut at = Assemblies::default();
        assert!(at.receive(1, ps[1].clone()).unwrap_err().contains("starts at byte 256"));
        at.receive(1, ps[0].clone()).unwrap();
        assert!(at.receive(1, ps[2].clone()).unwrap_err().contains("byte 512 arrived where byte 256"));
        let mut other = update(1000, 64);
        other.version = 4;
        let mut at = Assemblies::default();
        at.receive(1, ps[0].clone()).unwrap();
        let mut foreign = parts(&other, 256).nth(1).unwrap();
        foreign.digest = u.digest;
        assert!(at.receive(1, foreign).unwrap_err().contains("part of v4"));
        // A new call's first part replaces what was in progress.
        let mut at = Assemblies::default();
        at.receive(1, ps[0].clone()).unwrap();
        let done = ps.iter().cloned().map(|p| at.receive(2, p).unwrap()).last().flatten().unwrap();
        assert_eq!(done.image, u.image);
    }
}
