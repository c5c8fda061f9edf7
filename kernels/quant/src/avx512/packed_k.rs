//! The K-quant packed-tile kernels with AVX-512 VNNI (Q4_K, Q5_K, Q6_K; layouts in
//! `crate::packed_layout`, arithmetic in `crate::packed_q4k`): a 16-row tile is one zmm, a row
//! per 32-bit lane. A sub-block's (Q4_K: 32 values) or group's (Q6_K: 16) code vectors are
//! built once and serve every activation of the pass; `vpdpbusd` (u8 codes × s8 Q8_K codes)
//! sums them exactly in i32 — no i16 bound to respect, unlike `vpmaddubsw` on AVX2 — and one
//! `vpmulld` by the 16 rows' scale adds that sub-block to the super-block's integer Σ. The
//! minimum (Q4_K) and code-offset (Q6_K) terms are `vpmaddwd` of the rows' scale pairs with
//! the activation's pairs of sums, as on AVX2.

#[cfg(target_arch = "x86_64")]
use crate::act_q8k::Q8KActivation;
#[cfg(target_arch = "x86_64")]
use crate::packed_layout::{
    code_bytes, scale_bytes, Q4K_MN, Q4K_SC, Q5K_SUB, Q5_HI, Q6K_HI, Q6K_SC, Q6K_SUB, SUPER,
};
#[cfg(target_arch = "x86_64")]
use crate::WeightFormat;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Four activation bytes at `q` in every 32-bit lane.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn bcast4(q: *const i8) -> __m512i {
    _mm512_set1_epi32((q as *const i32).read_unaligned())
}

/// 16 i16 pairs (a_r, c_r), one per 32-bit lane, from the 16 bytes at `a` and at `c`
/// (widened as u8 or i8).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pairs<const SIGNED: bool>(a: *const u8, c: *const u8) -> __m512i {
    let widen = |p: *const u8| {
        let v = _mm_loadu_si128(p as *const __m128i);
        if SIGNED {
            _mm512_cvtepi8_epi32(v)
        } else {
            _mm512_cvtepu8_epi32(v)
        }
    };
    _mm512_or_si512(
        _mm512_and_si512(widen(a), _mm512_set1_epi32(0xFFFF)),
        _mm512_slli_epi32::<16>(widen(c)),
    )
}

/// Q4_K (Q5_K with `FIVE`: each sub-block's 5th bits OR-ed in from its plane, as Q5_0's
/// tile; `vpdpbusd` sums the 5-bit codes in i32 as it does the 4-bit ones): out[b][r] = row r
/// of the tile · activation b.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL, VNNI and F16C; `codes` and `scales` cover the
/// Q4_K / Q5_K tile-blocks `blocks`, and every activation those super-blocks (the caller asserts
/// it). `out` holds the sums of the blocks before these (zero for the first).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // s / b / p index register arrays in step with the loads
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
pub unsafe fn tile_q4k<const FIVE: bool, const B: usize>(
    codes: *const u8,
    scales: *const u8,
    blocks: std::ops::Range<usize>,
    acts: [&Q8KActivation; B],
    out: &mut [[f32; 16]; B],
) {
    let format = if FIVE {
        WeightFormat::Q5_K
    } else {
        WeightFormat::Q4_K
    };
    let (cb, sb) = (code_bytes(format), scale_bytes(format));
    let sub_bytes = if FIVE { Q5K_SUB } else { 256 };
    let mask = _mm512_set1_epi8(0x0F);
    // The sums so far (a multi-pass product's earlier pieces), so pieces chain exactly.
    let mut acc: [__m512; B] = std::array::from_fn(|b| _mm512_loadu_ps(out[b].as_ptr()));
    for k in blocks.clone() {
        let (blk, sc) = (codes.add(k * cb), scales.add(k * sb));
        let mut isum = [_mm512_setzero_si512(); B];
        for j in 0..8 {
            let sub = blk.add(sub_bytes * j);
            let mut w = [_mm512_setzero_si512(); 8];
            for g in 0..4 {
                let bytes = _mm512_loadu_si512(sub.add(64 * g) as *const __m512i);
                w[2 * g] = _mm512_and_si512(bytes, mask);
                w[2 * g + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(bytes), mask);
            }
            if FIVE {
                let hv = _mm512_loadu_si512(sub.add(Q5_HI) as *const __m512i);
                for (st, w) in w.iter_mut().enumerate() {
                    *w = _mm512_or_si512(*w, crate::avx512::packed::fifth_bits(hv, st));
                }
            }
            let s =
                _mm512_cvtepu8_epi32(_mm_loadu_si128(sc.add(Q4K_SC + 16 * j) as *const __m128i));
            for b in 0..B {
                let q = acts[b].q.as_ptr().add(SUPER * k + 32 * j);
                let mut dot = [_mm512_setzero_si512(); 2];
                for st in 0..8 {
                    dot[st % 2] = _mm512_dpbusd_epi32(dot[st % 2], w[st], bcast4(q.add(4 * st)));
                }
                let dot = _mm512_add_epi32(dot[0], dot[1]);
                isum[b] = _mm512_add_epi32(isum[b], _mm512_mullo_epi32(dot, s));
            }
        }
        let mut imin = [_mm512_setzero_si512(); B];
        for p in 0..4 {
            let m = pairs::<false>(
                sc.add(Q4K_MN + 16 * (2 * p)),
                sc.add(Q4K_MN + 16 * (2 * p + 1)),
            );
            for b in 0..B {
                let bs = acts[b].bsum.as_ptr().add(8 * k + 2 * p);
                let qs = _mm512_set1_epi32((bs as *const i32).read_unaligned());
                imin[b] = _mm512_add_epi32(imin[b], _mm512_madd_epi16(m, qs));
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(sc as *const __m256i));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(sc.add(32) as *const __m256i));
        for b in 0..B {
            let dx = _mm512_set1_ps(*acts[b].d.get_unchecked(k));
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[b]), _mm512_mul_ps(d, dx), acc[b]);
            acc[b] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(imin[b]), _mm512_mul_ps(dmin, dx), acc[b]);
        }
    }
    store(acc, out)
}

