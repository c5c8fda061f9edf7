//! Q8_K (`quantize_row_q8_K_ref` / `dequantize_row_q8_K`): 256 values, d = max / −127 in f32
//! (max the value of largest magnitude), codes min(127, round(x / d)) as i8, and Σ of each 16
//! codes as i16 (`bsums`, what the K-quant dot products use for the minimum terms). Value =
//! d·q. Layout: f32 d, 256 × i8, 16 × i16 = 292 bytes. An all-zero block stores d = 0, zero
//! codes and zero sums (ggml leaves its sums unwritten there).

use super::nearest_int;
use crate::codec_kernels::prims::Prims;
use crate::format::WeightFormat;
use crate::unpack::{Codec, Unpacked};

/// The Q8_K codec.
pub struct Q8K;

/// `quantize`, with a NaN scale where the 256 values hold a NaN or ±Inf, so every product
/// the activation feeds is NaN (ggml's max skips a NaN and would quantise the rest as if it
/// were absent): the activation side of the K-quant products.
pub fn quantize_activation(x: &[f32]) -> (f32, [i8; 256], [i16; 16]) {
    let (d, q, sums) = quantize(x);
    let finite = x[..256].iter().all(|v| v.is_finite());
    (if finite { d } else { f32::NAN }, q, sums)
}

/// (d, codes, sums of 16) of 256 values, exactly `quantize_row_q8_K_ref`.
pub fn quantize(x: &[f32]) -> (f32, [i8; 256], [i16; 16]) {
    let x = &x[..256];
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        return (0.0, [0; 256], [0; 16]);
    }
    let iscale = -127.0 / max;
    let q: [i8; 256] = std::array::from_fn(|j| nearest_int(iscale * x[j]).min(127) as i8);
    let sums: [i16; 16] =
        std::array::from_fn(|j| q[16 * j..16 * j + 16].iter().map(|&c| c as i16).sum());
    (1.0 / iscale, q, sums)
}

impl Codec for Q8K {
    const FORMAT: WeightFormat = WeightFormat::Q8_K;
    const HAS_B: bool = false;

    fn encode(x: &[f32], out: &mut [u8]) -> Result<(), f32> {
        let (d, q, sums) = quantize(x);
        out[..4].copy_from_slice(&d.to_le_bytes());
        for (o, c) in out[4..260].iter_mut().zip(q) {
            *o = c as u8;
        }
        for (o, s) in out[260..292].chunks_exact_mut(2).zip(sums) {
            o.copy_from_slice(&s.to_le_bytes());
        }
        Ok(())
    }

    #[inline(always)]
    fn unpack<P: Prims>(b: &[u8], u: &mut Unpacked) {
        u.d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        u.sc.fill(1);
        for (q, &c) in u.q.iter_mut().zip(&b[4..260]) {
            *q = c as i8;
        }
    }
}
