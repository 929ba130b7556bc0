//! Flat buffers: element types, and the one buffer descriptor both backends take.
//!
//! A [`Buf`] is a pointer, an element count and a [`DType`], plus where the
//! memory lives ([`Memory::Host`] or [`Memory::Cuda`] with the stream to
//! enqueue on). Host buffers are built safely from `&mut [T]`; device
//! buffers from raw pointers (e.g. a tch tensor's `data_ptr()`), which is
//! `unsafe` because the caller vouches for the pointer.

use std::ffi::c_void;
use std::marker::PhantomData;

/// The element type of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DType {
    /// IEEE-754 binary32.
    F32,
    /// IEEE-754 binary64.
    F64,
    /// bfloat16, carried as its 16 raw bits; the CPU ring sums through f32.
    Bf16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
            DType::Bf16 => 2,
        }
    }

    /// Wire code of this type (used in collective headers).
    pub(crate) fn code(self) -> u8 {
        match self {
            DType::F32 => 1,
            DType::F64 => 2,
            DType::Bf16 => 3,
        }
    }

    /// The type with the given wire code, if any.
    pub(crate) fn from_code(code: u8) -> Option<DType> {
        match code {
            1 => Some(DType::F32),
            2 => Some(DType::F64),
            3 => Some(DType::Bf16),
            _ => None,
        }
    }

    /// Lower-case name ("f32", "f64", "bf16").
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(DType::F32),
            "f64" => Ok(DType::F64),
            "bf16" => Ok(DType::Bf16),
            other => Err(format!("unknown dtype {other:?} (expected f32, f64 or bf16)")),
        }
    }
}

/// A bfloat16 value as its raw bits (the upper half of an f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Widens to f32 exactly.
    #[inline]
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }

    /// Rounds an f32 to the nearest bfloat16 (ties to even; NaN stays NaN).
    #[inline]
    pub fn from_f32(x: f32) -> Bf16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return Bf16(((bits >> 16) as u16) | 0x0040);
        }
        let round = 0x7fff + ((bits >> 16) & 1);
        Bf16((bits.wrapping_add(round) >> 16) as u16)
    }

    /// Views raw bf16 bits (e.g. a tch bf16 tensor's storage) as `Bf16`s, without copying.
    pub fn from_bits_mut(bits: &mut [u16]) -> &mut [Bf16] {
        // SAFETY: Bf16 is repr(transparent) over u16.
        unsafe { std::slice::from_raw_parts_mut(bits.as_mut_ptr() as *mut Bf16, bits.len()) }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for super::Bf16 {}
}

/// An element type the collectives can carry: plain data with no invalid bit patterns.
///
/// Sealed: implemented for `f32`, `f64` and [`Bf16`].
pub trait Element: sealed::Sealed + Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// `self + other`, rounded to this type (bf16 adds in f32 and rounds once).
    fn add(self, other: Self) -> Self;
    /// `self / n`, rounded to this type (the mean after a sum).
    fn div(self, n: usize) -> Self;
    /// Converts from f64 (for test patterns and expected values).
    fn from_f64(x: f64) -> Self;
    /// Converts to f64.
    fn to_f64(self) -> f64;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline]
    fn add(self, o: f32) -> f32 {
        self + o
    }
    #[inline]
    fn div(self, n: usize) -> f32 {
        self / n as f32
    }
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Element for f64 {
    const DTYPE: DType = DType::F64;
    #[inline]
    fn add(self, o: f64) -> f64 {
        self + o
    }
    #[inline]
    fn div(self, n: usize) -> f64 {
        self / n as f64
    }
    fn from_f64(x: f64) -> f64 {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
}

impl Element for Bf16 {
    const DTYPE: DType = DType::Bf16;
    #[inline]
    fn add(self, o: Bf16) -> Bf16 {
        Bf16::from_f32(self.to_f32() + o.to_f32())
    }
    #[inline]
    fn div(self, n: usize) -> Bf16 {
        Bf16::from_f32(self.to_f32() / n as f32)
    }
    fn from_f64(x: f64) -> Bf16 {
        Bf16::from_f32(x as f32)
    }
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
}

/// The bytes of a slice of elements (no copy).
pub fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: Element types are plain data without padding.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

/// The bytes of a mutable slice of elements (no copy); every bit pattern is a valid element.
pub fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: Element types are plain data without padding, and every bit
    // pattern is a valid f32 / f64 / Bf16.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s)) }
}

