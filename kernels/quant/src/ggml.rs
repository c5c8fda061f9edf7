//! ggml's Q8_0, Q4_0 and Q4_1 blocks, byte for byte as llama.cpp's `quantize_row_q*_ref` in
//! `ggml-quants.c` and the `gguf` Python package's `gguf.quants` write them: the same f32
//! operations in the same order (no fused multiply-add), f16 stored round-to-nearest-even.
//! Test vectors written by `gguf.quants` are replayed in `tests/ggml_vectors.rs`.

use half::f16;

/// f32 → f16 bits (round to nearest even, as numpy's astype and GGML_FP32_TO_FP16).
fn f16_bits(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

/// f16 little-endian bytes → f32.
pub fn f16_at(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// Largest |d| that f16 stores finitely; a larger scale is refused rather than stored as inf.
pub const F16_MAX: f32 = 65504.0;

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
}
