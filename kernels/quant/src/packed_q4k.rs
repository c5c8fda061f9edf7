//! The Q4_K packed product (`crate::packed`'s Q4_K tiles): llama.cpp's `vec_dot_q4_K_q8_K`
//! arithmetic on 16-row tiles. The activation is quantised to Q8_K per 256 values
//! (`quantize_row_q8_K_ref`: d = max / −127, codes round(x / d)), with the sum of each 32
//! codes; per row and super-block the kernels form two exact integers, Σ_j sc_j·Σ(c·q) over
//! the 8 sub-blocks and Σ_j m_j·Σq, and add d·d_x·the first − dmin·d_x·the second. The AVX2
//! body is `avx2::packed_q4k` (the AVX-512 tiers run it too: no AVX-512 Q4_K body is written
//! that the machines here cannot run); this file holds the activation, the dispatch and the
//! plain-loop body of the portable tier.

use crate::kquants::q8_k;
use crate::packed::{PackedMatrix, Q4K_MN, Q4K_SC, SUPER, TILE};
use kernel_cpu::Isa;

/// An activation row quantised to Q8_K: per super-block of 256 an f32 scale, 256 codes and the
/// sum of each 32 codes (i16: |Σ| ≤ 32 · 127).
#[derive(Debug, Clone, PartialEq)]
pub struct Q8KActivation {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub bsum: Vec<i16>,
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
    };
    for block in x.chunks_exact(SUPER) {
        let (d, q, sums) = q8_k::quantize(block);
        let finite = block.iter().all(|v| v.is_finite());
        act.d.push(if finite { d } else { f32::NAN });
        act.q.extend_from_slice(&q);
        act.bsum
            .extend((0..8).map(|j| sums[2 * j].wrapping_add(sums[2 * j + 1])));
    }
    act
}

/// What the Q4_K packed product multiplies instead of x: d·q per value.
pub fn activation_as_seen(x: &[f32]) -> Vec<f32> {
    let act = quantize(x);
    act.q
        .iter()
        .enumerate()
        .map(|(i, &c)| c as f32 * act.d[i / SUPER])
        .collect()
}

/// out[b][r] = row 16t + r · activation b, for up to 4 activations, at tier `isa` (allowed on
/// the caller's thread).
pub(crate) fn tile_dot(
    w: &PackedMatrix,
    t: usize,
    acts: &[Q8KActivation],
    out: &mut [[f32; TILE]; 4],
    isa: Isa,
) {
    let nb = w.blocks();
    for a in acts {
        assert!(a.q.len() >= nb * SUPER && a.d.len() >= nb && a.bsum.len() >= nb * 8);
    }
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        let (codes, scales) = (w.codes(t, 0).as_ptr(), w.scales(t, 0).as_ptr());
        // SAFETY: the tier was allowed on the caller's thread, so the CPU has AVX2, FMA and
        // F16C; the tile holds `nb` tile-blocks and every activation covers them (asserted).
        unsafe {
            macro_rules! go {
                ($n:literal) => {{
                    let a: [&Q8KActivation; $n] = std::array::from_fn(|i| &acts[i]);
                    out[..$n].copy_from_slice(&crate::avx2::packed_q4k::tile_dot::<$n>(
                        codes, scales, nb, a,
                    ));
                }};
            }
            match acts.len() {
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                _ => go!(4),
            }
        }
        return;
    }
    let _ = isa;
    for (b, act) in acts.iter().enumerate() {
        out[b] = tile_dot_portable(w, t, act);
    }
}

/// The 16 rows of tile t against one activation, in plain loops.
fn tile_dot_portable(w: &PackedMatrix, t: usize, act: &Q8KActivation) -> [f32; TILE] {
    let mut acc = [0.0f32; TILE];
    for k in 0..w.blocks() {
        let (codes, sc) = (w.codes(t, k), w.scales(t, k));
        let q = &act.q[k * SUPER..(k + 1) * SUPER];
        let dx = act.d[k];
        for (r, a) in acc.iter_mut().enumerate() {
            let (mut isum, mut imin) = (0i32, 0i32);
            for j in 0..8 {
                let sub = &codes[256 * j..256 * (j + 1)];
                let mut dot = 0i32;
                for s in 0..8 {
                    for b in 0..4 {
                        let byte = sub[64 * (s / 2) + 4 * r + b];
                        let c = if s % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                        dot += c as i32 * q[32 * j + 4 * s + b] as i32;
                    }
                }
                isum += sc[Q4K_SC + TILE * j + r] as i32 * dot;
                imin += sc[Q4K_MN + TILE * j + r] as i32 * act.bsum[8 * k + j] as i32;
            }
            let d = crate::ggml::f16_at(&sc[2 * r..]);
            let dmin = crate::ggml::f16_at(&sc[32 + 2 * r..]);
            *a += d * dx * isum as f32;
            *a -= dmin * dx * imin as f32;
        }
    }
    acc
}
