//! ggml's IQ4_NL (the non-linear 4-bit blocks of llama.cpp PR #5590): 32 values, an f16 d and
//! 4-bit indices into the fixed table `kvalues_iq4nl`, value = d · table[index]. The encoder is
//! `ggml-quants.c`'s `quantize_row_iq4_nl_impl` for one 32-value block without importance
//! weights (weights x²) and with `ntry = 7`, as `quantize_iq4_nl` — what `llama-quantize`
//! calls — runs it: a scale from the value of largest magnitude, 15 refinements of it by
//! weighted least squares, then every index re-chosen (`best_index_int8`) against the final
//! scale. Decoding is `dequantize_row_iq4_nl`.

use crate::codec_kernels::prims::Prims;
use crate::format::WeightFormat;
use crate::ggml::{f16_le, put_f16};
use crate::kquants::{searchable, GROUP_MAX_EPS};
use crate::unpack::{Codec, Unpacked};

/// `kvalues_iq4nl` (ggml-common.h).
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Refinements either side of the first scale (`quantize_iq4_nl`'s `ntry`).
const NTRY: i32 = 7;

/// The index of the table value nearest x (`best_index_int8`: bisection, ties upward).
fn best_index(x: f32) -> usize {
    let val = |i: usize| KVALUES[i] as f32;
    if x <= val(0) {
        return 0;
    }
    if x >= val(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - val(mu - 1) < val(mu) - x {
        mu - 1
    } else {
        mu
    }
}

/// The block's scale: the weighted least-squares d of the best of 16 trial scales.
fn block_scale(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    // Σ w·q·x and Σ w·q² with w = x², for the indices nearest id·x.
    let sums = |id: f32| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = KVALUES[best_index(id * v)] as f32;
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d0 = -max / KVALUES[0] as f32;
    let (sumqx, sumq2) = sums(1.0 / d0);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let id = (itry + KVALUES[0] as i32) as f32 / max;
        let (sumqx, sumq2) = sums(id);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// The IQ4_NL codec.
pub struct Iq4Nl;

impl Codec for Iq4Nl {
    const FORMAT: WeightFormat = WeightFormat::IQ4_NL;
    const HAS_B: bool = false;

    fn encode(x: &[f32], out: &mut [u8]) -> Result<(), f32> {
        let x = &x[..32];
        searchable(x)?;
        let d = block_scale(x);
        put_f16(d, out)?;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut l = [0u8; 32];
        for (li, &v) in l.iter_mut().zip(x) {
            *li = best_index(id * v) as u8;
        }
        for j in 0..16 {
            out[2 + j] = l[j] | (l[16 + j] << 4);
        }
        Ok(())
    }

    #[inline(always)]
    fn unpack<P: Prims>(b: &[u8], u: &mut Unpacked) {
        u.d = f16_le(b);
        u.sc[..2].fill(1);
        let mut lo = [0u8; 16];
        let mut hi = [0u8; 16];
        for (j, &byte) in b[2..18].iter().enumerate() {
            lo[j] = byte & 0x0F;
            hi[j] = byte >> 4;
        }
        u.q[..16].copy_from_slice(&P::lut(&KVALUES, &lo));
        u.q[16..32].copy_from_slice(&P::lut(&KVALUES, &hi));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_index_and_ties() {
        assert_eq!(best_index(-1000.0), 0);
        assert_eq!(best_index(1000.0), 15);
        assert_eq!(best_index(0.0), 8); // 1 is nearer than −10
        assert_eq!(best_index(-4.5), 8); // halfway between −10 and 1: upward
        assert_eq!(best_index(-4.6), 7);
        assert_eq!(best_index(f32::NAN), 15);
        for (i, &v) in KVALUES.iter().enumerate() {
            assert_eq!(best_index(v as f32), i);
        }
    }

    #[test]
    fn a_block_of_table_values_is_exact() {
        // x = table values × 0.5: the least-squares scale is 0.5 exactly.
        let x: Vec<f32> = (0..32).map(|i| KVALUES[i % 16] as f32 * 0.5).collect();
        let mut b = [0u8; 18];
        Iq4Nl::encode(&x, &mut b).unwrap();
        assert_eq!(f16_le(&b), 0.5);
        let mut y = [0.0f32; 32];
        crate::unpack::decode::<Iq4Nl>(&b, &mut y);
        assert_eq!(&y[..], &x[..]);
    }
}
