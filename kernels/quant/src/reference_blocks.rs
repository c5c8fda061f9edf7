//! The f64 reference dequantiser: the value every stored weight stands for, computed in f64
//! from the block's fields as `ggml-common.h` documents them (each field read by its own
//! offset and bit position, value index by value index; nothing shared with the f32 codecs).
//! Products are taken in ggml's order, (d·s)·code, so even the sign of a zero is ggml's. Every
//! product here is exact in f64 and exact or rounded once in f32, so the f32 decoders equal
//! this rounded to f32, bit for bit.

use crate::format::WeightFormat;
use crate::iq4nl::KVALUES;
use half::f16;

fn f16_field(b: &[u8], at: usize) -> f64 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f64()
}

/// `width` bits of byte `at` from bit `shift`.
fn field(b: &[u8], at: usize, shift: usize, width: u32) -> i64 {
    ((b[at] >> shift) & ((1u16 << width) - 1) as u8) as i64
}

/// Q4_K/Q5_K's 6-bit scale (`min = false`) or minimum of sub-block j from the 12 bytes at
/// `at`: j < 4 the low 6 bits of byte j (j + 4 for minimums); j ≥ 4 a nibble of byte j + 4
/// (low: scale, high: minimum) below the top 2 bits of byte j − 4 (scale) or j (minimum).
fn k4_field(b: &[u8], at: usize, j: usize, min: bool) -> i64 {
    let q = &b[at..at + 12];
    match (j < 4, min) {
        (true, false) => field(q, j, 0, 6),
        (true, true) => field(q, j + 4, 0, 6),
        (false, false) => field(q, j + 4, 0, 4) | field(q, j - 4, 6, 2) << 4,
        (false, true) => field(q, j + 4, 4, 4) | field(q, j, 6, 2) << 4,
    }
}

/// Value v of one block of `format` (`b` the block's bytes) in f64; `None` for the formats
/// without a ggml block (sym/asym groups have their own `group::block_affine`).
pub fn stored_value(format: WeightFormat, b: &[u8], v: usize) -> Option<f64> {
    use WeightFormat as F;
    let (h, i) = (v / 32, v % 32);
    Some(match format {
        F::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        F::F16 => f16_field(b, 0),
        F::BF16 => f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16) as f64,
        F::Q8_0 => f16_field(b, 0) * b[2 + v] as i8 as f64,
        F::Q4_0 | F::Q4_1 | F::IQ4_NL => {
            let at = if format == F::Q4_1 { 4 } else { 2 };
            let nibble = field(b, at + v % 16, 4 * (v / 16), 4);
            match format {
                F::Q4_0 => f16_field(b, 0) * (nibble - 8) as f64,
                F::Q4_1 => f16_field(b, 0) * nibble as f64 + f16_field(b, 2),
                _ => f16_field(b, 0) * KVALUES[nibble as usize] as f64,
            }
        }
        F::Q5_0 | F::Q5_1 => {
            let at = if format == F::Q5_1 { 4 } else { 2 };
            let code =
                field(b, at + 4 + v % 16, 4 * (v / 16), 4) | field(b, at + v / 8, v % 8, 1) << 4;
            if format == F::Q5_0 {
                f16_field(b, 0) * (code - 16) as f64
            } else {
                f16_field(b, 0) * code as f64 + f16_field(b, 2)
            }
        }
        F::Q2_K => {
            // Sub-block v / 16's scale (low nibble) and minimum (high nibble) in byte v / 16.
            let code = field(b, 16 + 32 * (v / 128) + i, 2 * (h % 4), 2);
            let (s, m) = (field(b, v / 16, 0, 4), field(b, v / 16, 4, 4));
            f16_field(b, 80) * s as f64 * code as f64 - f16_field(b, 82) * m as f64
        }
        F::Q3_K => {
            let j = v / 16;
            let low = if j < 8 {
                field(b, 96 + j, 0, 4)
            } else {
                field(b, 96 + j - 8, 4, 4)
            };
            let s = (low | field(b, 104 + j % 4, 2 * (j / 4), 2) << 4) - 32;
            let code = field(b, 32 + 32 * (v / 128) + i, 2 * (h % 4), 2)
                - if field(b, i, h, 1) == 1 { 0 } else { 4 };
            f16_field(b, 108) * s as f64 * code as f64
        }
        F::Q4_K | F::Q5_K => {
            let j = v / 32;
            let (s, m) = (k4_field(b, 4, j, false), k4_field(b, 4, j, true));
            let (qs, high) = if format == F::Q5_K {
                (48, field(b, 16 + i, j, 1) << 4)
            } else {
                (16, 0)
            };
            let code = field(b, qs + 32 * (v / 64) + i, 4 * (j % 2), 4) + high;
            f16_field(b, 0) * s as f64 * code as f64 - f16_field(b, 2) * m as f64
        }
        F::Q6_K => {
            let k = h % 4;
            let low = field(b, 64 * (v / 128) + 32 * (k % 2) + i, 4 * (k / 2), 4);
            let code = (low | field(b, 128 + 32 * (v / 128) + i, 2 * k, 2) << 4) - 32;
            f16_field(b, 208) * b[192 + v / 16] as i8 as f64 * code as f64
        }
        F::Q8_K => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64 * b[4 + v] as i8 as f64,
        F::Sym { .. } | F::Asym { .. } => return None,
    })
}

/// Every value of a row of `format` (`row` its bytes), in f64.
pub fn stored_row(format: WeightFormat, row: &[u8]) -> Option<Vec<f64>> {
    let (bv, bb) = (format.block_values(), format.block_bytes());
    let mut out = Vec::with_capacity(row.len() / bb * bv);
    for b in row.chunks_exact(bb) {
        for v in 0..bv {
            out.push(stored_value(format, b, v)?);
        }
    }
    Some(out)
}
