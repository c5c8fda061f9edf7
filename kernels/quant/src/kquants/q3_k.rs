//! Q3_K (`quantize_row_q3_K_ref` / `dequantize_row_q3_K`): 16 sub-blocks of 16 values, each
//! fitted by `make_q3_quants` (codes −4..=3); the 16 signed scales quantised to 6 bits
//! against d = −max / 32 (max the scale of largest magnitude); then every code re-chosen
//! against the stored scales. Value = d·(s − 32)·(l − 4). Layout: 32 bytes of high bits
//! (bit k of byte i: value 32·k + i has l ≥ 4), 64 bytes of low 2-bit codes (as Q2_K),
//! 12 bytes of scales (low nibbles of s0..s15 in bytes 0..8, their top 2 bits in bytes
//! 8..12: scale j's in bits 2·(j / 4) of byte 8 + j % 4), f16 d = 110 bytes.

use super::{make_q3_quants, nearest_int, searchable};
use crate::codec_kernels::prims::Prims;
use crate::format::WeightFormat;
use crate::ggml::{f16_at, f16_le, put_f16};
use crate::unpack::{Codec, Unpacked};

/// The Q3_K codec.
pub struct Q3K;

/// The 6-bit scale j (0..64, 32 meaning 0) of the 12 packed scale bytes.
#[inline(always)]
fn scale6(sc: &[u8], j: usize) -> i32 {
    let low = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
    (low | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i32
}

impl Codec for Q3K {
    const FORMAT: WeightFormat = WeightFormat::Q3_K;
    const HAS_B: bool = false;

    fn encode(x: &[f32], out: &mut [u8]) -> Result<(), f32> {
        let x = &x[..256];
        searchable(x)?;
        let mut l = [0i8; 256];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        let mut sc = [0u8; 12];
        let d = if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                let q = (nearest_int(iscale * s) as i8).clamp(-32, 31) + 32;
                if j < 8 {
                    sc[j] = (q & 0xF) as u8;
                } else {
                    sc[j - 8] |= ((q & 0xF) << 4) as u8;
                }
                sc[j % 4 + 8] |= ((q >> 4) as u8) << (2 * (j / 4));
            }
            1.0 / iscale
        } else {
            0.0
        };
        put_f16(d, &mut out[108..])?;
        let d = f16_at(&out[108..]);
        for j in 0..16 {
            let dl = d * (scale6(&sc, j) - 32) as f32;
            if dl == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / dl).clamp(-4, 3) + 4) as i8;
            }
        }
        let (hmask, rest) = out.split_at_mut(32);
        hmask.fill(0);
        for (i, li) in l.iter_mut().enumerate() {
            if *li > 3 {
                hmask[i % 32] |= 1 << (i / 32);
                *li -= 4;
            }
        }
        for h in 0..2 {
            for i in 0..32 {
                let at = 128 * h + i;
                let c = |k: usize| (l[at + 32 * k] as u8) << (2 * k);
                rest[32 * h + i] = c(0) | c(1) | c(2) | c(3);
            }
        }
        out[96..108].copy_from_slice(&sc);
        Ok(())
    }

    #[inline(always)]
    fn unpack<P: Prims>(b: &[u8], u: &mut Unpacked) {
        u.d = f16_le(&b[108..]);
        let sc = &b[96..108];
        for j in 0..16 {
            u.sc[j] = (scale6(sc, j) - 32) as i16;
        }
        // Code l − 4, plus 4 where the high bit is set (ggml: − (hm & m ? 0 : 4)).
        let (hmask, qs) = (&b[..32], &b[32..96]);
        for h in 0..2 {
            for k in 0..4 {
                for i in 0..32 {
                    let low = ((qs[32 * h + i] >> (2 * k)) & 3) as i8;
                    let high = ((hmask[i] >> (4 * h + k)) & 1) as i8;
                    u.q[128 * h + 32 * k + i] = low - 4 + 4 * high;
                }
            }
        }
    }
}
