//! The int8-activation GEMV on AVX2 (llama.cpp's `ggml_vec_dot_q4_0_q8_0` / `q4_1_q8_1` /
//! `q8_0_q8_0` AVX2 bodies, for R rows at a time): per 32-value chunk and row, the codes as 32
//! bytes, `vpmaddubsw` (u8 × s8 pairs summed to i16) then `vpmaddwd` by ones (i16 pairs to 8 ×
//! i32), one convert and one FMA with a·d_x.
//!
//! `vpmaddubsw` takes one unsigned operand, so codes with an offset are made exact signed bytes
//! first — c − offset for Q4_0 and symmetric int4 (−8..7), c − zero for asymmetric int4
//! (−15..15), c − 128 for symmetric int8, Q8_0's own signed bytes — and multiplied by the
//! sign trick: |s| (unsigned) × (q with s's sign), as llama.cpp does. Its i16 pair sums cannot
//! saturate: |s| ≤ 128, |q| ≤ 127, so a pair is at most 32512. Q4_1's codes (0..15, no offset)
//! go in unsigned as they are; its minimum adds m·d_x·Σq per block (`Q8Activation::sum`).
//! Asymmetric int8 (c − zero spans −255..255, not a byte) widens to i16 and uses `vpmaddwd`
//! directly. Every lane holds an exact integer before conversion, as in the VNNI kernel.

#[cfg(target_arch = "x86_64")]
use super::hsum;
#[cfg(target_arch = "x86_64")]
use crate::act_q8::Q8Activation;
#[cfg(target_arch = "x86_64")]
use crate::plan::{Affine, BlockPlan, Header};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// How a format's codes become an exact integer dot with the activation bytes.
#[cfg(target_arch = "x86_64")]
mod mode {
    /// Unsigned 4-bit codes without offset (Q4_1): `vpmaddubsw` directly.
    pub const UNSIGNED: u8 = 0;
    /// c − offset (or zero point) fits a signed byte: the sign trick.
    pub const SIGNED_BYTE: u8 = 1;
    /// Asymmetric int8: widened to i16.
    pub const WIDE: u8 = 2;
}