/// Where a buffer's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Ordinary host memory (the CPU ring backend).
    Host,
    /// CUDA device memory; collectives are enqueued on `stream` (a raw
    /// `cudaStream_t`/`CUstream`, null for the legacy default stream).
    Cuda {
        /// The stream to enqueue on, e.g. tch's current stream.
        stream: *mut c_void,
    },
}

impl Memory {
    /// "host" or "cuda".
    pub fn name(&self) -> &'static str {
        match self {
            Memory::Host => "host",
            Memory::Cuda { .. } => "cuda",
        }
    }
}

/// A flat buffer handed to a collective: pointer, element count, dtype, memory kind.
///
/// Collectives work in place on it. The lifetime ties a host buffer to the
/// slice it was built from.
#[derive(Debug)]
pub struct Buf<'a> {
    ptr: *mut c_void,
    len: usize,
    dtype: DType,
    memory: Memory,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> Buf<'a> {
    /// A host buffer over a mutable slice.
    pub fn host<T: Element>(data: &'a mut [T]) -> Buf<'a> {
        Buf {
            ptr: data.as_mut_ptr() as *mut c_void,
            len: data.len(),
            dtype: T::DTYPE,
            memory: Memory::Host,
            _borrow: PhantomData,
        }
    }

    /// A CUDA device buffer of `len` elements of `dtype` at `ptr`, used on `stream`.
    ///
    /// # Safety
    /// `ptr` must point to at least `len * dtype.size()` bytes of device memory
    /// on the communicator's device, valid and not used by other streams until
    /// the collective enqueued on `stream` has completed.
    pub unsafe fn cuda(ptr: *mut c_void, len: usize, dtype: DType, stream: *mut c_void) -> Buf<'static> {
        Buf {
            ptr,
            len,
            dtype,
            memory: Memory::Cuda { stream },
            _borrow: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the memory lives.
    pub fn memory(&self) -> Memory {
        self.memory
    }

    /// Raw start pointer.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len * self.dtype.size()
    }

    /// Elements `start..start + len` of this buffer, borrowed (same memory kind and dtype).
    ///
    /// Panics when the range is outside the buffer.
    pub fn slice(&mut self, start: usize, len: usize) -> Buf<'_> {
        assert!(start.checked_add(len).is_some_and(|end| end <= self.len), "Buf::slice {start}+{len} outside {} elements", self.len);
        Buf {
            // SAFETY: inside the buffer (checked above); the result borrows `self` mutably.
            ptr: unsafe { (self.ptr as *mut u8).add(start * self.dtype.size()) } as *mut c_void,
            len,
            dtype: self.dtype,
            memory: self.memory,
            _borrow: PhantomData,
        }
    }

    /// The host slice behind this buffer, if it is a host buffer of type `T`.
    pub(crate) fn host_slice<T: Element>(&mut self) -> Option<&mut [T]> {
        if self.memory != Memory::Host || self.dtype != T::DTYPE {
            return None;
        }
        if self.len == 0 {
            return Some(&mut []);
        }
        // SAFETY: built by `Buf::host` from a `&'a mut [T]` of this length and type.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.len) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_round_trip_and_rounding() {
        for x in [0.0f32, 1.0, -2.5, 3.0e10, 1.0e-20] {
            let b = Bf16::from_f32(x);
            assert!((b.to_f32() - x).abs() <= x.abs() / 128.0);
        }
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: ties to even gives 1.
        assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        assert_eq!(Bf16::from_f32(3.0).add(Bf16::from_f32(4.0)).to_f32(), 7.0);
    }
}
