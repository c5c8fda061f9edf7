//! A weight matrix in any `WeightFormat`: row-major, each row a run of blocks (layout in
//! `format`). Quantisation runs over rows in parallel and refuses non-finite weights and
//! scales f16 cannot hold; `from_bytes` adopts packed bytes (a GGUF tensor, a case file) after
//! checking their length; decoding is per block with exactly the format's arithmetic.

use crate::codecs::with_codec;
use crate::format::WeightFormat;
use crate::unpack::{self, Codec};
use crate::{ggml, group};
use half::f16;
use kernel_common::{error::Result, KernelError};
use rayon::prelude::*;

/// A quantised (or dense) weight matrix of `rows` × `cols`.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantMatrix {
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    data: Vec<u8>,
}

/// Encodes one block of `format.block_values()` finite values into `out`; `codes` is scratch
/// of the block's length. `Err(s)`: the block needs a scale or value `s` that its f16 (bf16)
/// field cannot hold.
pub fn encode_block(
    format: WeightFormat,
    x: &[f32],
    codes: &mut [u8],
    out: &mut [u8],
) -> std::result::Result<(), f32> {
    if let Some(s) = check_block_range(format, x) {
        return Err(s);
    }
    match format {
        WeightFormat::F32 => out[..4].copy_from_slice(&x[0].to_le_bytes()),
        WeightFormat::F16 => out[..2].copy_from_slice(&f16::from_f32(x[0]).to_bits().to_le_bytes()),
        WeightFormat::BF16 => out[..2].copy_from_slice(&ggml::bf16_bits(x[0]).to_le_bytes()),
        WeightFormat::Q8_0 => ggml::encode_q8_0(x, out),
        WeightFormat::Q4_0 => ggml::encode_q4_0(x, out),
        WeightFormat::Q4_1 => ggml::encode_q4_1(x, out),
        WeightFormat::Sym { .. } | WeightFormat::Asym { .. } => {
            group::encode_group(format, x, codes, out)
        }
        f => return with_codec!(f, C => C::encode(x, out), _ => unreachable!("{f} has a codec")),
    }
    Ok(())
}

/// Decodes one block into `out` (`format.block_values()` values); `codes` is scratch of the
/// same length.
pub fn decode_block(format: WeightFormat, b: &[u8], codes: &mut [u8], out: &mut [f32]) {
    match format {
        WeightFormat::F32 => out[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        WeightFormat::F16 => out[0] = ggml::f16_at(b),
        WeightFormat::BF16 => out[0] = ggml::bf16_at(b),
        WeightFormat::Q8_0 => ggml::decode_q8_0(b, out),
        WeightFormat::Q4_0 => ggml::decode_q4_0(b, out),
        WeightFormat::Q4_1 => ggml::decode_q4_1(b, out),
        WeightFormat::Sym { .. } | WeightFormat::Asym { .. } => {
            group::decode_group(format, b, codes, out)
        }
        f => with_codec!(f, C => unpack::decode::<C>(b, out), _ => unreachable!("{f} has a codec")),
    }
}

/// Why a block of a format without a checking encoder cannot be stored: a scale or value
/// outside f16's (bf16's) range. The codecs of `unpack` check their own scales.
fn check_block_range(format: WeightFormat, x: &[f32]) -> Option<f32> {
    let over = |v: f32| v.abs() > ggml::F16_MAX;
    match format {
        WeightFormat::F16 => over(x[0]).then_some(x[0]),
        WeightFormat::BF16 => ggml::bf16_at(&ggml::bf16_bits(x[0]).to_le_bytes())
            .is_infinite()
            .then_some(x[0]),
        WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
            ggml::block_scales(format, x).into_iter().find(|&s| over(s))
        }
        WeightFormat::Sym { scale, .. } | WeightFormat::Asym { scale, .. } => {
            let s = group::raw_scale(format, x);
            (scale == crate::format::ScaleType::F16 && over(s)).then_some(s)
        }
        _ => None,
    }
}

