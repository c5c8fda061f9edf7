//! The Q6_K packed product (`crate::packed`'s Q6_K tiles): llama.cpp's `vec_dot_q6_K_q8_K`
//! arithmetic on 16-row tiles. The activation is Q8_K (`act_q8k`: per 256 values a scale, the
//! codes and the sum of each 16). Per row and super-block the kernels form one exact integer,
//! Σ_G s_G·Σ(c − 32)·q over the 16 groups of 16 — computed as Σ_G s_G·Σc·q − 32·Σ_G s_G·Σq so
//! the unsigned 6-bit codes feed `vpmaddubsw` directly — and add d·d_x·it. The AVX2 body is
//! `avx2::packed_q6k`, the AVX-512 VNNI one `avx512::packed_k` (an AVX-512 tier without VNNI
//! runs the AVX2 body; the dispatch of both K-quant tiles is `packed_q4k::tile_dot`); this file
//! holds the plain-loop body of the portable tier.

use crate::act_q8k::Q8KActivation;
use crate::packed_layout::{code_bytes, scale_bytes, Q6K_HI, Q6K_SC, Q6K_SUB, SUPER, TILE};
use crate::WeightFormat;

/// The 16 rows of one tile against one activation, in plain loops.
pub(crate) fn tile_dot_portable(
    codes: &[u8],
    scales: &[u8],
    nb: usize,
    act: &Q8KActivation,
) -> [f32; TILE] {
    let (cb, sb) = (
        code_bytes(WeightFormat::Q6_K),
        scale_bytes(WeightFormat::Q6_K),
    );
    let mut acc = [0.0f32; TILE];
    for k in 0..nb {
        let (codes, sc) = (&codes[k * cb..], &scales[k * sb..]);
        let q = &act.q[k * SUPER..(k + 1) * SUPER];
        for (r, a) in acc.iter_mut().enumerate() {
            let (mut isum, mut ioff) = (0i32, 0i32);
            for j in 0..8 {
                let sub = &codes[Q6K_SUB * j..Q6K_SUB * (j + 1)];
                for g in 0..2 {
                    let mut dot = 0i32;
                    for t in 0..4 {
                        let s = 4 * g + t;
                        for b in 0..4 {
                            let byte = sub[64 * (s / 2) + 4 * r + b];
                            let lo = if s % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                            let hi = (sub[Q6K_HI + 64 * g + 4 * r + b] >> (2 * t)) & 3;
                            dot += (lo | hi << 4) as i32 * q[32 * j + 4 * s + b] as i32;
                        }
                    }
                    let s = sc[Q6K_SC + TILE * (2 * j + g) + r] as i8 as i32;
                    isum += s * dot;
                    ioff += s * act.bsum16[16 * k + 2 * j + g] as i32;
                }
            }
            let d = crate::ggml::f16_at(&sc[2 * r..]);
            *a += d * act.d[k] * (isum - 32 * ioff) as f32;
        }
    }
    acc
}
