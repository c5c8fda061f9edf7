//! Q6_K (`quantize_row_q6_K_ref` / `dequantize_row_q6_K`): 16 sub-blocks of 16 values, each
//! fitted by `make_qx_quants` (codes −32..=31, x²-weighted); the 16 scales quantised to i8
//! against d = −max / 128 (max the scale of largest magnitude); then every code re-chosen
//! against the stored scales. Value = d·s·(l − 32). Layout: 128 bytes of low nibbles (byte
//! 64·h + i holds value 128·h + i low, 128·h + 64 + i high; byte 64·h + 32 + i values
//! 128·h + 32 + i and 128·h + 96 + i), 64 bytes of top 2 bits (byte 32·h + i: value
//! 128·h + 32·k + i in bits 2k), 16 × i8 scales, f16 d = 210 bytes.

use super::{make_qx_quants, nearest_int, searchable, GROUP_MAX_EPS};
use crate::codec_kernels::prims::Prims;
use crate::format::WeightFormat;
use crate::ggml::{f16_at, f16_le, put_f16};
use crate::unpack::{Codec, Unpacked};

/// Writes 256 codes (0..=63, in value order) as a Q6_K block's 128 bytes of low nibbles and
/// 64 bytes of top 2 bits (`out[..192]`).
pub(crate) fn put_codes(codes: &[u8; 256], out: &mut [u8]) {
    for h in 0..2 {
        let (ql, qh) = (64 * h, 128 + 32 * h);
        for i in 0..32 {
            let v = 128 * h + i;
            let c = |k: usize| codes[v + 32 * k];
            out[ql + i] = (c(0) & 0xF) | ((c(2) & 0xF) << 4);
            out[ql + 32 + i] = (c(1) & 0xF) | ((c(3) & 0xF) << 4);
            out[qh + i] =
                (c(0) >> 4) | ((c(1) >> 4) << 2) | ((c(2) >> 4) << 4) | ((c(3) >> 4) << 6);
        }
    }
}

/// The Q6_K codec.
pub struct Q6K;

impl Codec for Q6K {
    const FORMAT: WeightFormat = WeightFormat::Q6_K;
    const HAS_B: bool = false;

    fn encode(x: &[f32], out: &mut [u8]) -> Result<(), f32> {
        let x = &x[..256];
        searchable(x)?;
        let mut l = [0i8; 256];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for j in 0..16 {
            scales[j] = make_qx_quants(32, &x[16 * j..16 * j + 16], &mut l[16 * j..]);
            if scales[j].abs() > max_abs_scale {
                max_abs_scale = scales[j].abs();
                max_scale = scales[j];
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            out[..210].fill(0);
            return Ok(());
        }
        let iscale = -128.0 / max_scale;
        put_f16(1.0 / iscale, &mut out[208..])?;
        let sc: [i8; 16] = std::array::from_fn(|j| nearest_int(iscale * scales[j]).min(127) as i8);
        let d = f16_at(&out[208..]);
        for ((&s, ls), xs) in sc
            .iter()
            .zip(l.chunks_exact_mut(16))
            .zip(x.chunks_exact(16))
        {
            let dl = d * s as f32;
            if dl == 0.0 {
                continue;
            }
            for (li, &v) in ls.iter_mut().zip(xs) {
                *li = (nearest_int(v / dl).clamp(-32, 31) + 32) as i8;
            }
        }
        put_codes(&l.map(|c| c as u8), out);
        for (o, s) in out[192..208].iter_mut().zip(sc) {
            *o = s as u8;
        }
        Ok(())
    }

    #[inline(always)]
    fn unpack<P: Prims>(b: &[u8], u: &mut Unpacked) {
        u.d = f16_le(&b[208..]);
        for j in 0..16 {
            u.sc[j] = b[192 + j] as i8 as i16;
        }
        for h in 0..2 {
            for i in 0..32 {
                let (l0, l1, hb) = (b[64 * h + i], b[64 * h + 32 + i], b[128 + 32 * h + i]);
                let v = 128 * h + i;
                u.q[v] = ((l0 & 0xF) | ((hb & 3) << 4)) as i8 - 32;
                u.q[v + 32] = ((l1 & 0xF) | (((hb >> 2) & 3) << 4)) as i8 - 32;
                u.q[v + 64] = ((l0 >> 4) | (((hb >> 4) & 3) << 4)) as i8 - 32;
                u.q[v + 96] = ((l1 >> 4) | (((hb >> 6) & 3) << 4)) as i8 - 32;
            }
        }
    }
}
