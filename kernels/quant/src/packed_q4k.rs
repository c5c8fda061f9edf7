//! The K-quant packed products (`crate::packed`'s Q4_K, Q5_K and Q6_K tiles): llama.cpp's
//! `vec_dot_q4_K_q8_K`, `vec_dot_q5_K_q8_K` and `vec_dot_q6_K_q8_K` arithmetic on 16-row
//! tiles, and the one dispatch of their bodies. The activation is quantised to Q8_K per 256 values
//! (`quantize_row_q8_K_ref`: d = max / −127, codes round(x / d)), with the sum of each 32 and
//! each 16 codes (`act_q8k`).
//! - Q4_K: per row and super-block two exact integers, Σ_j sc_j·Σ(c·q) over the 8 sub-blocks
//!   and Σ_j m_j·Σq, then d·d_x·the first − dmin·d_x·the second. Q5_K the same with 5-bit
//!   codes (each sub-block's 5th bits in a plane after its nibbles, as Q5_0's tile-block).
//! - Q6_K: one exact integer, Σ_G s_G·Σ(c − 32)·q over the 16 groups of 16 — computed as
//!   Σ_G s_G·Σc·q − 32·Σ_G s_G·Σq so the unsigned 6-bit codes feed `vpmaddubsw` directly —
//!   times d·d_x.
//!
//! The AVX2 bodies are `avx2::packed_q4k` / `avx2::packed_q6k`, the AVX-512 VNNI ones
//! `avx512::packed_k` (an AVX-512 tier without VNNI runs the AVX2 bodies), the portable ones
//! `packed_portable`.

pub use crate::act_q8k::{activation_as_seen, quantize, Q8KActivation};
use crate::packed_layout::{code_bytes, scale_bytes, SUPER, TILE};
use crate::WeightFormat;
use kernel_cpu::Isa;

/// out[b][r] += row r of one K-quant tile (`format`: Q4_K, Q5_K or Q6_K) · activation b over the
/// tile-blocks `blocks`, for up to `k_pass(isa)` activations, at tier `isa` (allowed on the
/// caller's thread); `codes` and `scales` start at the tile's first tile-block
/// (`PackedMatrix::codes(t, 0)` / `scales(t, 0)`). `out` holds the sums of the blocks before
/// `blocks` (zero for the first), so a tile walked in pieces gives the bits of one walk. The
/// one dispatch of the three formats' bodies.
pub(crate) fn tile_dot(
    format: WeightFormat,
    codes: &[u8],
    scales: &[u8],
    blocks: std::ops::Range<usize>,
    acts: &[Q8KActivation],
    out: &mut [[f32; TILE]],
    isa: Isa,
) {
    assert!(matches!(
        format,
        WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K
    ));
    assert!(!acts.is_empty() && acts.len() <= k_pass(isa) && out.len() == acts.len());
    let (cb, sb) = (code_bytes(format), scale_bytes(format));
    let nb = blocks.end;
    assert!(blocks.start <= nb && codes.len() >= nb * cb && scales.len() >= nb * sb);
    for a in acts {
        assert!(a.q.len() >= nb * SUPER && a.d.len() >= nb);
        assert!(a.bsum.len() >= nb * 8 && a.bsum16.len() >= nb * 16);
    }
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        let (codes, scales) = (codes.as_ptr(), scales.as_ptr());
        let vnni = isa.has_avx512_vnni();
        // SAFETY: the tier was allowed on the caller's thread, so the CPU has AVX2, FMA and
        // F16C (and AVX-512 VNNI where that body runs); the tile holds the tile-blocks
        // `blocks` of `format` and every activation covers them (asserted).
        unsafe {
            macro_rules! vnni {
                ($n:literal) => {{
                    let a: [&Q8KActivation; $n] = std::array::from_fn(|i| &acts[i]);
                    let o: &mut [[f32; TILE]; $n] = out.try_into().expect("asserted length");
                    let b = blocks.clone();
                    use crate::avx512::packed_k::{tile_q4k, tile_q6k};
                    match format {
                        WeightFormat::Q4_K => tile_q4k::<false, $n>(codes, scales, b, a, o),
                        WeightFormat::Q5_K => tile_q4k::<true, $n>(codes, scales, b, a, o),
                        _ => tile_q6k::<$n>(codes, scales, b, a, o),
                    }
                }};
            }
            macro_rules! avx2 {
                ($n:literal) => {{
                    let a: [&Q8KActivation; $n] = std::array::from_fn(|i| &acts[i]);
                    let o: &mut [[f32; TILE]; $n] = out.try_into().expect("asserted length");
                    let b = blocks.clone();
                    use crate::avx2::{packed_q4k, packed_q6k};
                    match format {
                        WeightFormat::Q4_K => {
                            packed_q4k::tile_dot::<false, $n>(codes, scales, b, a, o)
                        }
                        WeightFormat::Q5_K => {
                            packed_q4k::tile_dot::<true, $n>(codes, scales, b, a, o)
                        }
                        _ => packed_q6k::tile_dot::<$n>(codes, scales, b, a, o),
                    }
                }};
            }
            // Passes past 4 only where `k_pass` gives them: the VNNI bodies.
            match (vnni, acts.len()) {
                (true, 1) => vnni!(1),
                (true, 2) => vnni!(2),
                (true, 3) => vnni!(3),
                (true, 4) => vnni!(4),
                (true, 5) => vnni!(5),
                (true, 6) => vnni!(6),
                (true, 7) => vnni!(7),
                (true, _) => vnni!(8),
                (false, 1) => avx2!(1),
                (false, 2) => avx2!(2),
                (false, 3) => avx2!(3),
                (false, _) => avx2!(4),
            }
        }
        return;
    }
    let _ = isa;
    macro_rules! portable {
        ($n:literal) => {{
            let a: [&Q8KActivation; $n] = std::array::from_fn(|i| &acts[i]);
            let o: &mut [[f32; TILE]; $n] = out.try_into().expect("asserted length");
            use crate::packed_portable as p;
            match format {
                WeightFormat::Q4_K => p::tile_dot_q4k::<false, $n>(codes, scales, blocks, a, o),
                WeightFormat::Q5_K => p::tile_dot_q4k::<true, $n>(codes, scales, blocks, a, o),
                _ => p::tile_dot_q6k(codes, scales, blocks, a, o),
            }
        }};
    }
    match acts.len() {
        1 => portable!(1),
        2 => portable!(2),
        3 => portable!(3),
        _ => portable!(4),
    }
}

/// Activations per pass over a K-quant tile at tier `isa`: 8 with AVX-512 VNNI (its 32 zmm
/// registers), 4 on AVX2 and the portable tier (the portable SSE2 cores widen a code vector
/// once for the pass). An earlier measurement found 8 no faster than 4 with AVX-512 (SmolLM2
/// Q4_K_M decode at B 8/16/32), when the Q8_K quantiser took ~30% of a K-quant product; with
/// the vectorised quantiser (`act_q8k::quantize_at`), `tile_rate` at SmolLM2's ffn_down shape
/// (576 × 1536, one thread, alternated) gives Q4_K 128 → 148 GMAC/s at 5 activations and
/// 140 → 150 at 8, Q6_K 92 → 112 and 106 → 121; at 12–64 between −2% and +7%, at 512 between
/// −12% and +5% over two runs (this VM's noise at prompt sizes).
pub(crate) fn k_pass(isa: Isa) -> usize {
    if isa.has_avx512_vnni() {
        K_PASS_MAX
    } else {
        4
    }
}

/// Most activations one K-quant tile call takes.
pub(crate) const K_PASS_MAX: usize = 8;
