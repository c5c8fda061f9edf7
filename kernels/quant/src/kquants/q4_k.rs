//! Q4_K and Q5_K (`quantize_row_q4_K_ref` / `quantize_row_q5_K_ref`, `dequantize_row_q4_K` /
//! `_q5_K`): 8 sub-blocks of 32 values, each fitted by `make_qkx2_quants` (weights
//! rms(x) + |x|; Q4_K codes 0..=15 over 21 trial scales, Q5_K 0..=31 over 16) to scale·l − min;
//! scales and minimums quantised to 6 bits against d = max scale / 63 and dmin = max min / 63
//! (packed as `get_scale_min_k4` reads them); then every code re-chosen against the stored
//! scales. Value = d·s·l − dmin·m. Layout: f16 d, f16 dmin, 12 scale bytes, [Q5_K: 32 bytes
//! of 5th bits, value 64·h + i + 32·k in bit 2h + k of byte i], 128 nibble bytes (byte 32·h + i
//! holds value 64·h + i low, 64·h + 32 + i high) = 144 / 176 bytes.

use super::{get_scale_min_k4, make_qkx2_quants, nearest_int, put_scale_min_k4, searchable, Qkx2};
use crate::codec_kernels::prims::Prims;
use crate::format::WeightFormat;
use crate::ggml::{f16_at, f16_le, put_f16};
use crate::unpack::{Codec, Unpacked};

/// Fits the 8 sub-blocks and stores d, dmin and the 12 scale bytes in `out[..16]`; returns
/// the codes (0..=nmax) re-chosen against the stored scales.
fn encode_scales(fit: &Qkx2, x: &[f32], out: &mut [u8]) -> Result<[u8; 256], f32> {
    searchable(x)?;
    let mut l = [0u8; 256];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        (scales[j], mins[j]) = make_qkx2_quants(fit, xs, &weights, &mut l[32 * j..]);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    put_scale_min_k4(&ls, &lm, &mut out[4..16]);
    put_f16(max_scale / 63.0, out)?;
    put_f16(max_min / 63.0, &mut out[2..])?;
    let (d, dmin) = (f16_at(out), f16_at(&out[2..]));
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &out[4..16]);
        let dl = d * sc as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dl).clamp(0, fit.nmax) as u8;
        }
    }
    Ok(l)
}

/// d, dmin and the 8 packed scales and minimums (each for two sub-blocks of 16), as
/// `dequantize_row_q4_K` reads them.
#[inline(always)]
fn unpack_scales(b: &[u8], u: &mut Unpacked) {
    (u.d, u.dmin) = (f16_le(b), f16_le(&b[2..]));
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &b[4..16]);
        u.sc[2 * j..2 * j + 2].fill(sc as i16);
        u.mn[2 * j..2 * j + 2].fill(m as i16);
    }
}

/// Writes 256 codes (0..=15, in value order) as a Q4_K block's 128 nibble bytes
/// (`out[16..144]`: byte 16 + 32h + i holds value 64h + i low and 64h + 32 + i high).
pub(crate) fn put_q4k_codes(l: &[u8; 256], out: &mut [u8]) {
    for h in 0..4 {
        for i in 0..32 {
            out[16 + 32 * h + i] = l[64 * h + i] | (l[64 * h + 32 + i] << 4);
        }
    }
}

/// Writes 256 codes (0..=31, in value order) as a Q5_K block's 32 bytes of 5th bits and 128
/// nibble bytes (`out[16..176]`: value 64h + i + 32k's 5th bit is bit 2h + k of byte 16 + i,
/// its low 4 bits as Q4_K's from byte 48).
pub(crate) fn put_q5k_codes(l: &[u8; 256], out: &mut [u8]) {
    let (qh, ql) = out[16..176].split_at_mut(32);
    qh.fill(0);
    for h in 0..4 {
        for i in 0..32 {
            let (l1, l2) = (l[64 * h + i], l[64 * h + 32 + i]);
            qh[i] |= (l1 >> 4) << (2 * h) | (l2 >> 4) << (2 * h + 1);
            ql[32 * h + i] = (l1 & 0x0F) | (l2 & 0x0F) << 4;
        }
    }
}

/// The Q4_K codec.
pub struct Q4K;

impl Codec for Q4K {
    const FORMAT: WeightFormat = WeightFormat::Q4_K;
    const HAS_B: bool = true;

    fn encode(x: &[f32], out: &mut [u8]) -> Result<(), f32> {
        let fit = Qkx2 {
            nmax: 15,
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let l = encode_scales(&fit, &x[..256], out)?;
        put_q4k_codes(&l, out);
        Ok(())
    }

    #[inline(always)]
    fn unpack<P: Prims>(b: &[u8], u: &mut Unpacked) {
        unpack_scales(b, u);
        let qs = &b[16..144];
        for h in 0..4 {
            for i in 0..32 {
                let byte = qs[32 * h + i];
                u.q[64 * h + i] = (byte & 0xF) as i8;
                u.q[64 * h + 32 + i] = (byte >> 4) as i8;
            }
        }
    }
}

/// The Q5_K codec.
pub struct Q5K;

impl Codec for Q5K {
    const FORMAT: WeightFormat = WeightFormat::Q5_K;
    const HAS_B: bool = true;

    fn encode(x: &[f32], out: &mut [u8]) -> Result<(), f32> {
        let fit = Qkx2 {
            nmax: 31,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: false,
        };
        // Codes are at most nmax = 31, so bit 4 is the 5th bit.
        let l = encode_scales(&fit, &x[..256], out)?;
        put_q5k_codes(&l, out);
        Ok(())
    }

    #[inline(always)]
    fn unpack<P: Prims>(b: &[u8], u: &mut Unpacked) {
        unpack_scales(b, u);
        let (qh, ql) = (&b[16..48], &b[48..176]);
        for h in 0..4 {
            for i in 0..32 {
                let (byte, high) = (ql[32 * h + i], qh[i] >> (2 * h));
                u.q[64 * h + i] = ((byte & 0xF) | ((high & 1) << 4)) as i8;
                u.q[64 * h + 32 + i] = ((byte >> 4) | ((high & 2) << 3)) as i8;
            }
        }
    }
}
