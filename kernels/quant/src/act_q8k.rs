//! The Q8_K activation of the K-quant packed products (`packed_q4k`): llama.cpp's
//! `quantize_row_q8_K_ref` per 256 values (d = max / −127, codes round(x / d)) with the sum
//! of each 32 codes (Q4_K's minimums multiply them) and of each 16 (Q6_K's code offset).

use crate::kquants::q8_k;
use crate::packed_layout::SUPER;

/// An activation row quantised to Q8_K: per super-block of 256 an f32 scale, 256 codes, the
/// sum of each 32 codes (i16: |Σ| ≤ 32 · 127) and of each 16 (ggml's `bsums`).
#[derive(Debug, Clone, PartialEq)]
pub struct Q8KActivation {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub bsum: Vec<i16>,
    pub bsum16: Vec<i16>,
}

/// `x` (a multiple of 256 long) quantised as `quantize_row_q8_K_ref`; a super-block holding a
/// NaN or ±Inf gets a NaN scale, so every output it feeds is NaN (ggml's max skips a NaN and
/// would quantise the rest as if it were absent).
pub fn quantize(x: &[f32]) -> Q8KActivation {
    let n = x.len() / SUPER;
    let mut act = Q8KActivation {
        q: Vec::with_capacity(n * SUPER),
        d: Vec::with_capacity(n),
        bsum: Vec::with_capacity(n * 8),
        bsum16: Vec::with_capacity(n * 16),
    };
    for block in x.chunks_exact(SUPER) {
        let (d, q, sums) = q8_k::quantize_activation(block);
        act.d.push(d);
        act.q.extend_from_slice(&q);
        act.bsum
            .extend((0..8).map(|j| sums[2 * j].wrapping_add(sums[2 * j + 1])));
        act.bsum16.extend_from_slice(&sums);
    }
    act
}

/// What the K-quant packed products multiply instead of x: d·q per value.
pub fn activation_as_seen(x: &[f32]) -> Vec<f32> {
    let act = quantize(x);
    act.q
        .iter()
        .enumerate()
        .map(|(i, &c)| c as f32 * act.d[i / SUPER])
        .collect()
}
