//! Vectorised CPU kernels of the greedy sampler.
//!
//! A greedy decode step needs, per row of logits, the first largest entry and
//! its log-probability. libtorch gets them from `argmax` (a one-element-at-a-time
//! reduction on CPU) and a full `log_softmax` (which writes a vocabulary-wide
//! row only to read one entry back): on the tiny model at batch 32 the two were
//! ~45% of a decode step. Here each row is read three times from cache and
//! nothing is written: its maximum, the first position holding it, and
//! `Σ exp(x − max)`, whose logarithm is the log-probability's normaliser.
//!
//! The functions are written as fixed-width lane loops that LLVM vectorises; on
//! x86-64 they are compiled a second time for AVX2 + FMA and picked at run time.
use tch::{Device, Kind, Tensor};

/// Lanes of the row scans.
const LANES: usize = 16;

/// Greedy tokens and their log-probabilities for logits `[B, V]` (float32,
/// contiguous, CPU), or `None` when the kernels do not apply (another device or
/// dtype, an empty vocabulary, a row holding a NaN): the caller uses libtorch then.
pub fn greedy_rows(logits: &Tensor) -> Option<(Vec<i64>, Vec<f32>)> {
    let size = logits.size();
    if logits.device() != Device::Cpu || logits.kind() != Kind::Float || size.len() != 2 || !logits.is_contiguous() || size[1] == 0 {
        return None;
    }
    let (rows, width) = (size[0] as usize, size[1] as usize);
    // SAFETY: a contiguous float32 CPU tensor of rows × width elements, borrowed for this scope.
    let data = unsafe { std::slice::from_raw_parts(logits.data_ptr() as *const f32, rows * width) };
    let (mut tokens, mut logprobs) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for row in data.chunks_exact(width) {
        let (index, max) = argmax_row(row)?;
        tokens.push(index as i64);
        logprobs.push(if max == f32::NEG_INFINITY { f32::NAN } else { -sum_exp_below(row, max).ln() });
    }
    Some((tokens, logprobs))
}

