//! Storage dtypes (f32, and f16/bf16 via `half`) and `Buffer`, the typed vector every kernel
//! reads and writes. Kernels accumulate in f32 whatever the storage type.

use crate::error::{KernelError, Result};
use half::{bf16, f16};
use std::fmt;

/// Element type of a stored tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    /// All storage dtypes, in the order tables list them.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Parses `f32`, `f16` or `bf16`.
    pub fn parse(text: &str) -> Result<DType> {
        match text {
            "f32" => Ok(DType::F32),
            "f16" => Ok(DType::F16),
            "bf16" => Ok(DType::BF16),
            _ => Err(KernelError::Unsupported(format!(
                "unknown dtype '{text}' (expected f32, f16 or bf16)"
            ))),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        })
    }
}

/// A storage element: converts to and from f32, the accumulation type.
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype tag of this element type.
    const DTYPE: DType;
    /// Widens to f32.
    fn to_f32(self) -> f32;
    /// Rounds an f32 to this type (round to nearest even).
    fn from_f32(x: f32) -> Self;
    /// Widens a slice into an f32 slice of equal length (vectorised where `half` can).
    fn widen_into(src: &[Self], dst: &mut [f32]);
    /// Rounds an f32 slice into this type.
    fn narrow_into(src: &[f32], dst: &mut [Self]);
    /// The slice itself when this type is f32 (lets kernels skip a widening copy).
    fn as_f32(_src: &[Self]) -> Option<&[f32]> {
        None
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline]
    fn widen_into(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline]
    fn narrow_into(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
    #[inline]
    fn as_f32(src: &[Self]) -> Option<&[f32]> {
        Some(src)
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline]
    fn widen_into(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    #[inline]
    fn narrow_into(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    #[inline]
    fn widen_into(src: &[Self], dst: &mut [f32]) {
        // bf16 -> f32 is a 16-bit shift; this loop vectorises.
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
    #[inline]
    fn narrow_into(src: &[f32], dst: &mut [Self]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = bf16::from_f32(*s);
        }
    }
}

/// A flat tensor in one of the storage dtypes.
#[derive(Debug, Clone, PartialEq)]
pub enum Buffer {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

/// Runs `$body` with `$v` bound to the typed vector inside a `Buffer` (shared or mutable).
#[macro_export]
macro_rules! with_buffer {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            $crate::Buffer::F32($v) => $body,
            $crate::Buffer::F16($v) => $body,
            $crate::Buffer::BF16($v) => $body,
        }
    };
}

impl Buffer {
    /// Rounds f32 values into a buffer of `dtype`.
    pub fn from_f32(dtype: DType, values: &[f32]) -> Buffer {
        fn narrow<T: Element>(values: &[f32]) -> Vec<T> {
            let mut out = vec![T::from_f32(0.0); values.len()];
            T::narrow_into(values, &mut out);
            out
        }
        match dtype {
            DType::F32 => Buffer::F32(values.to_vec()),
            DType::F16 => Buffer::F16(narrow(values)),
            DType::BF16 => Buffer::BF16(narrow(values)),
        }
    }

    /// A buffer of `len` NaNs: outputs are poisoned with it so an unwritten element fails.
    pub fn poisoned(dtype: DType, len: usize) -> Buffer {
        Buffer::from_f32(dtype, &vec![f32::NAN; len])
    }

    /// The dtype tag.
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::F32(_) => DType::F32,
            Buffer::F16(_) => DType::F16,
            Buffer::BF16(_) => DType::BF16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_buffer!(self, v => v.len())
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype().size()
    }

    /// Widens every element to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        with_buffer!(self, v => v.iter().map(|x| x.to_f32()).collect())
    }

    /// Widens every element to f64 (the reference's input).
    pub fn to_f64(&self) -> Vec<f64> {
        with_buffer!(self, v => v.iter().map(|x| x.to_f32() as f64).collect())
    }

    /// A copy of elements `start..start + len`.
    pub fn slice(&self, start: usize, len: usize) -> Buffer {
        match self {
            Buffer::F32(v) => Buffer::F32(v[start..start + len].to_vec()),
            Buffer::F16(v) => Buffer::F16(v[start..start + len].to_vec()),
            Buffer::BF16(v) => Buffer::BF16(v[start..start + len].to_vec()),
        }
    }

    /// Fills every element with NaN.
    pub fn poison(&mut self) {
        with_buffer!(self, v => v.iter_mut().for_each(|x| *x = Element::from_f32(f32::NAN)))
    }

    /// Checks that the buffer has `len` elements of `dtype`; `what` names it in the error.
    pub fn expect(&self, what: &str, dtype: DType, len: usize) -> Result<()> {
        if self.dtype() != dtype {
            return Err(KernelError::BadBuffer(format!(
                "{what} is {} but the case is {dtype}",
                self.dtype()
            )));
        }
        if self.len() != len {
            return Err(KernelError::BadBuffer(format!(
                "{what} has {} elements, the shape needs {len}",
                self.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_sizes() {
        for dt in DType::ALL {
            let b = Buffer::from_f32(dt, &[1.0, -2.5, 0.25]);
            assert_eq!(b.dtype(), dt);
            assert_eq!(b.to_f32(), vec![1.0, -2.5, 0.25]);
            assert_eq!(b.bytes(), 3 * dt.size());
            assert_eq!(DType::parse(&dt.to_string()).unwrap(), dt);
        }
        assert!(DType::parse("f8").is_err());
    }

    #[test]
    fn poison_is_nan_in_every_dtype() {
        for dt in DType::ALL {
            let mut b = Buffer::from_f32(dt, &[1.0; 4]);
            b.poison();
            assert!(b.to_f32().iter().all(|x| x.is_nan()));
            assert!(Buffer::poisoned(dt, 2).to_f32().iter().all(|x| x.is_nan()));
        }
    }

    #[test]
    fn widen_matches_scalar_conversion() {
        let xs: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.37).collect();
        let h: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
        let b: Vec<bf16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
        let mut out = vec![0.0; xs.len()];
        f16::widen_into(&h, &mut out);
        assert!(out.iter().zip(&h).all(|(o, x)| *o == x.to_f32()));
        bf16::widen_into(&b, &mut out);
        assert!(out.iter().zip(&b).all(|(o, x)| *o == x.to_f32()));
        assert!(Buffer::F32(vec![0.0; 3])
            .expect("q", DType::F32, 4)
            .is_err());
        assert!(Buffer::F32(vec![0.0; 3])
            .expect("q", DType::F16, 3)
            .is_err());
    }
}
