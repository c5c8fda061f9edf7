//! Q2_K (`quantize_row_q2_K_ref` / `dequantize_row_q2_K`): 16 sub-blocks of 16 values, each
//! fitted by `make_qkx2_quants` (codes 0..=3, |x| weights, absolute errors) to scale·l − min;
//! the 16 scales and 16 minimums quantised to 4 bits against d = max scale / 15 and
//! dmin = max min / 15; then every code re-chosen against the stored scales. Value =
//! d·s·l − dmin·m. Layout: 16 bytes s | m << 4, 64 bytes of 2-bit codes (byte 32·h + i holds
//! values 128·h + i + 32·k in bits 2k), f16 d, f16 dmin = 84 bytes.

use super::{make_qkx2_quants, nearest_int, searchable, Qkx2};
use crate::codec_kernels::prims::Prims;
use crate::format::WeightFormat;
use crate::ggml::{f16_at, f16_le, put_f16};
use crate::unpack::{Codec, Unpacked};

/// The Q2_K codec.
pub struct Q2K;

const FIT: Qkx2 = Qkx2 {
    nmax: 3,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
    use_mad: true,
};

impl Codec for Q2K {
    const FORMAT: WeightFormat = WeightFormat::Q2_K;
    const HAS_B: bool = true;

    fn encode(x: &[f32], out: &mut [u8]) -> Result<(), f32> {
        let x = &x[..256];
        searchable(x)?;
        let mut l = [0u8; 256];
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let weights: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
            (scales[j], mins[j]) = make_qkx2_quants(&FIT, xs, &weights, &mut l[16 * j..]);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let q4scale = 15.0f32;
        let mut sc = [0u8; 16];
        let d = if max_scale > 0.0 {
            let iscale = q4scale / max_scale;
            for (s, &v) in sc.iter_mut().zip(&scales) {
                *s = nearest_int(iscale * v) as u8;
            }
            max_scale / q4scale
        } else {
            0.0
        };
        put_f16(d, &mut out[80..])?;
        let dmin = if max_min > 0.0 {
            let iscale = q4scale / max_min;
            for (s, &v) in sc.iter_mut().zip(&mins) {
                *s = (*s as i32 | (nearest_int(iscale * v) << 4)) as u8;
            }
            max_min / q4scale
        } else {
            0.0
        };
        put_f16(dmin, &mut out[82..])?;
        let (d, dmin) = (f16_at(&out[80..]), f16_at(&out[82..]));
        for ((&s, ls), xs) in sc
            .iter()
            .zip(l.chunks_exact_mut(16))
            .zip(x.chunks_exact(16))
        {
            let dl = d * (s & 0xF) as f32;
            if dl == 0.0 {
                continue;
            }
            let dm = dmin * (s >> 4) as f32;
            for (li, &v) in ls.iter_mut().zip(xs) {
                *li = nearest_int((v + dm) / dl).clamp(0, 3) as u8;
            }
        }
        out[..16].copy_from_slice(&sc);
        for h in 0..2 {
            for i in 0..32 {
                let at = 128 * h + i;
                out[16 + 32 * h + i] =
                    l[at] | (l[at + 32] << 2) | (l[at + 64] << 4) | (l[at + 96] << 6);
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn unpack<P: Prims>(b: &[u8], u: &mut Unpacked) {
        (u.d, u.dmin) = (f16_le(&b[80..]), f16_le(&b[82..]));
        for (j, &s) in b[..16].iter().enumerate() {
            u.sc[j] = (s & 0xF) as i16;
            u.mn[j] = (s >> 4) as i16;
        }
        let qs = &b[16..80];
        for h in 0..2 {
            for k in 0..4 {
                for i in 0..32 {
                    u.q[128 * h + 32 * k + i] = ((qs[32 * h + i] >> (2 * k)) & 3) as i8;
                }
            }
        }
    }
}
