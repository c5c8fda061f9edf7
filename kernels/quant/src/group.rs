//! Group quantisation with b-bit codes, 2 ≤ b ≤ 8: symmetric (claim C16: scale = max|x| /
//! (2^(b−1) − 1), q = clamp(round(x / scale), −2^(b−1), 2^(b−1) − 1)) and asymmetric with a
//! zero point (AWQ/GPTQ: the range [min, max] widened to include 0 so that 0 is exact, scale =
//! (max − min) / (2^b − 1), zero = round(−min / scale)). Codes are computed against the scale
//! as stored (f16 or f32), so the round-trip error is at most half a stored step inside the
//! range. Codes are packed LSB-first, one bit stream per group (see `format`).

use crate::format::{ScaleType, WeightFormat};
use half::f16;

/// The scale as its storage type holds it.
pub fn stored_scale(scale: f32, ty: ScaleType) -> f32 {
    match ty {
        ScaleType::F16 => f16::from_f32(scale).to_f32(),
        ScaleType::F32 => scale,
    }
}

fn write_scale(scale: f32, ty: ScaleType, out: &mut [u8]) {
    match ty {
        ScaleType::F16 => out[..2].copy_from_slice(&f16::from_f32(scale).to_bits().to_le_bytes()),
        ScaleType::F32 => out[..4].copy_from_slice(&scale.to_le_bytes()),
    }
}

/// Reads a stored scale.
pub fn read_scale(b: &[u8], ty: ScaleType) -> f32 {
    match ty {
        ScaleType::F16 => f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        ScaleType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    }
}

/// Packs `codes` (each < 2^bits) LSB-first into `out` (⌈n·bits/8⌉ bytes, padding bits 0).
pub fn pack(codes: &[u8], bits: u8, out: &mut [u8]) {
    out.fill(0);
    let bits = bits as usize;
    for (i, &c) in codes.iter().enumerate() {
        let at = i * bits;
        let (byte, shift) = (at / 8, at % 8);
        let v = (c as u16) << shift;
        out[byte] |= v as u8;
        if shift + bits > 8 {
            out[byte + 1] |= (v >> 8) as u8;
        }
    }
}

/// Unpacks `codes.len()` codes written by `pack`. Eight codes of b bits fill exactly b bytes,
/// so full octets are read as one little-endian word; the width is a constant in each
/// monomorphised copy (a variable-length copy per octet was a `memcpy` call and made the
/// portable decode 2 ns per weight).
pub fn unpack(packed: &[u8], bits: u8, codes: &mut [u8]) {
    match bits {
        2 => unpack_const::<2>(packed, codes),
        3 => unpack_const::<3>(packed, codes),
        4 => unpack_const::<4>(packed, codes),
        5 => unpack_const::<5>(packed, codes),
        6 => unpack_const::<6>(packed, codes),
        7 => unpack_const::<7>(packed, codes),
        8 => codes.copy_from_slice(&packed[..codes.len()]),
        _ => unreachable!("code widths are 2..=8"),
    }
}

fn unpack_const<const B: usize>(packed: &[u8], codes: &mut [u8]) {
    let mask = (1u64 << B) - 1;
    let octets = codes.len() / 8;
    for (o, out) in codes.chunks_exact_mut(8).enumerate() {
        let mut word = [0u8; 8];
        word[..B].copy_from_slice(&packed[o * B..o * B + B]);
        let w = u64::from_le_bytes(word);
        for (j, c) in out.iter_mut().enumerate() {
            *c = ((w >> (j * B)) & mask) as u8;
        }
    }
    for (i, c) in codes.iter_mut().enumerate().skip(octets * 8) {
        let at = i * B;
        let (byte, shift) = (at / 8, at % 8);
        let lo = packed[byte] as u16;
        let hi = if shift + B > 8 {
            packed[byte + 1] as u16
        } else {
            0
        };
        *c = (((lo | hi << 8) >> shift) as u64 & mask) as u8;
    }
}

/// The scale a group of `x` gets before storage rounding (for the overflow check).
pub fn raw_scale(format: WeightFormat, x: &[f32]) -> f32 {
    match format {
        WeightFormat::Sym { bits, .. } => {
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            amax / ((1u32 << (bits - 1)) - 1) as f32
        }
        WeightFormat::Asym { bits, .. } => {
            let (min, max) = min_max_with_zero(x);
            (max - min) / ((1u32 << bits) - 1) as f32
        }
        _ => unreachable!("raw_scale is for sym/asym formats"),
    }
}

fn min_max_with_zero(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((0.0f32, 0.0f32), |(a, b), &v| (a.min(v), b.max(v)))
}

