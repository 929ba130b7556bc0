//! The output projection as an MKL packed GEMM on CPU, for the decode loop.
//!
//! Every decode step multiplies `[B, H]` hidden states by the `[V, H]` output
//! projection. For a small `H` and a large `V` (the tiny model: 64 × 49,152) MKL's
//! `sgemm` re-packs the whole 12.6 MB weight into its blocked layout on every
//! call — 17–26% of a batch-8/32 decode step in `perf`, paid by transformers
//! too. MKL's packed interface (`cblas_sgemm_pack` / `cblas_sgemm_compute`,
//! exported by `libtorch_cpu.so`) packs it once per `generate` call instead; the
//! weights cannot change during one. The functions are looked up at run time, so
//! a libtorch without MKL (another BLAS, another CPU) simply keeps `linear`, and
//! `generate` keeps the packed product only when its first one is bit-for-bit
//! `linear`'s (MKL takes another kernel for two rows, an ulp apart).
//!
//! The weight is packed in blocks of vocabulary rows (1 MiB of logits each), so
//! a greedy step ([`PackedHead::greedy`]) scans each block for its arg-max and
//! normaliser while the block is still in L2 and never writes the full logits;
//! sampling takes the full logits from the same blocks.
use crate::mkl::{mkl, B_MATRIX, NO_TRANS, PACKED, ROW_MAJOR, TRANS};
use tch::{Device, Kind, Tensor};

/// Elements of one block of logits: 1 MiB, which stays in a core's L2 while it is scanned.
const BLOCK_ELEMENTS: i64 = 256 * 1024;

/// An output projection `[V, H]` packed for products with `rows × H` inputs, in
/// blocks of vocabulary rows, so that a greedy step can scan each block of logits
/// while it is still in cache instead of writing and re-reading all `rows × V`.
pub struct PackedHead {
    /// (first vocabulary row, rows in the block, the block packed).
    blocks: Vec<(i32, i32, Tensor)>,
    rows: i32,
    vocab: i32,
    hidden: i32,
    scratch: Vec<f32>,
}

impl PackedHead {
    /// Packs `weight` (`[V, H]`, float32, contiguous, CPU) for `rows` inputs, or `None`
    /// where it does not apply: another device or dtype, a single row (MKL takes a
    /// `gemv` then, without packing), sizes beyond 32-bit, no MKL in this libtorch.
    pub fn new(weight: &Tensor, rows: i64) -> Option<PackedHead> {
        let size = weight.size();
        if weight.device() != Device::Cpu || weight.kind() != Kind::Float || size.len() != 2 || !weight.is_contiguous() || rows < 2 {
            return None;
        }
        let width = (BLOCK_ELEMENTS / rows).max(256) / 16 * 16;
        let (rows, vocab, hidden) = (i32::try_from(rows).ok()?, i32::try_from(size[0]).ok()?, i32::try_from(size[1]).ok()?);
        let mkl = mkl()?.packed.as_ref()?;
        let weights = weight.data_ptr() as *const f32;
        let mut blocks = vec![];
        for start in (0..vocab).step_by(width as usize) {
            let len = (vocab - start).min(width as i32);
            // SAFETY: valid dimensions; MKL returns the packed buffer's size in bytes.
            let bytes = unsafe { (mkl.get_size)(B_MATRIX, rows, len, hidden) };
            let packed = Tensor::empty([bytes.div_ceil(4) as i64], (Kind::Float, Device::Cpu));
            // SAFETY: op(B) = blockᵀ is H × len read from rows start.. of the row-major [V, H]
            // weight (ld = H); the destination holds the bytes MKL asked for; both stay alive.
            unsafe {
                let block = weights.add(start as usize * hidden as usize);
                (mkl.pack)(ROW_MAJOR, B_MATRIX, TRANS, rows, len, hidden, 1.0, block, hidden, packed.data_ptr() as *mut f32);
            }
            blocks.push((start, len, packed));
        }
        Some(PackedHead { blocks, rows, vocab, hidden, scratch: vec![] })
    }