impl QuantMatrix {
    /// Quantises the row-major `rows` × `cols` matrix `w`.
    pub fn quantize(format: WeightFormat, rows: usize, cols: usize, w: &[f32]) -> Result<Self> {
        format.validate(cols)?;
        if rows == 0 || Some(w.len()) != rows.checked_mul(cols) {
            return Err(KernelError::BadBuffer(format!(
                "weights have {} values, expected {rows} × {cols} (rows ≥ 1)",
                w.len()
            )));
        }
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            return Err(KernelError::BadBuffer(format!(
                "weight ({}, {}) is {}: cannot quantise non-finite values",
                i / cols,
                i % cols,
                w[i]
            )));
        }
        let (bv, bb) = (format.block_values(), format.block_bytes());
        let row_bytes = format.row_bytes(cols);
        let mut data = vec![0u8; rows * row_bytes];
        data.par_chunks_mut(row_bytes)
            .zip(w.par_chunks(cols))
            .enumerate()
            .try_for_each(|(r, (out, x))| {
                let mut codes = vec![0u8; bv];
                for (k, (ob, xb)) in out.chunks_mut(bb).zip(x.chunks(bv)).enumerate() {
                    encode_block(format, xb, &mut codes, ob).map_err(|s| {
                        let limit = if format == WeightFormat::BF16 {
                            "bf16's ±3.39e38"
                        } else {
                            "f16's ±65504"
                        };
                        KernelError::Unsupported(format!(
                            "{format}: row {r} block {k} needs a scale/value of {s:e}, beyond {limit} (use an s32 scale or f32)"
                        ))
                    })?;
                }
                Ok(())
            })?;
        Ok(QuantMatrix {
            format,
            rows,
            cols,
            data,
        })
    }

    /// Adopts packed bytes (a tensor from a GGUF file or a case file).
    pub fn from_bytes(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Result<Self> {
        format.validate(cols)?;
        let want = format.matrix_bytes(rows, cols).ok_or_else(|| {
            KernelError::BadBuffer(format!(
                "{format} {rows}×{cols} overflows the address space"
            ))
        })?;
        if rows == 0 {
            return Err(KernelError::BadBuffer(format!(
                "{format} matrix of 0 rows × {cols}: it needs at least one row"
            )));
        }
        if data.len() != want {
            return Err(KernelError::BadBuffer(format!(
                "{format} {rows}×{cols} needs {want} bytes, got {} ({})",
                data.len(),
                if data.len() < want {
                    "truncated"
                } else {
                    "too long"
                }
            )));
        }
        Ok(QuantMatrix {
            format,
            rows,
            cols,
            data,
        })
    }

    /// The rows of several matrices of one format and width stacked into one (e.g. a layer's
    /// Q, K and V projections, so one product computes all three).
    pub fn stack(parts: &[&QuantMatrix]) -> Result<QuantMatrix> {
        let first = parts
            .first()
            .ok_or_else(|| KernelError::InvalidShape("stack needs at least one matrix".into()))?;
        if let Some(p) = parts
            .iter()
            .find(|p| p.format != first.format || p.cols != first.cols)
        {
            return Err(KernelError::InvalidShape(format!(
                "cannot stack {} × {} {} onto {} × {} {}",
                p.rows, p.cols, p.format, first.rows, first.cols, first.format
            )));
        }
        let data: Vec<u8> = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
        QuantMatrix::from_bytes(
            first.format,
            parts.iter().map(|p| p.rows).sum(),
            first.cols,
            data,
        )
    }

    /// All packed bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// The packed bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.format.row_bytes(self.cols);
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Decodes `cols` values of row `r` starting at column `c0` (a block boundary) into `out`.
    pub fn decode_row_range(&self, r: usize, c0: usize, out: &mut [f32], codes: &mut Vec<u8>) {
        let (bv, bb) = (self.format.block_values(), self.format.block_bytes());
        debug_assert!(c0.is_multiple_of(bv) && out.len().is_multiple_of(bv));
        codes.resize(bv, 0);
        let row = self.row(r);
        match self.format {
            WeightFormat::F32 => {
                for (o, b) in out.iter_mut().zip(row[4 * c0..].chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                return;
            }
            WeightFormat::F16 => {
                use half::slice::HalfFloatSliceExt;
                let halves: Vec<f16> = row[2 * c0..2 * (c0 + out.len())]
                    .chunks_exact(2)
                    .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])))
                    .collect();
                halves.convert_to_f32_slice(out);
                return;
            }
            _ => {}
        }
        let first = c0 / bv;
        for (k, o) in out.chunks_mut(bv).enumerate() {
            let at = (first + k) * bb;
            decode_block(self.format, &row[at..at + bb], codes, o);
        }
    }

    /// The whole matrix as f32 (what every format means; used by the unfused baseline and
    /// the reference).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        out.par_chunks_mut(self.cols)
            .enumerate()
            .for_each(|(r, o)| self.decode_row_range(r, 0, o, &mut Vec::new()));
        out
    }
}

