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
use std::ffi::{c_void, CStr};
use std::sync::OnceLock;
use tch::{Device, Kind, Tensor};

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;
const PACKED: i32 = 151;
const B_MATRIX: i32 = 162;

type GetSize = unsafe extern "C" fn(i32, i32, i32, i32) -> usize;
type Pack = unsafe extern "C" fn(i32, i32, i32, i32, i32, i32, f32, *const f32, i32, *mut f32);
type Compute = unsafe extern "C" fn(i32, i32, i32, i32, i32, i32, *const f32, i32, *const f32, i32, f32, *mut f32, i32);

struct Mkl {
    get_size: GetSize,
    pack: Pack,
    compute: Compute,
}

fn mkl() -> Option<&'static Mkl> {
    static MKL: OnceLock<Option<Mkl>> = OnceLock::new();
    MKL.get_or_init(|| {
        let find = |name: &CStr| -> *mut c_void {
            // SAFETY: dlsym with a NUL-terminated name in the process's global scope (libtorch is linked).
            unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
        };
        let (get_size, pack, compute) = (find(c"cblas_sgemm_pack_get_size"), find(c"cblas_sgemm_pack"), find(c"cblas_sgemm_compute"));
        if get_size.is_null() || pack.is_null() || compute.is_null() {
            return None;
        }
        // SAFETY: MKL's LP64 CBLAS signatures (32-bit MKL_INT, enums as int), as declared above.
        unsafe {
            Some(Mkl {
                get_size: std::mem::transmute::<*mut c_void, GetSize>(get_size),
                pack: std::mem::transmute::<*mut c_void, Pack>(pack),
                compute: std::mem::transmute::<*mut c_void, Compute>(compute),
            })
        }
    })
    .as_ref()
}

/// An output projection `[V, H]` packed for products with `rows × H` inputs.
pub struct PackedHead {
    packed: Tensor,
    rows: i32,
    vocab: i32,
    hidden: i32,
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
        let (rows, vocab, hidden) = (i32::try_from(rows).ok()?, i32::try_from(size[0]).ok()?, i32::try_from(size[1]).ok()?);
        let mkl = mkl()?;
        // SAFETY: valid dimensions; MKL returns the packed buffer's size in bytes.
        let bytes = unsafe { (mkl.get_size)(B_MATRIX, rows, vocab, hidden) };
        let packed = Tensor::empty([bytes.div_ceil(4) as i64], (Kind::Float, Device::Cpu));
        // SAFETY: op(B) = weightᵀ is H × V read from the row-major [V, H] weight (ld = H);
        // the destination holds the bytes MKL asked for; both stay alive for the call.
        unsafe {
            (mkl.pack)(ROW_MAJOR, B_MATRIX, TRANS, rows, vocab, hidden, 1.0, weight.data_ptr() as *const f32, hidden, packed.data_ptr() as *mut f32);
        }
        Some(PackedHead { packed, rows, vocab, hidden })
    }

    /// Logits `[rows, V]` of hidden states `[rows, H]`.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        let h = hidden.to_kind(Kind::Float).contiguous();
        assert_eq!(h.size(), [self.rows as i64, self.hidden as i64], "PackedHead: hidden states of another shape");
        let out = Tensor::empty([self.rows as i64, self.vocab as i64], (Kind::Float, Device::Cpu));
        let mkl = mkl().expect("packed with MKL");
        // SAFETY: A = h is rows × H row-major (lda = H), B the packed weight, C rows × V (ldc = V);
        // every buffer is alive and sized for these dimensions.
        unsafe {
            (mkl.compute)(
                ROW_MAJOR,
                NO_TRANS,
                PACKED,
                self.rows,
                self.vocab,
                self.hidden,
                h.data_ptr() as *const f32,
                self.hidden,
                self.packed.data_ptr() as *const f32,
                self.hidden,
                0.0,
                out.data_ptr() as *mut f32,
                self.vocab,
            );
        }
        out
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
}
