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
#[inline(always)]
pub fn quantize_activation(x: &[f32]) -> (f32, [i8; 256], [i16; 16]) {
    let (d, q, sums) = quantize(x);
    let finite = x[..256].iter().fold(true, |f, v| f & v.is_finite());
    (if finite { d } else { f32::NAN }, q, sums)
}

/// (d, codes, sums of 16) of 256 values, exactly `quantize_row_q8_K_ref`. Its scan keeps the
/// first value of the largest magnitude (`>` skips NaNs and later ties); here the largest
/// magnitude comes from a branch-free max over 16 lanes (the same `>` select, so the same
/// value) and the value is the first whose magnitude equals it, found a 16-value chunk at a
/// time, so the loops vectorise: the branchy scan and per-value codes took ~23% of a 256-row
/// Q4_K product at batch 4.
#[inline(always)]
pub fn quantize(x: &[f32]) -> (f32, [i8; 256], [i16; 16]) {
    let x: &[f32; 256] = x[..256].try_into().expect("256 values");
    let mut lanes = [0.0f32; 16];
    for chunk in x.chunks_exact(16) {
        for (m, v) in lanes.iter_mut().zip(chunk) {
            let a = v.abs();
            *m = if a > *m { a } else { *m };
        }
    }
    let amax = lanes.iter().fold(0.0f32, |m, &a| if a > m { a } else { m });
    if amax == 0.0 {
        return (0.0, [0; 256], [0; 16]);
    }
    // The first value of magnitude amax: the first 16-value chunk holding one (a branch-free
    // test per chunk), then its place in that chunk.
    let holds = |chunk: &[f32]| chunk.iter().fold(false, |f, v| f | (v.abs() == amax));
    let c = x
        .chunks_exact(16)
        .position(holds)
        .expect("amax is some |x|");
    let at = 16 * c
        + x[16 * c..]
            .iter()
            .position(|v| v.abs() == amax)
            .expect("in chunk c");
    let max = x[at];
    let iscale = -127.0 / max;
    let mut q = [0i8; 256];
    for (c, &v) in q.iter_mut().zip(x) {
        *c = nearest_int(iscale * v).min(127) as i8;
    }
    let mut sums = [0i16; 16];
    for (s, codes) in sums.iter_mut().zip(q.chunks_exact(16)) {
        *s = codes.iter().map(|&c| c as i16).sum();
    }
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