/// How far the dequantised weights are from the originals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantError {
    pub rmse: f64,
    pub max_abs: f64,
    /// 10·log10(Σx² / Σ(x − x̂)²); infinite for an exact round trip.
    pub snr_db: f64,
}

impl QuantError {
    /// Compares `original` with `dequantised` in f64.
    pub fn measure(original: &[f32], dequantised: &[f32]) -> QuantError {
        assert_eq!(original.len(), dequantised.len());
        let (mut e2, mut x2, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
        for (&x, &y) in original.iter().zip(dequantised) {
            let d = (x as f64 - y as f64).abs();
            e2 += d * d;
            x2 += (x as f64) * (x as f64);
            max_abs = max_abs.max(d);
        }
        QuantError {
            rmse: (e2 / original.len().max(1) as f64).sqrt(),
            max_abs,
            snr_db: 10.0 * (x2 / e2).log10(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_weights() {
        let f = WeightFormat::Q4_0;
        let mut w = vec![0.5f32; 64];
        assert!(QuantMatrix::quantize(f, 2, 32, &w).is_ok());
        w[40] = f32::NAN;
        let e = QuantMatrix::quantize(f, 2, 32, &w).unwrap_err().to_string();
        assert!(e.contains("(1, 8)") && e.contains("non-finite"), "{e}");
        w[40] = 1e9;
        let e = QuantMatrix::quantize(f, 2, 32, &w).unwrap_err().to_string();
        assert!(e.contains("65504"), "{e}");
        assert!(
            QuantMatrix::quantize(WeightFormat::parse("sym4g32s32").unwrap(), 2, 32, &w).is_ok()
        );
        assert!(QuantMatrix::quantize(f, 2, 32, &w[..63]).is_err());
        let e = QuantMatrix::from_bytes(f, 2, 32, vec![0; 35])
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
    }

    #[test]
    fn stacking_concatenates_rows() {
        let a = QuantMatrix::quantize(WeightFormat::Q4_0, 2, 64, &[0.25; 128]).unwrap();
        let b = QuantMatrix::quantize(WeightFormat::Q4_0, 3, 64, &[-1.5; 192]).unwrap();
        let s = QuantMatrix::stack(&[&a, &b]).unwrap();
        assert_eq!((s.rows, s.cols), (5, 64));
        assert_eq!(s.row(4), b.row(2));
        assert_eq!(&s.dequantize()[..128], &a.dequantize()[..]);
        let c = QuantMatrix::quantize(WeightFormat::Q8_0, 1, 64, &[1.0; 64]).unwrap();
        assert!(QuantMatrix::stack(&[&a, &c]).is_err());
    }

    #[test]
    fn dense_formats_round_trip() {
        let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
        for f in [WeightFormat::F32, WeightFormat::F16] {
            let m = QuantMatrix::quantize(f, 3, 4, &w).unwrap();
            assert_eq!(m.dequantize(), w);
            let e = QuantError::measure(&w, &m.dequantize());
            assert_eq!(e.rmse, 0.0);
            assert!(e.snr_db.is_infinite());
        }
    }
}
