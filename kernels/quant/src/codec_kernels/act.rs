//! The int8 activations of the codec formats' products, each format's llama.cpp
//! `vec_dot_type`: Q8_K for the K-quants (`quantize_row_q8_K_ref`: per 256 values an f32
//! d = max / −127 and codes min(127, nearest(x / d)), exactly `kquants::q8_k::quantize`), Q8_0
//! for Q5_0 and IQ4_NL and Q8_1 for Q5_1 (per 32 values, `act_q8`'s quantisation: d =
//! max|x| / 127 in f32, codes round(x / d); Q8_1's d·Σq is `−dmin·Σq` here, as every codec's
//! minimum). The codes are stored widened to i16 (the products multiply i16 pairs), with the
//! Σ of each 16 codes (Q8_K's `bsums`) for the minimum terms.
//!
//! A block holding a NaN or ±Inf gets a NaN scale, so every output it feeds is NaN, as the
//! f32 products give (ggml's Q8_K would drop the NaN: its max skips it).

use crate::format::WeightFormat;
use crate::kquants::q8_k;

/// An activation row quantised for the product with one codec format.
#[derive(Debug, Clone, PartialEq)]
pub struct CodecActivation {
    /// Values per activation block: 256 (Q8_K) or 32 (Q8_0 / Q8_1).
    pub block: usize,
    /// The codes, in the row's order, widened.
    pub q: Vec<i16>,
    /// The scale of each block.
    pub d: Vec<f32>,
    /// Σ of each 16 codes.
    pub bsum: Vec<i32>,
}

/// Values per activation block for `format` (256 for the K-quants, else 32).
pub fn act_block(format: WeightFormat) -> usize {
    if format.is_k_quant() {
        256
    } else {
        32
    }
}

/// Quantises `x` (a whole number of `act_block(format)` values) for `format`'s products.
pub fn quantize(format: WeightFormat, x: &[f32]) -> CodecActivation {
    let block = act_block(format);
    let n = x.len() / block;
    let mut act = CodecActivation {
        block,
        q: vec![0; n * block],
        d: vec![0.0; n],
        bsum: vec![0; x.len() / 16],
    };
    if block == 256 {
        for (k, xs) in x.chunks_exact(256).enumerate() {
            let (d, codes, _) = q8_k::quantize_activation(xs);
            for (o, c) in act.q[256 * k..256 * (k + 1)].iter_mut().zip(codes) {
                *o = c as i16;
            }
            act.d[k] = d;
        }
    } else {
        // act_q8 already gives a non-finite chunk a NaN scale.
        let a = crate::act_q8::quantize_natural(x);
        for (o, &c) in act.q.iter_mut().zip(&a.q) {
            *o = c as i16;
        }
        act.d.copy_from_slice(&a.d);
    }
    for (s, q) in act.bsum.iter_mut().zip(act.q.chunks_exact(16)) {
        *s = q.iter().map(|&c| c as i32).sum();
    }
    act
}

/// What the products multiply instead of `x`: d·q per value, in order.
pub fn activation_as_seen(format: WeightFormat, x: &[f32]) -> Vec<f32> {
    let act = quantize(format, x);
    act.q
        .iter()
        .enumerate()
        .map(|(i, &q)| act.d[i / act.block] * q as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_k_and_q8_0_blocks_and_nan() {
        let mut x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.1)
            .collect();
        let a = quantize(WeightFormat::Q4_K, &x);
        assert_eq!((a.block, a.d.len(), a.bsum.len()), (256, 2, 32));
        let (d, q, sums) = q8_k::quantize(&x[256..]);
        assert_eq!(a.d[1], d);
        assert_eq!(a.q[256 + 5], q[5] as i16);
        assert_eq!(a.bsum[16 + 3], sums[3] as i32);
        let b = quantize(WeightFormat::Q5_0, &x);
        assert_eq!((b.block, b.d.len()), (32, 16));
        x[300] = f32::NAN;
        let a = quantize(WeightFormat::Q6_K, &x);
        assert!(a.d[0].is_finite() && a.d[1].is_nan());
        let seen = activation_as_seen(WeightFormat::Q6_K, &x);
        assert!(seen[..256].iter().all(|v| v.is_finite()) && seen[256].is_nan());
        x[300] = f32::INFINITY;
        assert!(quantize(WeightFormat::IQ4_NL, &x).d[9].is_nan());
    }
}