    /// `out[:, start .. start + len] = h · blockᵀ` for block `i` (`ld`: out's row stride).
    fn block_product(&self, i: usize, h: &Tensor, out: *mut f32, ld: i32) {
        let (_, len, packed) = &self.blocks[i];
        let mkl = mkl().and_then(|m| m.packed.as_ref()).expect("packed with MKL");
        assert_eq!(h.size(), [self.rows as i64, self.hidden as i64], "PackedHead: hidden states of another shape");
        // SAFETY: A = h is rows × H row-major (lda = H), B the packed block, C rows × len with
        // row stride ld ≥ len; every buffer is alive and sized for these dimensions.
        unsafe {
            (mkl.compute)(
                ROW_MAJOR,
                NO_TRANS,
                PACKED,
                self.rows,
                *len,
                self.hidden,
                h.data_ptr() as *const f32,
                self.hidden,
                packed.data_ptr() as *const f32,
                self.hidden,
                0.0,
                out,
                ld,
            );
        }
    }

    /// Logits `[rows, V]` of hidden states `[rows, H]`.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        let h = hidden.to_kind(Kind::Float).contiguous();
        let out = Tensor::empty([self.rows as i64, self.vocab as i64], (Kind::Float, Device::Cpu));
        let base = out.data_ptr() as *mut f32;
        for (i, (start, _, _)) in self.blocks.iter().enumerate() {
            // SAFETY: start < V, so the block's columns lie inside out's rows.
            self.block_product(i, &h, unsafe { base.add(*start as usize) }, self.vocab);
        }
        out
    }

    /// The greedy token and its log-probability per row, as `kernels::greedy_rows`
    /// gives them from [`logits`](Self::logits), without materialising those: each
    /// block's logits are scanned while in cache and the rows' maxima and
    /// normalisers combined across blocks. `None` when a row holds a NaN.
    pub fn greedy(&mut self, hidden: &Tensor) -> Option<(Vec<i64>, Vec<f32>)> {
        let h = hidden.to_kind(Kind::Float).contiguous();
        let rows = self.rows as usize;
        let width = self.blocks.first().map_or(0, |b| b.1 as usize);
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(rows * width, 0.0);
        // Per row: the first largest logit so far, where it is, and Σ exp(x − best).
        let mut best = vec![(f32::NEG_INFINITY, 0usize, 0.0f32); rows];
        let mut nan = false;
        for (i, (start, len, _)) in self.blocks.iter().enumerate() {
            let len = *len as usize;
            self.block_product(i, &h, scratch.as_mut_ptr(), len as i32);
            for (r, row) in scratch[..rows * len].chunks_exact(len).enumerate() {
                let Some((at, max)) = crate::kernels::argmax_row(row) else {
                    nan = true;
                    break;
                };
                if max == f32::NEG_INFINITY {
                    continue;
                }
                let sum = crate::kernels::sum_exp_below(row, max);
                let b = &mut best[r];
                if max > b.0 {
                    b.2 = b.2 * (b.0 - max).exp() + sum;
                    *b = (max, *start as usize + at, b.2);
                } else {
                    b.2 += sum * (max - b.0).exp();
                }
            }
            if nan {
                break;
            }
        }
        self.scratch = scratch;
        if nan {
            return None;
        }
        Some(best.iter().map(|&(max, at, sum)| (at as i64, if max == f32::NEG_INFINITY { f32::NAN } else { -sum.ln() })).unzip())
    }
}

/// The output projection of one `generate` call's decode steps: the packed product
/// when its first result is bit-for-bit `linear`'s (so packing never changes what
/// is generated), `linear` otherwise or where packing does not apply.
pub struct DecodeHead<'a> {
    weight: &'a Tensor,
    packed: Option<PackedHead>,
    checked: bool,
}

