//! ggml's 32-value blocks Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 and the bf16 conversion, byte for
//! byte as llama.cpp's `quantize_row_q*_ref` / `GGML_FP32_TO_BF16` in `ggml-quants.c` /
//! `ggml-impl.h` and the `gguf` Python package's `gguf.quants` write them: the same f32
//! operations in the same order (no fused multiply-add), f16 stored round-to-nearest-even.
//! Decoders follow `dequantize_row_q*`. Test vectors written by `gguf.quants` and by
//! `llama-quantize` are replayed in `tests/ggml_vectors.rs` and `tests/llama_vectors.rs`.

use crate::codec_kernels::prims::Prims;
use crate::format::WeightFormat;
use crate::unpack::{Codec, Unpacked};
use half::f16;

/// f32 → f16 bits (round to nearest even, as numpy's astype and GGML_FP32_TO_FP16).
fn f16_bits(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

/// f16 little-endian bytes → f32.
pub fn f16_at(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// f16 bits → f32, branch-free: ggml's `ggml_compute_fp16_to_fp32` (exact for every f16;
/// NaNs stay NaN). The codecs' unpacking calls it inside every tier's kernels, where `half`'s
/// conversion (a run-time feature check and a call) cost a spill of the vector registers per
/// block.
#[inline(always)]
pub fn fp16_to_fp32(h: u16) -> f32 {
    let w = (h as u32) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);
    let normalized =
        f32::from_bits((two_w >> 4).wrapping_add(0xE0 << 23)) * f32::from_bits(0x0780_0000);
    let denormalized = f32::from_bits((two_w >> 17) | (126 << 23)) - 0.5;
    let bits = if two_w < 1 << 27 {
        denormalized.to_bits()
    } else {
        normalized.to_bits()
    };
    f32::from_bits(sign | bits)
}

/// The f16 at `b[0..2]` (little-endian), by `fp16_to_fp32`.
#[inline(always)]
pub fn f16_le(b: &[u8]) -> f32 {
    fp16_to_fp32(u16::from_le_bytes([b[0], b[1]]))
}

/// Largest |d| that f16 stores finitely; a larger scale is refused rather than stored as inf.
pub const F16_MAX: f32 = 65504.0;

/// Stores `v` as f16 in `out[..2]`; `Err(v)` when f16 cannot hold it (|v| > 65504, NaN).
pub fn put_f16(v: f32, out: &mut [u8]) -> Result<(), f32> {
    if v.is_nan() || v.abs() > F16_MAX {
        return Err(v);
    }
    out[..2].copy_from_slice(&f16_bits(v));
    Ok(())
}

/// f32 → bf16 bits as `GGML_FP32_TO_BF16`: round to nearest even, NaN made quiet.
pub fn bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// bf16 little-endian bytes → f32 (the bits shifted up, exact).
pub fn bf16_at(b: &[u8]) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
}

/// One Q8_0 block: d = max|x| / 127, q = roundf(x / d) as i8 (34 bytes).
pub fn encode_q8_0(x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16_bits(d));
    for (o, &v) in out[2..34].iter_mut().zip(x) {
        *o = ((v * id).round() as i8) as u8;
    }
}

/// Q8_0 block → 32 values (q · d).
pub fn decode_q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b);
    for (o, &q) in out[..32].iter_mut().zip(&b[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}

/// One Q4_0 block: m = the value of largest magnitude (signed, first one on ties),
/// d = m / −8, q = min(15, trunc(x / d + 8.5)); byte j = q[j] | q[j + 16] << 4 (18 bytes).
pub fn encode_q4_0(x: &[f32], out: &mut [u8]) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in &x[..32] {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16_bits(d));
    let code = |v: f32| ((v * id + 8.5) as u8).min(15);
    for j in 0..16 {
        out[2 + j] = code(x[j]) | (code(x[j + 16]) << 4);
    }
}

/// Q4_0 block → 32 values ((q − 8) · d).
pub fn decode_q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b);
    for j in 0..16 {
        let byte = b[2 + j];
        out[j] = ((byte & 0x0F) as i32 - 8) as f32 * d;
        out[j + 16] = ((byte >> 4) as i32 - 8) as f32 * d;
    }
}

