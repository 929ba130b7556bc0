//! A bucket digest that a GPU computes where the bytes are: WordMix64.
//!
//! XXH3 ([`crate::digest`]) is a sequential hash: fast on one CPU core, but a
//! GPU cannot split one XXH3 stream across its thousands of threads, and copying
//! a CUDA bucket to the host to hash it would cost more than sending it. For
//! CUDA buffers the weight sync therefore uses a digest made for parallel
//! hardware:
//!
//! ```text
//! word j     = bytes 8j..8j+8, little-endian (the last one zero-padded)
//! term j     = fmix64(word_j XOR (j + 1)·K)            (fmix64: MurmurHash3's finaliser, a bijection)
//! sum        = Σ term_j  mod 2^64
//! digest     = fmix64(sum XOR fmix64(len XOR L))
//! ```
//!
//! Each word is mixed with its own position-derived key by a bijective mixer,
//! so every change of one word changes its term, and a change of several
//! words cancels only by a 64-bit coincidence: unlike a plain weighted sum,
//! flipping the top bit of two words, or swapping two words, does not cancel.
//! The sum is a modular addition, associative and commutative, so the result
//! is the same bit for bit whatever order the threads add in: on the CPU
//! reference here, in the CUDA kernel ([`KERNEL_SOURCE`], one pass over the
//! bucket, one atomic add per thread block), over pieces hashed separately
//! ([`word_mix_sum`] takes the piece's first word index), on any GPU.
//! It detects corruption in transit, like XXH3; neither is a MAC (frames on
//! the data plane carry BLAKE3 MACs for that).
//!
//! On the CPU it is slow (three 64-bit multiplies per 8 bytes: 5 GB/s in
//! the project's x86-64 build, 34 GB/s compiled for AVX-512, where XXH3 runs
//! at 53 GB/s on a 2-core Zen 4), so host buffers keep XXH3; this reference
//! exists for tests and for a host that checks a device's digest. On the GPU the
//! kernel is compiled at run time with NVRTC (loaded like the driver, with
//! `dlopen`: PyTorch's wheels ship `libnvrtc.so.12`), so the crate builds and
//! its CPU paths run on machines without CUDA. `comm/tests/nccl_gpu.rs`
//! checks the kernel against this reference and times it (`scripts/gpu-check.sh`).
use std::ffi::{c_void, CString};

use cudarc::driver::{result as cu, sys as cusys};

use crate::error::{CommError, Result};

/// The key multiplier: word `j` is keyed with `(j + 1)·K` (the golden-ratio constant).
pub const KEY: u64 = 0x9E37_79B9_7F4A_7C15;
/// Mixed into the length before it meets the sum.
pub const LEN_KEY: u64 = 0xD6E8_FEB8_6659_FD93;

/// MurmurHash3's 64-bit finaliser (a bijection on u64).
#[inline(always)]
pub fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

#[inline(always)]
fn term(j: u64, word: u64) -> u64 {
    fmix64(word ^ j.wrapping_add(1).wrapping_mul(KEY))
}

/// The partial sum of a piece of a buffer whose first byte is word
/// `first_word` of the whole (pieces other than the last must be a multiple
/// of 8 bytes long). Sums of pieces add up (wrapping) to the whole's sum.
pub fn word_mix_sum(bytes: &[u8], first_word: u64) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut sum = 0u64;
    let mut j = first_word;
    for w in &mut words {
        sum = sum.wrapping_add(term(j, u64::from_le_bytes(w.try_into().expect("8 bytes"))));
        j += 1;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut last = [0u8; 8];
        last[..tail.len()].copy_from_slice(tail);
        sum = sum.wrapping_add(term(j, u64::from_le_bytes(last)));
    }
    sum
}

/// The digest of a buffer of `len` bytes from its (whole) sum.
pub fn word_mix_finish(sum: u64, len: u64) -> u64 {
    fmix64(sum ^ fmix64(len ^ LEN_KEY))
}

/// WordMix64 of `bytes`: what [`DeviceDigest::digest`] computes on a GPU.
pub fn word_mix_digest(bytes: &[u8]) -> u64 {
    word_mix_finish(word_mix_sum(bytes, 0), bytes.len() as u64)
}