impl<'a> DecodeHead<'a> {
    /// The head for `rows` sequences (packed only when there are decode steps to reuse it).
    pub fn new(weight: &'a Tensor, rows: i64, steps: usize) -> DecodeHead<'a> {
        DecodeHead { weight, packed: if steps > 1 { PackedHead::new(weight, rows) } else { None }, checked: false }
    }

    /// True while the packed product is in use.
    pub fn is_packed(&self) -> bool {
        self.packed.is_some()
    }

    /// Logits `[rows, V]` of hidden states `[rows, H]`.
    pub fn logits(&mut self, hidden: &Tensor) -> Tensor {
        let Some(packed) = &self.packed else { return hidden.linear::<Tensor>(self.weight, None) };
        let logits = packed.logits(hidden);
        if self.checked {
            return logits;
        }
        self.checked = true;
        let linear = hidden.linear::<Tensor>(self.weight, None);
        if logits.equal(&linear) {
            logits
        } else {
            self.packed = None;
            linear
        }
    }

    /// Greedy tokens and their log-probabilities (`kernels::greedy_rows` of
    /// [`logits`](Self::logits)) without materialising the logits, once the packed
    /// product has passed its check; `None` before that, unpacked, or on a NaN (the
    /// caller takes the logits then).
    pub fn greedy(&mut self, hidden: &Tensor) -> Option<(Vec<i64>, Vec<f32>)> {
        match &mut self.packed {
            Some(packed) if self.checked => packed.greedy(hidden),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packed product equals libtorch's `linear` (the same MKL kernels, without re-packing;
    /// bit for bit at every row count here but 2, which `generate`'s first-step check catches).
    #[test]
    fn packed_head_matches_linear() {
        let w = Tensor::randn([5003, 64], (Kind::Float, Device::Cpu));
        for rows in 2i64..=40 {
            let h = Tensor::randn([rows, 64], (Kind::Float, Device::Cpu));
            let Some(head) = PackedHead::new(&w, rows) else {
                eprintln!("no MKL packed GEMM in this libtorch: nothing to compare");
                return;
            };
            let diff = (head.logits(&h) - h.linear::<Tensor>(&w, None)).abs().max().double_value(&[]);
            assert!(diff < 1e-4, "rows {rows}: packed and linear logits differ by {diff}");
        }
        assert!(PackedHead::new(&w, 1).is_none());
    }

    /// A decode head keeps the packed product only where it is bit-identical to `linear`,
    /// and its logits are `linear`'s either way.
    #[test]
    fn decode_head_never_differs_from_linear() {
        let w = Tensor::randn([5003, 64], (Kind::Float, Device::Cpu));
        for rows in [1i64, 2, 8] {
            let mut head = DecodeHead::new(&w, rows, 4);
            for _ in 0..3 {
                let h = Tensor::randn([rows, 64], (Kind::Float, Device::Cpu));
                assert!(head.logits(&h).equal(&h.linear::<Tensor>(&w, None)), "rows {rows}");
            }
            if rows == 1 {
                assert!(!head.is_packed());
            }
        }
        assert!(!DecodeHead::new(&w, 8, 1).is_packed());
    }

    /// The block-by-block greedy scan gives `greedy_rows`' tokens of the full logits and
    /// log-probs within 1e-5 (both sides sum ~49k float32 terms, in different orders and
    /// blocks; seen up to 1.6e-6 apart),
    /// across block boundaries and ties, and refuses a NaN row.
    #[test]
    fn greedy_scan_matches_greedy_rows_of_the_logits() {
        tch::manual_seed(3);
        let w = Tensor::randn([49_157, 64], (Kind::Float, Device::Cpu)) * 0.3;
        for rows in [2i64, 3, 8, 32] {
            let Some(mut head) = PackedHead::new(&w, rows) else {
                eprintln!("no MKL packed GEMM in this libtorch: nothing to compare");
                return;
            };
            assert!(rows < 8 || head.blocks.len() > 1, "several blocks at {rows} rows");
            for _ in 0..3 {
                let h = Tensor::randn([rows, 64], (Kind::Float, Device::Cpu));
                let (tokens, logprobs) = head.greedy(&h).expect("no NaN");
                let (want_tokens, want_logprobs) = crate::kernels::greedy_rows(&head.logits(&h)).unwrap();
                assert_eq!(tokens, want_tokens, "rows {rows}");
                for (a, b) in logprobs.iter().zip(&want_logprobs) {
                    assert!((a - b).abs() < 1e-5, "rows {rows}: log-prob {a} vs {b}");
                }
            }
            // A block's worth of ties at the maximum: the first one wins across blocks.
            let h = Tensor::zeros([rows, 64], (Kind::Float, Device::Cpu));
            assert_eq!(head.greedy(&h).unwrap().0, vec![0; rows as usize]);
            let nan = Tensor::randn([rows, 64], (Kind::Float, Device::Cpu));
            let _ = nan.get(rows - 1).get(5).fill_(f64::NAN);
            assert!(head.greedy(&nan).is_none());
        }
    }
}
