//! MKL's BLAS entry points, looked up at run time in the linked libtorch.
//!
//! `libtorch_cpu.so` (PyTorch's x86-64 wheels) carries MKL and exports its
//! Fortran `sgemm_` and the CBLAS packed-GEMM functions. They are found with
//! `dlsym`, so a libtorch built without MKL (another BLAS, another CPU) simply
//! leaves the callers on their libtorch paths.
use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

pub(crate) const ROW_MAJOR: i32 = 101;
pub(crate) const NO_TRANS: i32 = 111;
pub(crate) const TRANS: i32 = 112;
pub(crate) const PACKED: i32 = 151;
pub(crate) const B_MATRIX: i32 = 162;

pub(crate) type GetSize = unsafe extern "C" fn(i32, i32, i32, i32) -> usize;
pub(crate) type Pack = unsafe extern "C" fn(i32, i32, i32, i32, i32, i32, f32, *const f32, i32, *mut f32);
pub(crate) type Compute = unsafe extern "C" fn(i32, i32, i32, i32, i32, i32, *const f32, i32, *const f32, i32, f32, *mut f32, i32);
/// Fortran `sgemm_(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)`, LP64.
pub(crate) type Sgemm = unsafe extern "C" fn(
    *const c_char,
    *const c_char,
    *const i32,
    *const i32,
    *const i32,
    *const f32,
    *const f32,
    *const i32,
    *const f32,
    *const i32,
    *const f32,
    *mut f32,
    *const i32,
);

/// The packed-GEMM trio.
pub(crate) struct PackedGemm {
    pub get_size: GetSize,
    pub pack: Pack,
    pub compute: Compute,
}

/// What this process's libtorch exports.
pub(crate) struct Mkl {
    pub packed: Option<PackedGemm>,
    pub sgemm: Option<Sgemm>,
}

fn find(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with a NUL-terminated name in the process's global scope (libtorch is linked).
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// MKL's functions, or `None` when none is exported.
pub(crate) fn mkl() -> Option<&'static Mkl> {
    static MKL: OnceLock<Option<Mkl>> = OnceLock::new();
    MKL.get_or_init(|| {
        let (get_size, pack, compute, sgemm) = (find(c"cblas_sgemm_pack_get_size"), find(c"cblas_sgemm_pack"), find(c"cblas_sgemm_compute"), find(c"sgemm_"));
        // SAFETY: MKL's LP64 signatures (32-bit MKL_INT, enums as int), as declared above.
        let packed = (!get_size.is_null() && !pack.is_null() && !compute.is_null()).then(|| unsafe {
            PackedGemm {
                get_size: std::mem::transmute::<*mut c_void, GetSize>(get_size),
                pack: std::mem::transmute::<*mut c_void, Pack>(pack),
                compute: std::mem::transmute::<*mut c_void, Compute>(compute),
            }
        });
        // SAFETY: as above.
        let sgemm = (!sgemm.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, Sgemm>(sgemm) });
        (packed.is_some() || sgemm.is_some()).then_some(Mkl { packed, sgemm })
    })
    .as_ref()
}

/// `y[m, n] = x[m, k] · w[n, k]ᵀ (+ y when accumulate)`, all row-major, through
/// `sgemm_` with the arguments libtorch's `addmm` passes for `linear`
/// (column-major `yᵀ = w · xᵀ`), so the products are MKL's same kernels.
///
/// # Safety
/// `x`, `w` and `y` hold at least `m·k`, `n·k` and `m·n` floats; `y` does not overlap them.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn linear_rows(sgemm: Sgemm, x: *const f32, w: *const f32, y: *mut f32, m: usize, n: usize, k: usize, accumulate: bool) {
    let (m, n, k) = (m as i32, n as i32, k as i32);
    let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
    let (t, nt) = (b't' as c_char, b'n' as c_char);
    // SAFETY: the caller's sizes; every pointer argument is valid for the call.
    unsafe { sgemm(&t, &nt, &n, &m, &k, &alpha, w, &k, x, &k, &beta, y, &n) };
}