/// The CUDA kernel: a grid-stride pass over the full words, the tail word
/// assembled by one thread, a warp-shuffle and shared-memory reduction per
/// block, and one 64-bit atomic add per block into `*out` (zeroed first).
pub const KERNEL_SOURCE: &str = r#"
__device__ __forceinline__ unsigned long long rlmesh_fmix64(unsigned long long x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}
__device__ __forceinline__ unsigned long long rlmesh_warp_sum(unsigned long long s) {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    return s;
}
extern "C" __global__ void rlmesh_word_mix_sum(const unsigned long long* __restrict__ words,
                                               unsigned long long full_words,
                                               unsigned int tail_len,
                                               unsigned long long first_word,
                                               unsigned long long* __restrict__ out) {
    unsigned long long s = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long j = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; j < full_words; j += stride) {
        s += rlmesh_fmix64(__ldg(words + j) ^ ((first_word + j + 1ULL) * 0x9E3779B97F4A7C15ULL));
    }
    if (tail_len > 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        const unsigned char* t = (const unsigned char*)(words + full_words);
        unsigned long long w = 0;
        for (unsigned int i = 0; i < tail_len; ++i) w |= ((unsigned long long)t[i]) << (8 * i);
        s += rlmesh_fmix64(w ^ ((first_word + full_words + 1ULL) * 0x9E3779B97F4A7C15ULL));
    }
    __shared__ unsigned long long part[32];
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    s = rlmesh_warp_sum(s);
    if (lane == 0) part[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < (blockDim.x >> 5) ? part[lane] : 0ULL;
        s = rlmesh_warp_sum(s);
        if (lane == 0) atomicAdd(out, s);
    }
}
"#;

const KERNEL_NAME: &str = "rlmesh_word_mix_sum";
const THREADS: u32 = 256;
const MAX_BLOCKS: u64 = 2048;

fn cuda(call: &'static str) -> impl Fn(cu::DriverError) -> CommError {
    move |e| CommError::Cuda { call, detail: format!("{e:?}") }
}

/// The WordMix64 kernel loaded on one device, with an 8-byte result slot.
///
/// Like [`crate::NcclComm`] it is bound to the thread that owns the device
/// (it makes the primary context current there) and is not `Send`.
pub struct DeviceDigest {
    device: cusys::CUdevice,
    module: cusys::CUmodule,
    func: cusys::CUfunction,
    out: cusys::CUdeviceptr,
    _not_send: std::marker::PhantomData<*mut ()>,
}

impl std::fmt::Debug for DeviceDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceDigest").field("device", &self.device).finish()
    }
}

