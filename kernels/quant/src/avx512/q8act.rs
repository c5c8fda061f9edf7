//! The int8-activation GEMV, llama.cpp's CPU path for quantised weights
//! (`ggml_vec_dot_q4_0_q8_0` and friends): the activation is quantised per 32 values to int8
//! with an f32 scale (d = max|x| / 127, q = round(x / d), as Q8_0), and each 32-weight chunk
//! becomes one integer dot product, `vpdpbusd` (AVX-512 VNNI: u8 codes × s8 activations, summed
//! in i32 lanes), then one FMA of its 8 lanes with a·d_x. The code offset (8 for Q4_0, the zero
//! point of an asymmetric group, 128 for 8-bit codes) is taken off lane by lane with a second
//! `vpdpbusd` of the offset against the same activation bytes, so every lane holds the small
//! exact Σ(c − offset)·q of its four values before conversion. (A first version put −offset·Σq
//! into lane 0 of the dot's start instead: the lanes then held large values that cancel only in
//! the final sum, and the f32 rounding of a·d_x times them cost 14× the error of the float path,
//! 8e-7 vs 6e-8 relative, with a 3e4 outlier weight.) The float path (`gemv`) spends a widen, a
//! mask or shift, a convert and an FMA per 16 weights; this one a mask or shift and two dot
//! instructions per 32.
//!
//! Q4_1's additive minimum m (w = d·c + m) contributes m·Σx per block; with the quantised
//! activation that is m·d_x·Σq, and d_x·Σq is computed once per 32-value chunk with the
//! activation (`Q8Activation::sum`), so each row adds one scalar product per block.
//! The activation is `crate::act_q8::Q8Activation`.

#[cfg(target_arch = "x86_64")]
use crate::act_q8::Q8Activation;
#[cfg(target_arch = "x86_64")]
use crate::plan::{Affine, BlockPlan, Header};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// y_r for R rows against one quantised activation.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL and VNNI (`Isa::has_avx512_vnni`), `supports(plan)`; rows hold `nblocks` blocks of the plan and the
/// activation covers them.
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
    macro_rules! go {
        ($h:ty) => {
            match (plan.bits, plan.signed8) {
                (4, _) => impl_q8::<$h, 4, false, false, R>(plan, ptrs, nblocks, act),
                (_, true) => impl_q8::<$h, 8, true, false, R>(plan, ptrs, nblocks, act),
                _ => impl_q8::<$h, 8, false, false, R>(plan, ptrs, nblocks, act),
            }
        };
    }
    match plan.header {
        Header::Scale(ScaleType::F16) => go!(ScaleOnly<false>),
        Header::Scale(ScaleType::F32) => go!(ScaleOnly<true>),
        Header::ScaleZero(ScaleType::F16) => go!(ScaleZeroByte<false>),
        Header::ScaleZero(ScaleType::F32) => go!(ScaleZeroByte<true>),
        // Q4_1: 4-bit codes, w = d·c + m.
        Header::ScaleMin => impl_q8::<ScaleMinF16, 4, false, true, R>(plan, ptrs, nblocks, act),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
unsafe fn impl_q8<
    H: Affine,
    const BITS: u32,
    const SIGNED: bool,
    const MIN: bool,
    const R: usize,
>(
    plan: &BlockPlan,
    rows: [*const u8; R],
    nblocks: usize,
    act: &Q8Activation,
) -> [f32; R] {
    let (values, bytes, header) = (plan.values, plan.bytes, plan.header_bytes);
    let chunk_bytes = if BITS == 4 { 16 } else { 32 };
    let nib = _mm256_set1_epi8(0x0F);
    // Low nibbles in the low 128-bit half, high nibbles in the high half, from one broadcast
    // load (no cross-lane shuffle).
    let nibble_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    let flip = _mm256_set1_epi8(-128);
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); R];
    // Σ m·(d_x·Σq), lane r for row r (Q4_1's minimum).
    let mut acc_min = _mm256_setzero_ps();
    let ahead = R * nblocks * bytes;
    // The offset is the same for every row unless the format has zero points: then its dot
    // with the activation is taken once per chunk for all rows.
    let shared_offset = !H::HAS_B || MIN;
    let base_offset = plan.offset as i32 + if SIGNED { 128 } else { 0 };
    for blk in 0..nblocks {
        let mut heads = [std::ptr::null::<u8>(); R];
        let mut offset = [_mm256_setzero_si256(); R];
        for r in 0..R {
            heads[r] = rows[r].add(blk * bytes);
            _mm_prefetch::<_MM_HINT_T0>(rows[r].wrapping_add(ahead + blk * bytes) as *const i8);
            if !shared_offset {
                // Signed Q8_0 codes are flipped to unsigned (c + 128) below.
                let off = base_offset + H::zero(heads[r]);
                offset[r] = _mm256_set1_epi8(off as u8 as i8);
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
            let shared = if shared_offset && base_offset != 0 {
                _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(base_offset as u8 as i8), xq)
            } else {
                zero
            };
            for r in 0..R {
                let p = heads[r].add(header + c * chunk_bytes);
                let codes = if BITS == 4 {
                    let b = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
                    _mm256_and_si256(_mm256_srlv_epi32(b, nibble_shift), nib)
                } else if SIGNED {
                    _mm256_xor_si256(_mm256_loadu_si256(p as *const __m256i), flip)
                } else {
                    _mm256_loadu_si256(p as *const __m256i)
                };
                let off = if shared_offset {
                    shared
                } else {
                    _mm256_dpbusd_epi32(zero, offset[r], xq)
                };
                let dot = _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, codes, xq), off);
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
        let v = acc[r];
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        out[r] = _mm_cvtss_f32(s) + mins[r];
    }
    out
}
