//! The Q4_K and Q5_K packed-tile kernel on AVX2 (layout in `crate::packed_layout`, arithmetic
//! in `crate::packed_q4k`): one 8-row half of a tile at a time, a row per 32-bit lane. Per
//! sub-block of 32, the half's 4 code vectors are unpacked into 8 nibble vectors 4 at a time,
//! each serving every activation of the pass: `vpmaddubsw` with the broadcast four activation
//! bytes of its k-step, summed in i16 over the sub-block's 8 k-steps (≤ 16 · 15 · 127 = 30480,
//! inside i16); one `vpmaddwd` with the 8 rows' scale in both i16 halves of each lane applies
//! sc and widens, so Σ_j sc_j·Σ(c·q) stays an exact i32 per super-block. The minimums are 4
//! `vpmaddwd` of the rows' (m_2p, m_2p+1) pairs with the activation's (Σq_2p, Σq_2p+1). Per
//! super-block: acc += d·d_x·Σ − dmin·d_x·Σmin. Q5_K (`FIVE`) ORs each k-step's 5th bits in
//! from its sub-block's plane (as Q5_0's tile) and, its codes ≤ 31, scales and widens the i16
//! sums per 4 k-steps instead of 8.

#[cfg(target_arch = "x86_64")]
use crate::act_q8k::Q8KActivation;
#[cfg(target_arch = "x86_64")]
use crate::avx2::packed::fifth_bits;
#[cfg(target_arch = "x86_64")]
use crate::packed_layout::{code_bytes, scale_bytes, Q4K_MN, Q4K_SC, Q5K_SUB, Q5_HI};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// out[b][r] += row r of the tile whose Q4_K (Q5_K with `FIVE`) tile-blocks `blocks` have
/// their codes at `codes` and their scales at `scales` · activation b.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `codes` and `scales` cover the Q4_K / Q5_K
/// tile-blocks `blocks`, and every activation those super-blocks (the caller asserts it).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // t / b / p index register arrays in step with the loads
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_dot<const FIVE: bool, const B: usize>(
    codes: *const u8,
    scales: *const u8,
    blocks: std::ops::Range<usize>,
    acts: [&Q8KActivation; B],
    out: &mut [[f32; 16]; B],
) {
    let format = if FIVE {
        crate::WeightFormat::Q5_K
    } else {
        crate::WeightFormat::Q4_K
    };
    let (cb, sb) = (code_bytes(format), scale_bytes(format));
    let sub_bytes = if FIVE { Q5K_SUB } else { 256 };
    let mask = _mm256_set1_epi8(0x0F);
    for h in 0..2 {
        // The sums so far (a multi-pass product's earlier pieces), so pieces chain exactly.
        let mut acc: [__m256; B] =
            std::array::from_fn(|b| _mm256_loadu_ps(out[b].as_ptr().add(8 * h)));
        for k in blocks.clone() {
            let (blk, sc) = (codes.add(k * cb + 32 * h), scales.add(k * sb));
            let mut isum = [_mm256_setzero_si256(); B];
            for j in 0..8 {
                let sub = blk.add(sub_bytes * j);
                // The 8 rows' scale of sub-block j in both i16 halves of each lane.
                let s8 = _mm_loadl_epi64(sc.add(Q4K_SC + 16 * j + 8 * h) as *const __m128i);
                let s32 = _mm256_cvtepu8_epi32(s8);
                let spair = _mm256_or_si256(s32, _mm256_slli_epi32::<16>(s32));
                let hv = if FIVE {
                    _mm256_loadu_si256(sub.add(Q5_HI) as *const __m256i)
                } else {
                    _mm256_setzero_si256()
                };
                let mut sum16 = [_mm256_setzero_si256(); B];
                for jj in 0..2 {
                    let mut w = [_mm256_setzero_si256(); 4];
                    for t in 0..2 {
                        let bytes =
                            _mm256_loadu_si256(sub.add(64 * (2 * jj + t)) as *const __m256i);
                        w[2 * t] = _mm256_and_si256(bytes, mask);
                        w[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), mask);
                    }
                    if FIVE {
                        for u in 0..4 {
                            w[u] = _mm256_or_si256(w[u], fifth_bits(hv, 4 * jj + u));
                        }
                    }
                    for b in 0..B {
                        let q = acts[b].q.as_ptr().add(256 * k + 32 * j + 16 * jj);
                        for u in 0..4 {
                            let qv =
                                _mm256_set1_epi32((q.add(4 * u) as *const i32).read_unaligned());
                            sum16[b] = _mm256_add_epi16(sum16[b], _mm256_maddubs_epi16(w[u], qv));
                        }
                    }
                    if FIVE {
                        // 5-bit codes: 4 k-steps are as many as i16 holds (4 · 2 · 31 · 127 =
                        // 31496), so each half of the sub-block is scaled and widened alone.
                        for b in 0..B {
                            isum[b] = _mm256_add_epi32(isum[b], _mm256_madd_epi16(sum16[b], spair));
                            sum16[b] = _mm256_setzero_si256();
                        }
                    }
                }
                if !FIVE {
                    for b in 0..B {
                        isum[b] = _mm256_add_epi32(isum[b], _mm256_madd_epi16(sum16[b], spair));
                    }
                }
            }
            let mut mpair = [_mm256_setzero_si256(); 4];
            for p in 0..4 {
                let m0 = _mm_loadl_epi64(sc.add(Q4K_MN + 16 * (2 * p) + 8 * h) as *const __m128i);
                let m1 =
                    _mm_loadl_epi64(sc.add(Q4K_MN + 16 * (2 * p + 1) + 8 * h) as *const __m128i);
                mpair[p] = _mm256_or_si256(
                    _mm256_cvtepu8_epi32(m0),
                    _mm256_slli_epi32::<16>(_mm256_cvtepu8_epi32(m1)),
                );
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(sc.add(16 * h) as *const __m128i));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(sc.add(32 + 16 * h) as *const __m128i));
            for b in 0..B {
                let act = acts[b];
                let bs = act.bsum.as_ptr().add(8 * k);
                let mut imin = _mm256_setzero_si256();
                for p in 0..4 {
                    let pair = _mm256_set1_epi32((bs.add(2 * p) as *const i32).read_unaligned());
                    imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mpair[p], pair));
                }
                let dx = _mm256_set1_ps(*act.d.get_unchecked(k));
                acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[b]), _mm256_mul_ps(d, dx), acc[b]);
                acc[b] =
                    _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, dx), acc[b]);
            }
        }
        for b in 0..B {
            _mm256_storeu_ps(out[b].as_mut_ptr().add(8 * h), acc[b]);
        }
    }
}
