//! The Q6_K packed-tile kernel on AVX2 (layout in `crate::packed_layout`, arithmetic in
//! `crate::packed_q4k`): one 8-row half of a tile at a time, a row per 32-bit lane. Per group
//! of 16 values (4 k-steps) the half's 4 code vectors are built once — two nibble loads split
//! into low and high nibbles, one load of the 2-bit plane shifted into bits 4..5 of each byte
//! (3 ops per k-step) — and serve every activation of the pass: `vpmaddubsw` with the
//! broadcast four activation bytes, two k-steps summed in i16 (≤ 2 · 2 · 63 · 127 = 32004,
//! inside i16), then one `vpmaddwd` with the 8 rows' i8 scale in both i16 halves of each lane
//! applies s_G and widens. The code offset is 8 `vpmaddwd` per super-block of the rows'
//! (s_2p, s_2p+1) pairs with the activation's (Σq_2p, Σq_2p+1); per super-block
//! acc += d·d_x·(Σ − 32·Σoff).

#[cfg(target_arch = "x86_64")]
use crate::act_q8k::Q8KActivation;
#[cfg(target_arch = "x86_64")]
use crate::packed_layout::{code_bytes, scale_bytes, Q6K_HI, Q6K_SC, Q6K_SUB};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The 8 i8 at `p`, each sign-extended into both i16 halves of its 32-bit lane.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scale_pairs(p: *const u8) -> __m256i {
    let s16 = _mm_cvtepi8_epi16(_mm_loadl_epi64(p as *const __m128i));
    let s32 = _mm256_cvtepu16_epi32(s16);
    _mm256_or_si256(s32, _mm256_slli_epi32::<16>(s32))
}

/// out[b][r] += row r of the tile whose Q6_K tile-blocks `blocks` have their codes at `codes`
/// and their scales at `scales` · activation b.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `codes` and `scales` cover the Q6_K
/// tile-blocks `blocks`, and every activation those super-blocks (the caller asserts it).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // b / p index register arrays in step with the loads
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_dot<const B: usize>(
    codes: *const u8,
    scales: *const u8,
    blocks: std::ops::Range<usize>,
    acts: [&Q8KActivation; B],
    out: &mut [[f32; 16]; B],
) {
    let (cb, sb) = (
        code_bytes(crate::WeightFormat::Q6_K),
        scale_bytes(crate::WeightFormat::Q6_K),
    );
    let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    for h in 0..2 {
        // The sums so far (a multi-pass product's earlier pieces), so pieces chain exactly.
        let mut acc: [__m256; B] =
            std::array::from_fn(|b| _mm256_loadu_ps(out[b].as_ptr().add(8 * h)));
        for k in blocks.clone() {
            let (blk, sc) = (codes.add(k * cb + 32 * h), scales.add(k * sb));
            let mut isum = [_mm256_setzero_si256(); B];
            for j in 0..8 {
                let sub = blk.add(Q6K_SUB * j);
                for g in 0..2 {
                    let lo0 = _mm256_loadu_si256(sub.add(64 * (2 * g)) as *const __m256i);
                    let lo1 = _mm256_loadu_si256(sub.add(64 * (2 * g + 1)) as *const __m256i);
                    let hv = _mm256_loadu_si256(sub.add(Q6K_HI + 64 * g) as *const __m256i);
                    // k-step 4g + t: its nibbles, and its 2 top bits moved from 2t..2t+2 to 4..6.
                    let w = [
                        _mm256_or_si256(
                            _mm256_and_si256(lo0, m4),
                            _mm256_and_si256(_mm256_slli_epi16::<4>(hv), m30),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(lo0), m4),
                            _mm256_and_si256(_mm256_slli_epi16::<2>(hv), m30),
                        ),
                        _mm256_or_si256(_mm256_and_si256(lo1, m4), _mm256_and_si256(hv, m30)),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(lo1), m4),
                            _mm256_and_si256(_mm256_srli_epi16::<2>(hv), m30),
                        ),
                    ];
                    let spair = scale_pairs(sc.add(Q6K_SC + 16 * (2 * j + g) + 8 * h));
                    for b in 0..B {
                        let q = acts[b].q.as_ptr().add(256 * k + 32 * j + 16 * g);
                        let qv: [__m256i; 4] = std::array::from_fn(|u| {
                            _mm256_set1_epi32((q.add(4 * u) as *const i32).read_unaligned())
                        });
                        let s01 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(w[0], qv[0]),
                            _mm256_maddubs_epi16(w[1], qv[1]),
                        );
                        let s23 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(w[2], qv[2]),
                            _mm256_maddubs_epi16(w[3], qv[3]),
                        );
                        isum[b] = _mm256_add_epi32(
                            isum[b],
                            _mm256_add_epi32(
                                _mm256_madd_epi16(s01, spair),
                                _mm256_madd_epi16(s23, spair),
                            ),
                        );
                    }
                }
            }
            // The code offset: Σ_G s_G·Σq_G, two groups per `vpmaddwd`.
            let mut ioff = [_mm256_setzero_si256(); B];
            for p in 0..8 {
                let a = _mm_cvtepi8_epi16(_mm_loadl_epi64(
                    sc.add(Q6K_SC + 16 * (2 * p) + 8 * h) as *const __m128i
                ));
                let c = _mm_cvtepi8_epi16(_mm_loadl_epi64(
                    sc.add(Q6K_SC + 16 * (2 * p + 1) + 8 * h) as *const __m128i,
                ));
                let pairs = _mm256_set_m128i(_mm_unpackhi_epi16(a, c), _mm_unpacklo_epi16(a, c));
                for b in 0..B {
                    let bs = acts[b].bsum16.as_ptr().add(16 * k + 2 * p);
                    let qs = _mm256_set1_epi32((bs as *const i32).read_unaligned());
                    ioff[b] = _mm256_add_epi32(ioff[b], _mm256_madd_epi16(pairs, qs));
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(sc.add(16 * h) as *const __m128i));
            for b in 0..B {
                let dx = _mm256_set1_ps(*acts[b].d.get_unchecked(k));
                let tot = _mm256_sub_epi32(isum[b], _mm256_slli_epi32::<5>(ioff[b]));
                acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(d, dx), acc[b]);
            }
        }
        for b in 0..B {
            _mm256_storeu_ps(out[b].as_mut_ptr().add(8 * h), acc[b]);
        }
    }
}
