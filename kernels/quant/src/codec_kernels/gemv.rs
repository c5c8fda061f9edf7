//! The batch-1 product with f32 activations (`MatVecVariant::Fused`, transformers'
//! arithmetic: the weights' values times x in f32) for the codec formats: R rows at a time,
//! per block each row unpacked (`Codec::unpack`: codes as i8, per-16 scale and minimum), then
//! per 16-value sub-block j the lane-wise q·x of its two halves of 8, added and scaled by
//! a(j) = d·sc[j] into 8 f32 lanes per row; the minimums add Σ_j b(j)·Σx_j per block, with every sub-block's Σx of the
//! activation computed once per call (`sub_sums`). One horizontal sum per row at the end.
//!
//! Plain Rust over fixed lane arrays, `#[inline(always)]`: `super` compiles it inside an
//! AVX-512, an AVX2 and no `#[target_feature]` wrapper, and LLVM vectorises it for each (the
//! AVX2 build's inner loop is `vpmovsxbd`/`vcvtdq2ps`/`vmulps`/`vaddps` on ymm, the
//! portable one the same on xmm — see `codec_kernels` for the check). No `mul_add`: on the
//! portable tier it would be a call to software `fmaf`.

// Lane loops index several fixed arrays in step (the shape LLVM vectorises).
#![allow(clippy::needless_range_loop)]

use super::prims::Prims;
use crate::unpack::{Codec, Unpacked};

/// Σx of every 16 values of x (the minimum terms' factor).
#[inline(always)]
pub fn sub_sums(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(16)
        .map(|c| {
            let mut s = 0.0f32;
            for &v in c {
                s += v;
            }
            s
        })
        .collect()
}

/// y_r = Σ_k w_rk·x_k for R rows (`rows[r]` the row's bytes, `nblocks` blocks each);
/// `xsum` = `sub_sums(x)`.
#[inline(always)]
pub fn rows_dot<C: Codec, P: Prims, const R: usize>(
    rows: [&[u8]; R],
    nblocks: usize,
    x: &[f32],
    xsum: &[f32],
) -> [f32; R] {
    let mut acc = [[0.0f32; 8]; R];
    // b(j)·Σx_j per sub-block lane, summed over blocks (a vector op, not a scalar chain).
    let mut bacc = [[0.0f32; 16]; R];
    let mut u = Unpacked::default();
    for k in 0..nblocks {
        let xb = &x[k * C::VALUES..(k + 1) * C::VALUES];
        for r in 0..R {
            C::unpack::<P>(&rows[r][k * C::BYTES..(k + 1) * C::BYTES], &mut u);
            // The per-16 multipliers as a vector, the minimums' b(j)·Σx_j once per block.
            let mut a = [0.0f32; 16];
            for (j, aj) in a.iter_mut().enumerate().take(C::SUBS) {
                *aj = u.a(j);
            }
            if C::HAS_B {
                let xs = &xsum[k * C::SUBS..(k + 1) * C::SUBS];
                for j in 0..C::SUBS {
                    bacc[r][j] += u.b(j) * xs[j];
                }
            }
            // Per sub-block: t = the two halves' q·x added lane-wise, then acc += a(j)·t.
            for j in 0..C::SUBS {
                let xs: &[f32; 16] = xb[16 * j..16 * j + 16].try_into().expect("16 values");
                let q: &[i8; 16] = u.q[16 * j..16 * j + 16].try_into().expect("16 codes");
                let aj = a[j];
                for l in 0..8 {
                    let t = q[l] as f32 * xs[l] + q[l + 8] as f32 * xs[l + 8];
                    acc[r][l] += aj * t;
                }
            }
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        let f = &acc[r];
        let s = ((f[0] + f[4]) + (f[2] + f[6])) + ((f[1] + f[5]) + (f[3] + f[7]));
        out[r] = s + if C::HAS_B { hsum16(&bacc[r]) } else { 0.0 };
    }
    out
}

/// Σ of 16 lanes as a fixed tree (8 + 8, 4 + 4, ...), the same order on every tier.
#[inline(always)]
pub fn hsum16(v: &[f32; 16]) -> f32 {
    let mut h = [0.0f32; 8];
    for l in 0..8 {
        h[l] = v[l] + v[l + 8];
    }
    let q = [h[0] + h[4], h[1] + h[5], h[2] + h[6], h[3] + h[7]];
    (q[0] + q[2]) + (q[1] + q[3])
}