/// One Q4_1 block: d = (max − min) / 15, m = min, q = min(15, trunc((x − min) / d + 0.5));
/// nibbles as Q4_0 (20 bytes).
pub fn encode_q4_1(x: &[f32], out: &mut [u8]) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in &x[..32] {
        min = min.min(v);
        max = max.max(v);
    }
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16_bits(d));
    out[2..4].copy_from_slice(&f16_bits(min));
    let code = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
    for j in 0..16 {
        out[4 + j] = code(x[j]) | (code(x[j + 16]) << 4);
    }
}

/// Q4_1 block → 32 values (q · d + m).
pub fn decode_q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b), f16_at(&b[2..]));
    for j in 0..16 {
        let byte = b[4 + j];
        out[j] = (byte & 0x0F) as f32 * d + m;
        out[j + 16] = (byte >> 4) as f32 * d + m;
    }
}

/// The 5th bits of Q5 codes: bit j of the little-endian word is code j's, as `qh`.
fn fifth_bits(codes: &[u8; 32]) -> [u8; 4] {
    let mut qh = 0u32;
    for (j, &c) in codes.iter().enumerate() {
        qh |= ((c as u32 & 0x10) >> 4) << j;
    }
    qh.to_le_bytes()
}

/// Codes j and j + 16 in the nibbles of byte j, the 5th bits in `qh`.
pub(crate) fn put_q5(codes: &[u8; 32], out: &mut [u8]) {
    out[..4].copy_from_slice(&fifth_bits(codes));
    for j in 0..16 {
        out[4 + j] = (codes[j] & 0x0F) | ((codes[j + 16] & 0x0F) << 4);
    }
}

/// The 32 5-bit codes of `qh` (4 bytes) + 16 nibble bytes, less `offset`: code j is nibble
/// j of the 16 bytes (low nibbles first) with bit j of the little-endian `qh` as its 5th bit
/// (`dequantize_row_q5_*`'s `xh_0 = ((qh >> j) << 4) & 0x10`, `xh_1 = (qh >> (j + 12)) &
/// 0x10`). Written bytewise — a bit test per code against a constant mask — so it vectorises
/// on every tier (u64 arithmetic over the codes did not: LLVM rebuilt the bytes one by one).
#[inline(always)]
fn q5_codes(b: &[u8], offset: i8, q: &mut [i8]) {
    let mut high = [0u8; 32];
    for (j, h) in high.iter_mut().enumerate() {
        *h = if b[j / 8] & (1 << (j % 8)) != 0 {
            0x10
        } else {
            0
        };
    }
    let qs = &b[4..20];
    for j in 0..16 {
        q[j] = ((qs[j] & 0x0F) | high[j]) as i8 - offset;
        q[j + 16] = ((qs[j] >> 4) | high[j + 16]) as i8 - offset;
    }
}

/// Q5_0 (`quantize_row_q5_0_ref`): m = the value of largest magnitude (first on ties),
/// d = m / −16, code = min(31, trunc(x / d + 16.5)), value = (code − 16)·d (22 bytes).
pub struct Q50;

impl Codec for Q50 {
    const FORMAT: WeightFormat = WeightFormat::Q5_0;
    const HAS_B: bool = false;

    fn encode(x: &[f32], out: &mut [u8]) -> Result<(), f32> {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in &x[..32] {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(d, out)?;
        let mut codes = [0u8; 32];
        for (c, &v) in codes.iter_mut().zip(x) {
            *c = ((v * id + 16.5) as i8).min(31) as u8;
        }
        put_q5(&codes, &mut out[2..]);
        Ok(())
    }

    #[inline(always)]
    fn unpack<P: Prims>(b: &[u8], u: &mut Unpacked) {
        u.d = f16_le(b);
        u.sc[..2].fill(1);
        q5_codes(&b[2..22], 16, &mut u.q[..32]);
    }
}

/// Q5_1 (`quantize_row_q5_1_ref`): d = (max − min) / 31, m = min,
/// code = trunc((x − min) / d + 0.5), value = code·d + m (24 bytes).
pub struct Q51;

impl Codec for Q51 {
    const FORMAT: WeightFormat = WeightFormat::Q5_1;
    const HAS_B: bool = true;

