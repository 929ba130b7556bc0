//! One core: a plain copy of a weight version against the copy with XXH3
//! fused into it, for every XXH3 kernel this CPU runs (the receiver's side of
//! a shared-memory weight sync, without the other processes).
//!
//! `cargo run --release -p rlmesh-comm --example xxh3_copy -- [MIB] [ROUNDS] [OFFSET]`
//! (defaults 256, 15 and 0). The source starts on a 64-byte line, as a shared
//! segment does; the destination OFFSET bytes after one. Prints the median
//! seconds of each and the fused copy's cost over the plain one; the rounds
//! alternate the variants.
use rlmesh_comm::xxh3::{Kernel, Xxh3Stream};
use std::time::Instant;

/// The pieces the shared-memory broadcast copies in.
const PIECE: usize = rlmesh_comm::cpu::PIECE_BYTES;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map_or(256, |a| a.parse().expect("MIB: a whole number"));
    let rounds: usize = args.next().map_or(15, |a| a.parse().expect("ROUNDS: a whole number"));
    let n = mib << 20;
    let offset: usize = args.next().map_or(0, |a| a.parse().expect("OFFSET: a whole number"));
    assert!(offset < 64, "OFFSET: bytes past a 64-byte line, 0 to 63");
    let mut src_buf = vec![0u8; n + 128];
    let mut dst_buf = vec![0u8; n + 128];
    let sa = (64 - src_buf.as_ptr() as usize % 64) % 64;
    let da = (64 - dst_buf.as_ptr() as usize % 64) % 64 + offset;
    let src = &mut src_buf[sa..sa + n];
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
    }
    let src: &[u8] = src;
    let dst = &mut dst_buf[da..da + n];
    let kernels = if Kernel::best() == Kernel::Scalar { vec![Kernel::Scalar] } else { vec![Kernel::Scalar, Kernel::best()] };
    let mut plain = Vec::new();
    let mut fused: Vec<Vec<f64>> = vec![Vec::new(); kernels.len()];
    let mut digests = vec![0u64; kernels.len()];
    for _ in 0..rounds {
        let t = Instant::now();
        for (d, s) in dst.chunks_mut(PIECE).zip(src.chunks(PIECE)) {
            d.copy_from_slice(s);
        }
        plain.push(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
        for (k, kernel) in kernels.iter().enumerate() {
            let t = Instant::now();
            let mut h = Xxh3Stream::with_kernel(*kernel);
            for (d, s) in dst.chunks_mut(PIECE).zip(src.chunks(PIECE)) {
                h.copy(d, s);
            }
            digests[k] = h.digest();
            fused[k].push(t.elapsed().as_secs_f64());
        }
    }
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "every kernel gives the same digest");
    assert_eq!(&dst[..], src, "the copy is exact");
    let p = median(plain);
    println!("{mib} MiB in pieces of {} KiB, median of {rounds} rounds", PIECE >> 10);
    println!("plain copy        {:8.2} ms", p * 1e3);
    for (kernel, f) in kernels.iter().zip(fused) {
        let f = median(f);
        println!("fused {:<11} {:8.2} ms  {:+6.1}% over the copy", format!("{kernel:?}"), f * 1e3, (f / p - 1.0) * 100.0);
    }
}