/// Q6_K: out[b][r] = row r of the tile · activation b.
///
/// # Safety
/// As `tile_q4k`, for Q6_K tile-blocks.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // b / p index register arrays in step with the loads
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
pub unsafe fn tile_q6k<const B: usize>(
    codes: *const u8,
    scales: *const u8,
    blocks: std::ops::Range<usize>,
    acts: [&Q8KActivation; B],
    out: &mut [[f32; 16]; B],
) {
    let (cb, sb) = (
        code_bytes(WeightFormat::Q6_K),
        scale_bytes(WeightFormat::Q6_K),
    );
    let (m4, m30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    // The sums so far (a multi-pass product's earlier pieces), so pieces chain exactly.
    let mut acc: [__m512; B] = std::array::from_fn(|b| _mm512_loadu_ps(out[b].as_ptr()));
    for k in blocks.clone() {
        let (blk, sc) = (codes.add(k * cb), scales.add(k * sb));
        let mut isum = [_mm512_setzero_si512(); B];
        for j in 0..8 {
            let sub = blk.add(Q6K_SUB * j);
            for g in 0..2 {
                let lo0 = _mm512_loadu_si512(sub.add(64 * (2 * g)) as *const __m512i);
                let lo1 = _mm512_loadu_si512(sub.add(64 * (2 * g + 1)) as *const __m512i);
                let hv = _mm512_loadu_si512(sub.add(Q6K_HI + 64 * g) as *const __m512i);
                let w = [
                    _mm512_or_si512(
                        _mm512_and_si512(lo0, m4),
                        _mm512_and_si512(_mm512_slli_epi16::<4>(hv), m30),
                    ),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(lo0), m4),
                        _mm512_and_si512(_mm512_slli_epi16::<2>(hv), m30),
                    ),
                    _mm512_or_si512(_mm512_and_si512(lo1, m4), _mm512_and_si512(hv, m30)),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(lo1), m4),
                        _mm512_and_si512(_mm512_srli_epi16::<2>(hv), m30),
                    ),
                ];
                let s = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                    sc.add(Q6K_SC + 16 * (2 * j + g)) as *const __m128i
                ));
                for b in 0..B {
                    let q = acts[b].q.as_ptr().add(SUPER * k + 32 * j + 16 * g);
                    let d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], bcast4(q));
                    let d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bcast4(q.add(4)));
                    let d0 = _mm512_dpbusd_epi32(d0, w[2], bcast4(q.add(8)));
                    let d1 = _mm512_dpbusd_epi32(d1, w[3], bcast4(q.add(12)));
                    let dot = _mm512_add_epi32(d0, d1);
                    isum[b] = _mm512_add_epi32(isum[b], _mm512_mullo_epi32(dot, s));
                }
            }
        }
        // The code offset: Σ_G s_G·Σq_G, two groups per `vpmaddwd`.
        let mut ioff = [_mm512_setzero_si512(); B];
        for p in 0..8 {
            let s = pairs::<true>(
                sc.add(Q6K_SC + 16 * (2 * p)),
                sc.add(Q6K_SC + 16 * (2 * p + 1)),
            );
            for b in 0..B {
                let bs = acts[b].bsum16.as_ptr().add(16 * k + 2 * p);
                let qs = _mm512_set1_epi32((bs as *const i32).read_unaligned());
                ioff[b] = _mm512_add_epi32(ioff[b], _mm512_madd_epi16(s, qs));
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(sc as *const __m256i));
        for b in 0..B {
            let dx = _mm512_set1_ps(*acts[b].d.get_unchecked(k));
            let tot = _mm512_sub_epi32(isum[b], _mm512_slli_epi32::<5>(ioff[b]));
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(d, dx), acc[b]);
        }
    }
    store(acc, out)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store<const B: usize>(acc: [__m512; B], out: &mut [[f32; 16]; B]) {
    for b in 0..B {
        _mm512_storeu_ps(out[b].as_mut_ptr(), acc[b]);
    }
}