    fn encode(x: &[f32], out: &mut [u8]) -> Result<(), f32> {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in &x[..32] {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(d, out)?;
        put_f16(min, &mut out[2..])?;
        let mut codes = [0u8; 32];
        for (c, &v) in codes.iter_mut().zip(x) {
            *c = ((v - min) * id + 0.5) as u8;
        }
        put_q5(&codes, &mut out[4..]);
        Ok(())
    }

    #[inline(always)]
    fn unpack<P: Prims>(b: &[u8], u: &mut Unpacked) {
        // value = d·q + m = a·q + b with sc = 1, dmin = −m, mn = 1.
        (u.d, u.dmin) = (f16_le(b), -f16_le(&b[2..]));
        u.sc[..2].fill(1);
        u.mn[..2].fill(1);
        q5_codes(&b[4..24], 0, &mut u.q[..32]);
    }
}

/// The f16 scale(s) a block of `x` would store, for the overflow check before encoding.
pub fn block_scales(format: crate::WeightFormat, x: &[f32]) -> [f32; 2] {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    match format {
        crate::WeightFormat::Q8_0 => [amax / 127.0, 0.0],
        crate::WeightFormat::Q4_0 => [amax / 8.0, 0.0],
        _ => {
            let (min, max) = x
                .iter()
                .fold((f32::MAX, -f32::MAX), |(a, b), &v| (a.min(v), b.max(v)));
            [(max - min) / 15.0, min]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_q4_0_block() {
        // Largest magnitude −4 → d = 0.5; x = −4 → trunc(−8 + 8.5) = 0, x = 3.5 → 15.
        let mut x = [0.0f32; 32];
        x[0] = -4.0;
        x[1] = 3.5;
        x[16] = 1.0;
        let mut b = [0u8; 18];
        encode_q4_0(&x, &mut b);
        assert_eq!(f16_at(&b), 0.5);
        assert_eq!(b[2], 10 << 4); // q[0] = 0 (low nibble), q[16] = trunc(2 + 8.5) = 10
        assert_eq!(b[3] & 0x0F, 15);
        let mut y = [0.0f32; 32];
        decode_q4_0(&b, &mut y);
        assert_eq!((y[0], y[1], y[16], y[2]), (-4.0, 3.5, 1.0, 0.0));
    }

    #[test]
    fn zero_blocks_decode_to_zero() {
        let x = [0.0f32; 32];
        let mut y = [1.0f32; 32];
        let mut b8 = [0u8; 34];
        encode_q8_0(&x, &mut b8);
        decode_q8_0(&b8, &mut y);
        assert!(y.iter().all(|v| *v == 0.0));
        let mut b = [0u8; 20];
        encode_q4_1(&[2.5f32; 32], &mut b);
        decode_q4_1(&b, &mut y);
        assert!(y.iter().all(|v| *v == 2.5), "{y:?}");
    }

    #[test]
    fn hand_computed_q5_blocks() {
        // Largest magnitude −8 → d = 0.5; x = −8 → code 0, 7.5 → 31, 1 → 18 (5th bit set).
        let mut x = [0.0f32; 32];
        x[0] = -8.0;
        x[1] = 7.5;
        x[17] = 1.0;
        let mut b = [0u8; 22];
        Q50::encode(&x, &mut b).unwrap();
        assert_eq!(f16_at(&b), 0.5);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        assert_eq!(qh & 0b11, 0b10); // code 0 has no 5th bit, code 31 has
        assert_eq!(qh >> 17 & 1, 1); // code 18 of value 17
        assert_eq!(b[6 + 1] & 0x0F, 15);
        let mut y = [0.0f32; 32];
        crate::unpack::decode::<Q50>(&b, &mut y);
        assert_eq!((y[0], y[1], y[17], y[2]), (-8.0, 7.5, 1.0, 0.0));
        let mut b1 = [0u8; 24];
        Q51::encode(&[2.5f32; 32], &mut b1).unwrap();
        crate::unpack::decode::<Q51>(&b1, &mut y);
        assert!(y.iter().all(|v| *v == 2.5), "{y:?}");
        let mut big = [0.0f32; 32];
        big[3] = 2.0e6;
        assert_eq!(Q50::encode(&big, &mut b), Err(2.0e6 / -16.0));
    }

    #[test]
    fn branch_free_f16_equals_half_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let (a, b) = (fp16_to_fp32(h), f16::from_bits(h).to_f32());
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{h:#06x}"
            );
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3F80);
        // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: even (1.0) wins.
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3F80);
        assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3F82);
        assert_eq!(bf16_bits(f32::NAN) & 0x7FC0, 0x7FC0);
        assert_eq!(bf16_at(&0x3F82u16.to_le_bytes()), 1.0 + 2.0 / 128.0);
    }
}