/// The first largest value of `row` and where it is, or `None` when the row holds
/// a NaN or is empty (libtorch's `argmax` picks the first NaN; the caller defers to it).
pub fn argmax_row(row: &[f32]) -> Option<(usize, f32)> {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx512() {
        // SAFETY: the CPU has the features.
        return unsafe { argmax_avx512(row) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2_fma() {
        // SAFETY: the CPU has the features.
        return unsafe { argmax_avx2(row) };
    }
    argmax_scan(row)
}

/// `Σ exp(x − max)` over `row`, where `max` is the row's maximum (so the sum is ≥ 1
/// and every term ≤ 1). Each term is within 2 ulp of the exact exponential.
pub fn sum_exp_below(row: &[f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx512() {
        // SAFETY: the CPU has the features.
        return unsafe { sum_exp_avx512(row, max) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2_fma() {
        // SAFETY: the CPU has the features.
        return unsafe { sum_exp_avx2(row, max) };
    }
    sum_exp_scan(row, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn argmax_avx2(row: &[f32]) -> Option<(usize, f32)> {
    argmax_scan(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_exp_avx2(row: &[f32], max: f32) -> f32 {
    sum_exp_scan(row, max)
}

/// [`argmax_scan`] in AVX-512 registers: per chunk of 16, one compare for the new
/// maxima, two masked moves (value, chunk number), one compare for NaN.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn argmax_avx512(row: &[f32]) -> Option<(usize, f32)> {
    use std::arch::x86_64::*;
    let chunks = row.chunks_exact(LANES);
    let (tail, full) = (chunks.remainder(), chunks.len());
    let (mut best, mut at, mut chunk_no) = (_mm512_set1_ps(f32::NEG_INFINITY), _mm512_setzero_si512(), _mm512_setzero_si512());
    let (one, mut nan) = (_mm512_set1_epi32(1), 0u16);
    for chunk in chunks {
        // SAFETY: a chunk is 16 floats.
        let x = unsafe { _mm512_loadu_ps(chunk.as_ptr()) };
        let take = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, best);
        best = _mm512_mask_mov_ps(best, take, x);
        at = _mm512_mask_mov_epi32(at, take, chunk_no);
        nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        chunk_no = _mm512_add_epi32(chunk_no, one);
    }
    let (mut lanes_best, mut lanes_at) = ([0.0f32; LANES], [0u32; LANES]);
    // SAFETY: 16-element destinations.
    unsafe {
        _mm512_storeu_ps(lanes_best.as_mut_ptr(), best);
        _mm512_storeu_si512(lanes_at.as_mut_ptr().cast(), at);
    }
    if nan != 0 || tail.iter().any(|x| x.is_nan()) || row.is_empty() {
        return None;
    }
    first_of_lanes(&lanes_best, &lanes_at, tail, full)
}

/// The row's first largest entry from the lanes' maxima and first chunks (`full` whole
/// chunks were scanned) and the tail after them.
#[inline(always)]
fn first_of_lanes(best: &[f32; LANES], at: &[u32; LANES], tail: &[f32], full: usize) -> Option<(usize, f32)> {
    let max = tail.iter().chain(best).fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    let in_chunks = (0..LANES).filter(|&l| full > 0 && best[l] == max).map(|l| at[l] as usize * LANES + l).min();
    in_chunks.or_else(|| tail.iter().position(|&x| x == max).map(|i| full * LANES + i)).map(|i| (i, max))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn sum_exp_avx512(row: &[f32], max: f32) -> f32 {
    sum_exp_scan(row, max)
}

#[inline(always)]
fn argmax_scan(row: &[f32]) -> Option<(usize, f32)> {
    // One pass: each lane keeps its largest value and the first chunk that held it
    // (strict `>`); the row's first largest entry is then the earliest of the lanes'.
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut at = [0u32; LANES];
    let mut nan = [false; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    let full = chunks.len();
    for (c, chunk) in chunks.enumerate() {
        for l in 0..LANES {
            let x = chunk[l];
            let take = x > best[l];
            best[l] = if take { x } else { best[l] };
            at[l] = if take { c as u32 } else { at[l] };
            nan[l] |= x.is_nan();
        }
    }
    if nan.iter().any(|&n| n) || tail.iter().any(|x| x.is_nan()) || row.is_empty() {
        return None;
    }
    first_of_lanes(&best, &at, tail, full)
}

#[inline(always)]
fn sum_exp_scan(row: &[f32], max: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for l in 0..LANES {
            acc[l] += exp_nonpositive(chunk[l] - max);
        }
    }
    let mut total: f32 = acc.iter().sum();
    for &x in tail {
        total += exp_nonpositive(x - max);
    }
    total
}

/// `eˣ` for `x ≤ 0` (−∞ included), branch-free so that it vectorises: `x = n·ln 2 + r`
/// with `|r| ≤ ln 2 / 2` (ln 2 split in two for an exact reduction), a degree-6
/// polynomial for `eʳ` (the classic single-precision minimax coefficients), and
/// `2ⁿ` built from its exponent bits. Below −87 the result is flushed to 0 (the
/// terms summed here are then < 2⁻¹²⁵ beside a sum ≥ 1).
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let tiny = x < -87.0;
    let x = if tiny { -87.0 } else { x };
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let er = p.mul_add(r * r, r) + 1.0;
    // SAFETY: x ∈ [−87, 0] here, so n is a whole number in [−126, 0] (a plain `as` would add
    // saturation and NaN checks that stop the loop from vectorising).
    let n = unsafe { n.to_int_unchecked::<i32>() };
    let scale = f32::from_bits(((n + 127) as u32) << 23);
    if tiny { 0.0 } else { er * scale }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::splitmix64 as splitmix;

    /// The scan picks what libtorch's argmax picks: ties (values from a small set),
    /// −∞, every tail length, vocabulary-sized rows; NaN and empty rows are refused.
    #[test]
    fn argmax_matches_libtorch() {
        let mut state = 7u64;
        for len in (1..70).chain([49_152, 49_153]) {
            for pool in [3u64, 1000] {
                let row: Vec<f32> = (0..len)
                    .map(|_| match splitmix(&mut state) % pool {
                        0 => f32::NEG_INFINITY,
                        k => k as f32 * 0.25 - 100.0,
                    })
                    .collect();
                let theirs = Tensor::from_slice(&row).argmax(0, false).int64_value(&[]) as usize;
                assert_eq!(argmax_row(&row).map(|(i, _)| i), Some(theirs), "length {len}, {pool} distinct values");
            }
        }
        assert_eq!(argmax_row(&[f32::NEG_INFINITY; 40]), Some((0, f32::NEG_INFINITY)));
        assert_eq!(argmax_row(&[]), None);
        let mut row = vec![1.0f32; 40];
        row[33] = f32::NAN;
        assert_eq!(argmax_row(&row), None);
        assert!(greedy_rows(&Tensor::from_slice(&row).view([2, 20])).is_none());
    }

    /// The exponential is within 2 ulp of the correctly rounded one over its whole range.
    #[test]
    fn exponential_is_accurate() {
        let mut worst = 0.0f64;
        for i in 0..=2_000_000 {
            let x = -87.0 * i as f32 / 2_000_000.0;
            let exact = (x as f64).exp();
            let ulp = f32::from_bits((exact as f32).to_bits() + 1) as f64 - exact as f32 as f64;
            worst = worst.max((exp_nonpositive(x) as f64 - exact).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(-200.0), 0.0);
    }

    /// Tokens equal libtorch's argmax, and log-probabilities are as exact as its
    /// log_softmax, on logits of a realistic spread and on rows with −∞ entries.
    #[test]
    fn greedy_rows_match_argmax_and_log_softmax() {
        tch::manual_seed(11);
        let logits = Tensor::randn([5, 49_152], (Kind::Float, Device::Cpu)) * 4.0;
        let _ = logits.narrow(1, 0, 1000).fill_(f64::NEG_INFINITY);
        let (tokens, logprobs) = greedy_rows(&logits).expect("applies");
        let next = logits.argmax(-1, false);
        assert_eq!(tokens, Vec::<i64>::try_from(&next).unwrap());
        let theirs = Vec::<f32>::try_from(logits.log_softmax(-1, Kind::Float).gather(-1, &next.unsqueeze(-1), false).squeeze_dim(-1)).unwrap();
        // Against the exact (f64) log-probability: ours must be as close as libtorch's own float32
        // log_softmax, within 2e-6. Both sum ~48k exponentials in f32, in orders that differ between
        // instruction sets (on a Zen 3's AVX2 paths ours was 2.8–7.1e-6 off, libtorch 5.2–12.8e-6).
        let exact = Vec::<f64>::try_from(logits.to_kind(Kind::Double).log_softmax(-1, Kind::Double).gather(-1, &next.unsqueeze(-1), false).squeeze_dim(-1)).unwrap();
        for ((&a, &b), &e) in logprobs.iter().zip(&theirs).zip(&exact) {
            let (ours, libtorch) = ((a as f64 - e).abs(), (b as f64 - e).abs());
            assert!(ours <= libtorch.max(2e-6) + 2e-6, "log-prob {a} (off by {ours:.2e}) vs libtorch {b} (off by {libtorch:.2e}), exact {e}");
        }
    }

    /// Every build of the kernels this CPU can run (AVX-512, AVX2 + FMA, the
    /// baseline) gives the same answers, bit for bit: the fallbacks an
    /// AVX2-only CPU takes are exercised here even on an AVX-512 machine.
    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let detected = crate::isa::Isa::detected();
        let mut state = 3u64;
        let mut checked = 0;
        for len in (1..70).chain([1000, 49_153]) {
            for pool in [3u64, 1000] {
                let mut row: Vec<f32> = (0..len)
                    .map(|_| match splitmix(&mut state) % pool {
                        0 => f32::NEG_INFINITY,
                        k => k as f32 * 0.25 - 100.0,
                    })
                    .collect();
                let want = argmax_scan(&row);
                let max = want.map_or(f32::NEG_INFINITY, |(_, m)| m);
                let sum = sum_exp_scan(&row, max);
                #[cfg(target_arch = "x86_64")]
                {
                    use crate::isa::Isa;
                    if detected >= Isa::Avx2 {
                        // SAFETY: the CPU has AVX2 and FMA.
                        unsafe {
                            assert_eq!(argmax_avx2(&row), want, "avx2 argmax, length {len}");
                            assert_eq!(sum_exp_avx2(&row, max).to_bits(), sum.to_bits(), "avx2 sum, length {len}");
                        }
                        checked += 1;
                    }
                    if detected >= Isa::Avx512 {
                        // SAFETY: the CPU has AVX-512F, AVX2 and FMA.
                        unsafe {
                            assert_eq!(argmax_avx512(&row), want, "avx512 argmax, length {len}");
                            assert_eq!(sum_exp_avx512(&row, max).to_bits(), sum.to_bits(), "avx512 sum, length {len}");
                            row[len / 2] = f32::NAN;
                            assert_eq!(argmax_avx512(&row), None, "a NaN, length {len}");
                        }
                    }
                }
            }
        }
        eprintln!("{detected:?}: {checked} rows compared across instruction sets");
    }
}
