//! A typed `Buffer` on the device: its bytes in one `CudaSlice<u8>` (kernels take typed
//! pointers; f16/bf16 travel as their bit patterns), uploaded and downloaded as a whole.

use crate::runtime::CudaRuntime;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use kernel_common::dtype::{Buffer, DType};
use kernel_common::error::Result;

/// A device copy of a `Buffer`.
pub struct DeviceBuffer {
    pub bytes: CudaSlice<u8>,
    pub dtype: DType,
    pub len: usize,
}

/// The little-endian bytes of `buf`.
pub fn buffer_bytes(buf: &Buffer) -> Vec<u8> {
    match buf {
        Buffer::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Buffer::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        Buffer::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
    }
}

/// A `Buffer` of `dtype` from little-endian bytes (the inverse of `buffer_bytes`).
pub fn buffer_from_bytes(dtype: DType, bytes: &[u8]) -> Buffer {
    match dtype {
        DType::F32 => Buffer::F32(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        DType::F16 => Buffer::F16(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        DType::BF16 => Buffer::BF16(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
    }
}

/// f32 values as bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// i32 values as bytes.
pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// f32 values from bytes.
pub fn f32_from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// i32 values from bytes.
pub fn i32_from_bytes(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl DeviceBuffer {
    /// Uploads `buf`.
    pub fn upload(rt: &CudaRuntime, buf: &Buffer) -> Result<DeviceBuffer> {
        Ok(DeviceBuffer {
            bytes: rt.upload(&buffer_bytes(buf))?,
            dtype: buf.dtype(),
            len: buf.len(),
        })
    }

    /// A device buffer of `len` elements of `dtype`, filled with NaN (all-ones bits), so an
    /// element no kernel wrote is caught on download.
    pub fn poisoned(rt: &CudaRuntime, dtype: DType, len: usize) -> Result<DeviceBuffer> {
        let bytes = rt.upload(&vec![0xffu8; (len * dtype.size()).max(1)])?;
        Ok(DeviceBuffer { bytes, dtype, len })
    }

    /// Downloads into a new `Buffer` (synchronises).
    pub fn download(&self, rt: &CudaRuntime) -> Result<Buffer> {
        let bytes = rt.download(&self.bytes)?;
        Ok(buffer_from_bytes(
            self.dtype,
            &bytes[..self.len * self.dtype.size()],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_every_dtype() {
        let values = [1.5f32, -2.25, 0.0, 65504.0, f32::NAN];
        for dt in DType::ALL {
            let b = Buffer::from_f32(dt, &values);
            let back = buffer_from_bytes(dt, &buffer_bytes(&b));
            let (x, y) = (b.to_f32(), back.to_f32());
            for (a, c) in x.iter().zip(&y) {
                assert!(a.to_bits() == c.to_bits() || (a.is_nan() && c.is_nan()));
            }
        }
        assert_eq!(f32_from_bytes(&f32_bytes(&[3.0, -1.0])), vec![3.0, -1.0]);
        assert_eq!(i32_from_bytes(&i32_bytes(&[7, -9])), vec![7, -9]);
    }
}
