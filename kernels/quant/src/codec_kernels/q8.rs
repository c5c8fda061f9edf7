//! The int8-activation product of the codec formats (`MatVecVariant::FusedQ8`, llama.cpp's
//! arithmetic: `ggml_vec_dot_q*_K_q8_K`, `_q5_0_q8_0`, `_iq4_nl_q8_0`, `_q5_1_q8_1`): per
//! block and row an exact integer Σ_j sc[j]·Σ q_w·q_x over the sub-blocks — each code times
//! its integer sub-block scale in i16 (|q·sc| ≤ 4096 for every format; ≤ 16384 for arbitrary
//! bytes), then the i16 products summed in pairs into 8 i32 lanes (`Prims::madd`: `vpmaddwd`) —
//! and for the formats with minimums Σ_j mn[j]·bsum_x[j]; then y += d_x·(d·isum − dmin·msum)
//! in f32, block after block. The activation is `act::CodecActivation` (Q8_K per 256 values for the K-quants, Q8_0 /
//! Q8_1 per 32 for the others: one activation block per weight block).
//!
//! Plain Rust over fixed lane arrays, inlined into each tier's wrapper (`super`).

// Lane loops index several fixed arrays in step (the shape LLVM vectorises).
#![allow(clippy::needless_range_loop)]

use super::act::CodecActivation;
use super::prims::Prims;
use crate::unpack::{Codec, Unpacked};

/// y_r for R rows against one quantised activation (`act.block == C::VALUES`).
#[inline(always)]
pub fn rows_dot_q8<C: Codec, P: Prims, const R: usize>(
    rows: [&[u8]; R],
    nblocks: usize,
    act: &CodecActivation,
) -> [f32; R] {
    let mut out = [0.0f32; R];
    let mut u = Unpacked::default();
    for r in 0..R {
        // One row at a time, its sum in a register (the activation comes from L1 again).
        let mut y = 0.0f32;
        for k in 0..nblocks {
            C::unpack::<P>(&rows[r][k * C::BYTES..(k + 1) * C::BYTES], &mut u);
            let xq = &act.q[k * C::VALUES..(k + 1) * C::VALUES];
            // Each code times its sub-block's integer scale (exact in i16), then the i16
            // pair products into 8 i32 lanes (`Prims::madd`), summed exactly.
            let mut lanes = [0i32; 8];
            for j in 0..C::SUBS {
                let s = u.sc[j];
                let mut w = [0i16; 16];
                for l in 0..16 {
                    w[l] = u.q[16 * j + l] as i16 * s;
                }
                let x: &[i16; 16] = xq[16 * j..16 * j + 16].try_into().expect("16 codes");
                let p = P::madd(&w, x);
                for l in 0..8 {
                    lanes[l] += p[l];
                }
            }
            let isum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
                + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
            let dx = act.d[k];
            y += dx * u.d * isum as f32;
            if C::HAS_B {
                let mut msum = 0i32;
                for j in 0..C::SUBS {
                    msum += u.mn[j] as i32 * act.bsum[k * C::SUBS + j];
                }
                y -= dx * u.dmin * msum as f32;
            }
        }
        out[r] = y;
    }
    out
}