/// y_r for R ≤ 8 rows against one quantised activation.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (`Isa::has_avx2`) and `act_q8::supports(plan)`; rows
/// hold `nblocks` blocks of the plan and the activation covers them.
#[cfg(target_arch = "x86_64")]
pub unsafe fn rows_dot_q8<const R: usize>(
    plan: &BlockPlan,
    rows: [&[u8]; R],
    nblocks: usize,
    act: &Q8Activation,
) -> [f32; R] {
    assert!(R <= 8 && act.q.len() >= nblocks * plan.values);
    for r in rows {
        assert!(r.len() >= nblocks * plan.bytes);
    }
    let ptrs = rows.map(|r| r.as_ptr());
    use crate::format::ScaleType;
    use crate::plan::{ScaleMinF16, ScaleOnly, ScaleZeroByte};
    use mode::*;
    match (plan.header, plan.bits) {
        (Header::ScaleMin, _) => {
            impl_q8::<ScaleMinF16, 4, UNSIGNED, true, R>(plan, ptrs, nblocks, act)
        }
        (Header::Scale(ScaleType::F16), 4) => {
            impl_q8::<ScaleOnly<false>, 4, SIGNED_BYTE, false, R>(plan, ptrs, nblocks, act)
        }
        (Header::Scale(ScaleType::F32), 4) => {
            impl_q8::<ScaleOnly<true>, 4, SIGNED_BYTE, false, R>(plan, ptrs, nblocks, act)
        }
        (Header::Scale(ScaleType::F16), _) => {
            impl_q8::<ScaleOnly<false>, 8, SIGNED_BYTE, false, R>(plan, ptrs, nblocks, act)
        }
        (Header::Scale(ScaleType::F32), _) => {
            impl_q8::<ScaleOnly<true>, 8, SIGNED_BYTE, false, R>(plan, ptrs, nblocks, act)
        }
        (Header::ScaleZero(ScaleType::F16), 4) => {
            impl_q8::<ScaleZeroByte<false>, 4, SIGNED_BYTE, false, R>(plan, ptrs, nblocks, act)
        }
        (Header::ScaleZero(ScaleType::F32), 4) => {
            impl_q8::<ScaleZeroByte<true>, 4, SIGNED_BYTE, false, R>(plan, ptrs, nblocks, act)
        }
        (Header::ScaleZero(ScaleType::F16), _) => {
            impl_q8::<ScaleZeroByte<false>, 8, WIDE, false, R>(plan, ptrs, nblocks, act)
        }
        (Header::ScaleZero(ScaleType::F32), _) => {
            impl_q8::<ScaleZeroByte<true>, 8, WIDE, false, R>(plan, ptrs, nblocks, act)
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn impl_q8<H: Affine, const BITS: u32, const MODE: u8, const MIN: bool, const R: usize>(
    plan: &BlockPlan,
    rows: [*const u8; R],
    nblocks: usize,
    act: &Q8Activation,
) -> [f32; R] {
    let (values, bytes, header) = (plan.values, plan.bytes, plan.header_bytes);
    let chunk_bytes = if BITS == 4 { 16 } else { 32 };
    let nib = _mm256_set1_epi8(0x0F);
    // Low nibbles in the low 128-bit half, high nibbles (shifted down by 4) in the high half,
    // from one broadcast load: no cross-lane shuffle.
    let nibble_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    // Σ m·(d_x·Σq), lane r for row r (Q4_1's minimum).
    let mut acc_min = _mm256_setzero_ps();
    let ahead = R * nblocks * bytes;
    // Q8_0's codes are signed already (offset 0); the others are unsigned with an offset.
    let signed8 = plan.signed8;
    for blk in 0..nblocks {
        let mut heads = [std::ptr::null::<u8>(); R];
        let mut offset = [_mm256_setzero_si256(); R];
        for r in 0..R {
            heads[r] = rows[r].add(blk * bytes);
            _mm_prefetch::<_MM_HINT_T0>(rows[r].wrapping_add(ahead + blk * bytes) as *const i8);
            if MODE != mode::UNSIGNED && !signed8 {
                let off = plan.offset as i32 + H::zero(heads[r]);
                offset[r] = if MODE == mode::WIDE {
                    _mm256_set1_epi16(off as i16)
                } else {
                    _mm256_set1_epi8(off as u8 as i8)
                };
            }
        }
        let (scales, mins) = H::affine8::<R>(heads);
        for c in 0..values / 32 {
            let at = blk * values + c * 32;
            let xq = _mm256_loadu_si256(act.q.as_ptr().add(at) as *const __m256i);
            let dx = *act.d.get_unchecked(at / 32);
            let ad = _mm256_mul_ps(scales, _mm256_set1_ps(dx));
            if MIN {
                let sx = _mm256_set1_ps(*act.sum.get_unchecked(at / 32));
                acc_min = _mm256_fmadd_ps(mins, sx, acc_min);
            }
            for r in 0..R {
                let p = heads[r].add(header + c * chunk_bytes);
                let dot = if MODE == mode::WIDE {
                    // Asymmetric int8: (c − zero) as i16 against q as i16.
                    let lo = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
                    let hi = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16) as *const __m128i));
                    let qlo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(xq));
                    let qhi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(xq));
                    _mm256_add_epi32(
                        _mm256_madd_epi16(_mm256_sub_epi16(lo, offset[r]), qlo),
                        _mm256_madd_epi16(_mm256_sub_epi16(hi, offset[r]), qhi),
                    )
                } else {
                    let codes = if BITS == 4 {
                        let b = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
                        _mm256_and_si256(_mm256_srlv_epi32(b, nibble_shift), nib)
                    } else {
                        _mm256_loadu_si256(p as *const __m256i)
                    };
                    let pairs = if MODE == mode::UNSIGNED {
                        _mm256_maddubs_epi16(codes, xq)
                    } else {
                        // Exact signed bytes: c − offset (wrapping byte arithmetic is exact
                        // because the result fits), or Q8_0's codes themselves.
                        let s = if signed8 {
                            codes
                        } else {
                            _mm256_sub_epi8(codes, offset[r])
                        };
                        _mm256_maddubs_epi16(_mm256_sign_epi8(s, s), _mm256_sign_epi8(xq, s))
                    };
                    _mm256_madd_epi16(pairs, ones)
                };
                // Lane r of a·d_x to every lane (one shuffle).
                let scale = _mm256_permutevar8x32_ps(ad, _mm256_set1_epi32(r as i32));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
            }
        }
    }
    let mut mins = [0.0f32; 8];
    _mm256_storeu_ps(mins.as_mut_ptr(), acc_min);
    let mut out = [0.0f32; R];
    for r in 0..R {
        out[r] = hsum(acc[r]) + mins[r];
    }
    out
}
