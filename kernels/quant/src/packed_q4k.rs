//! The Q4_K packed product (`crate::packed`'s Q4_K tiles): llama.cpp's `vec_dot_q4_K_q8_K`
//! arithmetic on 16-row tiles. The activation is quantised to Q8_K per 256 values
//! (`quantize_row_q8_K_ref`: d = max / −127, codes round(x / d)), with the sum of each 32
//! codes; per row and super-block the kernels form two exact integers, Σ_j sc_j·Σ(c·q) over
//! the 8 sub-blocks and Σ_j m_j·Σq, and add d·d_x·the first − dmin·d_x·the second. The AVX2
//! body is `avx2::packed_q4k`, the AVX-512 VNNI one `avx512::packed_k` (an AVX-512 tier
//! without VNNI runs the AVX2 body); this file holds the dispatch of both K-quant tiles (Q4_K,
//! Q6_K) and the Q4_K plain-loop body of the portable tier.

pub use crate::act_q8k::{activation_as_seen, quantize, Q8KActivation};
use crate::packed_layout::{code_bytes, scale_bytes, Q4K_MN, Q4K_SC, SUPER, TILE};
use crate::WeightFormat;
use kernel_cpu::Isa;

/// out[b][r] = row r of one K-quant tile (`format`: Q4_K or Q6_K) · activation b, for up to
/// 4 activations, at tier `isa` (allowed on the caller's thread); `codes` and `scales` start
/// at the tile's first tile-block and hold its `nb` tile-blocks (`PackedMatrix::codes(t, 0)` /
/// `scales(t, 0)`). The one dispatch of both formats' bodies.
pub(crate) fn tile_dot(
    format: WeightFormat,
    codes: &[u8],
    scales: &[u8],
    nb: usize,
    acts: &[Q8KActivation],
    out: &mut [[f32; TILE]; 4],
    isa: Isa,
) {
    assert!(matches!(format, WeightFormat::Q4_K | WeightFormat::Q6_K));
    let q6 = format == WeightFormat::Q6_K;
    let (cb, sb) = (code_bytes(format), scale_bytes(format));
    assert!(codes.len() >= nb * cb && scales.len() >= nb * sb);
    for a in acts {
        assert!(a.q.len() >= nb * SUPER && a.d.len() >= nb);
        assert!(a.bsum.len() >= nb * 8 && a.bsum16.len() >= nb * 16);
    }
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        let (codes, scales) = (codes.as_ptr(), scales.as_ptr());
        let vnni = isa.has_avx512_vnni();
        // SAFETY: the tier was allowed on the caller's thread, so the CPU has AVX2, FMA and
        // F16C (and AVX-512 VNNI where that body runs); the tile holds `nb` tile-blocks of
        // `format` and every activation covers them (asserted).
        unsafe {
            macro_rules! go {
                ($n:literal) => {{
                    let a: [&Q8KActivation; $n] = std::array::from_fn(|i| &acts[i]);
                    out[..$n].copy_from_slice(&match (q6, vnni) {
                        (false, true) => {
                            crate::avx512::packed_k::tile_q4k::<$n>(codes, scales, nb, a)
                        }
                        (true, true) => {
                            crate::avx512::packed_k::tile_q6k::<$n>(codes, scales, nb, a)
                        }
                        (false, false) => {
                            crate::avx2::packed_q4k::tile_dot::<$n>(codes, scales, nb, a)
                        }
                        (true, false) => {
                            crate::avx2::packed_q6k::tile_dot::<$n>(codes, scales, nb, a)
                        }
                    });
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
        out[b] = if q6 {
            crate::packed_q6k::tile_dot_portable(codes, scales, nb, act)
        } else {
            tile_dot_portable(codes, scales, nb, act)
        };
    }
}

/// The 16 rows of one tile against one activation, in plain loops.
fn tile_dot_portable(codes: &[u8], scales: &[u8], nb: usize, act: &Q8KActivation) -> [f32; TILE] {
    let (cb, sb) = (
        code_bytes(WeightFormat::Q4_K),
        scale_bytes(WeightFormat::Q4_K),
    );
    let mut acc = [0.0f32; TILE];
    for k in 0..nb {
        let (codes, sc) = (&codes[k * cb..], &scales[k * sb..]);
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