impl DeviceDigest {
    /// Compiles the kernel with NVRTC and loads it on CUDA device `device`.
    /// Errors, never panics, when the driver or NVRTC is missing.
    pub fn new(device: usize) -> Result<DeviceDigest> {
        // SAFETY: these only try to dlopen the candidate names.
        if !unsafe { cusys::is_culib_present() } {
            return Err(CommError::CudaUnavailable("the CUDA driver library was not found; is an NVIDIA driver installed?".into()));
        }
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CommError::CudaUnavailable(format!(
                "libnvrtc was not found (searched {:?}); PyTorch's CUDA wheels ship it in nvidia/cuda_nvrtc/lib: add that folder to LD_LIBRARY_PATH",
                cudarc::get_lib_name_candidates("nvrtc")
            )));
        }
        crate::nccl::catch_loader_panic("loading the digest kernel", CommError::CudaUnavailable, || {
            cu::init().map_err(|e| CommError::CudaUnavailable(format!("cuInit failed: {e:?} (no usable GPU?)")))?;
            let ptx = cudarc::nvrtc::compile_ptx(KERNEL_SOURCE).map_err(|e| CommError::Cuda { call: "nvrtcCompileProgram", detail: format!("{e:?}") })?;
            let image = CString::new(ptx.to_src()).map_err(|_| CommError::Cuda { call: "nvrtcGetPTX", detail: "PTX holds a NUL byte".into() })?;
            let dev = cu::device::get(device as i32).map_err(cuda("cuDeviceGet"))?;
            // SAFETY: `dev` came from cuDeviceGet; the retained primary context is released in Drop.
            let ctx = unsafe { cu::primary_ctx::retain(dev) }.map_err(cuda("cuDevicePrimaryCtxRetain"))?;
            unsafe { cu::ctx::set_current(ctx) }.map_err(cuda("cuCtxSetCurrent"))?;
            // SAFETY: a NUL-terminated PTX image; the module is unloaded in Drop.
            let module = unsafe { cu::module::load_data(image.as_ptr() as *const c_void) }.map_err(cuda("cuModuleLoadData"))?;
            let name = CString::new(KERNEL_NAME).expect("no NUL");
            let func = unsafe { cu::module::get_function(module, name) }.map_err(cuda("cuModuleGetFunction"))?;
            let out = unsafe { cu::malloc_sync(8) }.map_err(cuda("cuMemAlloc"))?;
            Ok(DeviceDigest { device: dev, module, func, out, _not_send: std::marker::PhantomData })
        })
    }

    /// Enqueues the sum of `len` bytes at device pointer `ptr` (word
    /// `first_word` of its buffer) on `stream`, into the result slot; returns
    /// at once. [`DeviceDigest::read_sum`] waits for it.
    ///
    /// # Safety
    /// `ptr` must point to `len` readable bytes on this device, 8-byte
    /// aligned, not written by other streams until the kernel has finished.
    pub unsafe fn enqueue_sum(&mut self, ptr: u64, len: usize, first_word: u64, stream: *mut c_void) -> Result<()> {
        if ptr % 8 != 0 {
            return Err(CommError::InvalidArgument { rank: 0, op: "device digest", reason: format!("device pointer {ptr:#x} is not 8-byte aligned") });
        }
        let stream = stream as cusys::CUstream;
        let (mut words, mut tail, mut first) = ((len / 8) as u64, (len % 8) as u32, first_word);
        let mut p = ptr;
        let mut o = self.out;
        let blocks = words.div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS) as u32;
        crate::nccl::catch_loader_panic("the digest kernel", CommError::CudaUnavailable, || {
            // SAFETY: the result slot is 8 bytes of this device's memory.
            unsafe { cu::memset_d8_async(self.out, 0, 8, stream) }.map_err(cuda("cuMemsetD8Async"))?;
            let mut params: [*mut c_void; 5] = [
                &mut p as *mut u64 as *mut c_void,
                &mut words as *mut u64 as *mut c_void,
                &mut tail as *mut u32 as *mut c_void,
                &mut first as *mut u64 as *mut c_void,
                &mut o as *mut u64 as *mut c_void,
            ];
            // SAFETY: the kernel's five parameters, in order; the caller vouches for `ptr` and `len`.
            unsafe { cu::launch_kernel(self.func, (blocks, 1, 1), (THREADS, 1, 1), 0, stream, &mut params) }.map_err(cuda("cuLaunchKernel"))
        })
    }

    /// Waits for `stream` and reads the sum enqueued last.
    pub fn read_sum(&mut self, stream: *mut c_void) -> Result<u64> {
        let mut host = [0u64; 1];
        crate::nccl::catch_loader_panic("reading the digest", CommError::CudaUnavailable, || {
            // SAFETY: the result slot is 8 bytes of this device's memory.
            unsafe { cu::memcpy_dtoh_async(&mut host, self.out, stream as cusys::CUstream) }.map_err(cuda("cuMemcpyDtoHAsync"))?;
            unsafe { cu::stream::synchronize(stream as cusys::CUstream) }.map_err(cuda("cuStreamSynchronize"))
        })?;
        Ok(host[0])
    }

    /// WordMix64 of `len` bytes at device pointer `ptr`, computed on `stream`
    /// (equal to [`word_mix_digest`] of the same bytes on the host).
    ///
    /// # Safety
    /// As for [`DeviceDigest::enqueue_sum`].
    pub unsafe fn digest(&mut self, ptr: u64, len: usize, stream: *mut c_void) -> Result<u64> {
        unsafe { self.enqueue_sum(ptr, len, 0, stream)? };
        Ok(word_mix_finish(self.read_sum(stream)?, len as u64))
    }
}