/// Encodes one group of a `Sym`/`Asym` format into `out` (the format's block bytes);
/// `codes` is scratch of the group's length.
pub fn encode_group(format: WeightFormat, x: &[f32], codes: &mut [u8], out: &mut [u8]) {
    match format {
        WeightFormat::Sym { bits, scale, .. } => {
            let s = stored_scale(raw_scale(format, x), scale);
            let half = 1i32 << (bits - 1);
            for (c, &v) in codes.iter_mut().zip(x) {
                let q = if s == 0.0 {
                    0
                } else {
                    ((v / s).round() as i32).clamp(-half, half - 1)
                };
                *c = (q + half) as u8;
            }
            write_scale(s, scale, out);
            pack(codes, bits, &mut out[scale.bytes()..]);
        }
        WeightFormat::Asym { bits, scale, .. } => {
            let s = stored_scale(raw_scale(format, x), scale);
            let levels = (1i32 << bits) - 1;
            let (min, _) = min_max_with_zero(x);
            let zero = if s == 0.0 {
                0
            } else {
                ((-min / s).round() as i32).clamp(0, levels)
            };
            for (c, &v) in codes.iter_mut().zip(x) {
                let q = if s == 0.0 {
                    0
                } else {
                    ((v / s).round() as i32 + zero).clamp(0, levels)
                };
                *c = q as u8;
            }
            write_scale(s, scale, out);
            out[scale.bytes()] = zero as u8;
            pack(codes, bits, &mut out[scale.bytes() + 1..]);
        }
        _ => unreachable!("encode_group is for sym/asym formats"),
    }
}

/// (scale, zero code) of a stored `Sym`/`Asym` block: value = scale · (code − zero).
pub fn block_affine(format: WeightFormat, b: &[u8]) -> (f32, i32) {
    match format {
        WeightFormat::Sym { bits, scale, .. } => (read_scale(b, scale), 1 << (bits - 1)),
        WeightFormat::Asym { scale, .. } => (read_scale(b, scale), b[scale.bytes()] as i32),
        _ => unreachable!("block_affine is for sym/asym formats"),
    }
}

/// Decodes one `Sym`/`Asym` block into `out` (the group's length); `codes` is scratch.
pub fn decode_group(format: WeightFormat, b: &[u8], codes: &mut [u8], out: &mut [f32]) {
    let (s, zero) = block_affine(format, b);
    unpack(&b[format.header_bytes()..], format.bits(), codes);
    for (o, &c) in out.iter_mut().zip(codes.iter()) {
        *o = s * (c as i32 - zero) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_every_code_for_every_width() {
        for bits in 2..=8u8 {
            for n in [1usize, 7, 8, 9, 31, 32, 33, 128] {
                let codes: Vec<u8> = (0..n)
                    .map(|i| ((i * 37 + 11) % (1 << bits)) as u8)
                    .collect();
                let mut packed = vec![0xAAu8; (n * bits as usize).div_ceil(8)];
                pack(&codes, bits, &mut packed);
                let mut back = vec![0u8; n];
                unpack(&packed, bits, &mut back);
                assert_eq!(back, codes, "bits {bits} n {n}");
            }
        }
        // int4 is tight nibble packing: value 2j low nibble, 2j+1 high nibble.
        let mut p = [0u8; 2];
        pack(&[1, 2, 3, 4], 4, &mut p);
        assert_eq!(p, [0x21, 0x43]);
    }

    #[test]
    fn symmetric_int4_matches_the_formula() {
        let f = WeightFormat::parse("sym4g8s32").unwrap();
        let x = [0.7f32, -0.7, 0.1, 0.0, 0.35, -0.2, 0.5, 0.05];
        let mut codes = [0u8; 8];
        let mut b = vec![0u8; f.block_bytes()];
        encode_group(f, &x, &mut codes, &mut b);
        let s = 0.7f32 / 7.0;
        assert_eq!(read_scale(&b, ScaleType::F32), s);
        assert_eq!(codes[0] as i32 - 8, 7);
        assert_eq!(codes[1] as i32 - 8, -7);
        let mut y = [0.0f32; 8];
        decode_group(f, &b, &mut codes, &mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= s / 2.0 + 1e-7);
        }
    }

    #[test]
    fn asymmetric_keeps_zero_exact_and_constant_groups() {
        let f = WeightFormat::parse("asym3g4").unwrap();
        let mut codes = [0u8; 4];
        let mut b = vec![0u8; f.block_bytes()];
        let mut y = [9.0f32; 4];
        encode_group(f, &[0.0, 0.0, 0.0, 0.0], &mut codes, &mut b);
        decode_group(f, &b, &mut codes, &mut y);
        assert_eq!(y, [0.0; 4]);
        encode_group(f, &[3.0; 4], &mut codes, &mut b);
        decode_group(f, &b, &mut codes, &mut y);
        assert!(y.iter().all(|v| (v - 3.0).abs() < 3e-3), "{y:?}");
        encode_group(f, &[1.0, 0.0, 2.0, 5.0], &mut codes, &mut b);
        decode_group(f, &b, &mut codes, &mut y);
        assert_eq!(y[1], 0.0);
    }
}