impl Drop for DeviceDigest {
    fn drop(&mut self) {
        // SAFETY: exactly what `new` allocated, loaded and retained.
        let _ = crate::nccl::catch_loader_panic("releasing the digest kernel", CommError::CudaUnavailable, || unsafe {
            let _ = cu::free_sync(self.out);
            let _ = cu::module::unload(self.module);
            let _ = cu::primary_ctx::release(self.device);
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn matches_an_independent_python_implementation() {
        // tests/oracle/word_mix_oracle.py implements the definition from the
        // module docs with Python's unbounded integers.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let lens = [0usize, 1, 7, 8, 9, 15, 16, 63, 64, 65, 1000, 4093];
        let mut input = String::new();
        let mut ours = Vec::new();
        for (i, &n) in lens.iter().enumerate() {
            let b = bytes(n, i as u64 + 1);
            input.push_str(&b.iter().map(|x| format!("{x:02x}")).collect::<String>());
            input.push('\n');
            ours.push(format!("{:016x}", word_mix_digest(&b)));
        }
        let mut child = std::process::Command::new("python3")
            .arg(root.join("tests/oracle/word_mix_oracle.py"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs (the project's set-up requires Python 3.11)");
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "oracle failed: {out:?}");
        let theirs: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn pieces_add_up_to_the_whole() {
        let b = bytes(10_001, 7);
        let whole = word_mix_sum(&b, 0);
        for cut in [0usize, 8, 64, 4096, 9_992, 10_000] {
            let s = word_mix_sum(&b[..cut], 0).wrapping_add(word_mix_sum(&b[cut..], (cut / 8) as u64));
            assert_eq!(s, whole, "cut at {cut}");
        }
        // Three pieces, summed in another order.
        let (a, c) = (word_mix_sum(&b[..800], 0), word_mix_sum(&b[800..1600], 100));
        assert_eq!(word_mix_sum(&b[1600..], 200).wrapping_add(a).wrapping_add(c), whole);
    }

    #[test]
    fn every_single_bit_flip_and_length_change_is_caught() {
        let mut b = bytes(4096 + 5, 3);
        let d = word_mix_digest(&b);
        for bit in 0..b.len() * 8 {
            b[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(word_mix_digest(&b), d, "flip of bit {bit}");
            b[bit / 8] ^= 1 << (bit % 8);
        }
        let mut longer = b.clone();
        longer.push(0);
        assert_ne!(word_mix_digest(&longer), d, "a trailing zero byte changes the length");
        assert_ne!(word_mix_digest(&b[..b.len() - 1]), d);
    }

    #[test]
    fn structured_multi_word_changes_do_not_cancel() {
        // The patterns a weighted sum Σ k_j·w_j misses: top bits flipped in two
        // words (2^63·(k_a + k_b) ≡ 0 for odd keys), and words swapped.
        let b = bytes(64 * 8, 11);
        let d = word_mix_digest(&b);
        let mut seen = std::collections::HashSet::new();
        seen.insert(d);
        for a in 0..64 {
            for c in a + 1..64 {
                let mut t = b.clone();
                t[a * 8 + 7] ^= 0x80;
                t[c * 8 + 7] ^= 0x80;
                assert!(seen.insert(word_mix_digest(&t)), "top bits of words {a} and {c}");
                let mut s = b.clone();
                for k in 0..8 {
                    s.swap(a * 8 + k, c * 8 + k);
                }
                if s != b {
                    assert!(seen.insert(word_mix_digest(&s)), "swap of words {a} and {c}");
                }
            }
        }
    }

    #[test]
    fn the_kernel_source_is_well_formed_cxx() {
        // NVRTC compiles KERNEL_SOURCE only on a GPU machine; a host C++
        // compiler checks its syntax and types here, with the CUDA built-ins declared.
        const PRELUDE: &str = "#define __global__\n#define __device__\n#define __forceinline__ inline\n#define __restrict__\n\
            struct dim3 { unsigned int x, y, z; }; extern dim3 gridDim, blockDim, blockIdx, threadIdx;\n\
            unsigned long long __shfl_down_sync(unsigned int, unsigned long long, int);\n\
            unsigned long long atomicAdd(unsigned long long*, unsigned long long);\n\
            unsigned long long __ldg(const unsigned long long*); void __syncthreads();\n#define __shared__ static\n";
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kernel.cpp");
        std::fs::write(&file, format!("{PRELUDE}{KERNEL_SOURCE}")).unwrap();
        let out = match std::process::Command::new("g++").args(["-fsyntax-only", "-Wall", "-Werror"]).arg(&file).output() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("SKIPPED: no g++ here ({e})");
                return;
            }
        };
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(KERNEL_SOURCE.contains(&format!("void {KERNEL_NAME}(")), "the launched name is the kernel's");
    }

    #[test]
    fn without_a_gpu_the_device_digest_is_an_error_not_a_panic() {
        if unsafe { cusys::is_culib_present() } {
            eprintln!("SKIPPED: a CUDA driver is present here; comm/tests/nccl_gpu.rs covers the kernel");
            return;
        }
        let e = DeviceDigest::new(0).unwrap_err();
        assert!(matches!(e, CommError::CudaUnavailable(_)), "{e}");
    }
}
