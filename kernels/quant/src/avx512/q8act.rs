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
//!
//! The product is exact for the quantised activation: the result equals the f64 product of the
//! dequantised weights with `activation_as_seen(x)` within f32 rounding, and its distance from
//! the product with x itself is the activation quantisation error, reported separately.

#[cfg(target_arch = "x86_64")]
use super::Affine;
use super::{BlockPlan, Header};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Whether this CPU runs the kernel (AVX-512 F/BW/VL with VNNI, F16C, FMA).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::available()
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether `plan`'s format fits: 4-bit or 8-bit codes in groups of whole 32-value chunks
/// (Q4_1's minimum included).
pub fn supports(plan: &BlockPlan) -> bool {
    matches!(plan.bits, 4 | 8) && plan.values.is_multiple_of(32)
}

/// An activation quantised per 32 values: codes in the order the weights' codes come in.
#[derive(Debug, Clone)]
pub struct Q8Activation {
    /// int8 codes, permuted within each 32-value chunk like `BlockPlan::permute_activation`.
    pub q: Vec<i8>,
    /// Scale of each 32-value chunk.
    pub d: Vec<f32>,
    /// d · Σq of each 32-value chunk: the chunk's sum as the kernel sees it.
    pub sum: Vec<f32>,
}

/// Quantises `x` (a multiple of 32 long) for `plan`.
pub fn quantize_activation(plan: &BlockPlan, x: &[f32]) -> Q8Activation {
    let mut q = Vec::with_capacity(x.len());
    let mut d = vec![];
    let mut sum = vec![];
    for chunk in x.chunks(32) {
        let amax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let codes: Vec<i8> = chunk.iter().map(|&v| (v * inv).round() as i8).collect();
        d.push(scale);
        sum.push(scale * codes.iter().map(|&c| c as i32).sum::<i32>() as f32);
        q.extend(codes);
    }
    // 4-bit codes arrive as 16 low nibbles then 16 high nibbles per 32 values.
    let order = plan.permute_activation(&(0..x.len()).map(|i| i as f32).collect::<Vec<_>>());
    let q = if plan.bits == 4 {
        order.iter().map(|&i| q[i as usize]).collect()
    } else {
        q
    };
    Q8Activation { q, d, sum }
}

/// What the kernel multiplies instead of x: d·q per value, in natural order.
pub fn activation_as_seen(x: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for chunk in x.chunks(32) {
        let amax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        out.extend(
            chunk
                .iter()
                .map(|&v| ((v * inv).round() as i8) as f32 * scale),
        );
    }
    out
}

/// y_r for R rows against one quantised activation.
///
/// # Safety
/// `available()` must hold and `supports(plan)`; rows hold `nblocks` blocks of the plan and the
/// activation covers them.
#[cfg(target_arch = "x86_64")]
pub unsafe fn rows_dot_q8<const R: usize>(
    plan: &BlockPlan,
    rows: [&[u8]; R],
    nblocks: usize,
    act: &Q8Activation,
) -> [f32; R] {
    assert!(act.q.len() >= nblocks * plan.values);
    for r in rows {
        assert!(r.len() >= nblocks * plan.bytes);
    }
    let ptrs = rows.map(|r| r.as_ptr());
    use super::{ScaleMinF16, ScaleOnly, ScaleZeroByte};
    use crate::format::ScaleType;
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
    let flip = _mm256_set1_epi8(-128);
    let mut acc = [_mm256_setzero_ps(); R];
    // Σ m·(d_x·Σq) per row, for Q4_1's minimum.
    let mut acc_min = [0.0f32; R];
    let ahead = R * nblocks * bytes;
    for blk in 0..nblocks {
        let mut scale = [0.0f32; R];
        let mut min = [0.0f32; R];
        let mut offset = [_mm256_setzero_si256(); R];
        for r in 0..R {
            let p = rows[r].add(blk * bytes);
            _mm_prefetch::<_MM_HINT_T0>(rows[r].wrapping_add(ahead + blk * bytes) as *const i8);
            (scale[r], min[r]) = H::affine(p);
            // Signed Q8_0 codes are flipped to unsigned (c + 128) below.
            let off = plan.offset as i32 + H::zero(p) + if SIGNED { 128 } else { 0 };
            offset[r] = _mm256_set1_epi8(off as u8 as i8);
        }
        for c in 0..values / 32 {
            let at = blk * values + c * 32;
            let xq = _mm256_loadu_si256(act.q.as_ptr().add(at) as *const __m256i);
            let dx = *act.d.get_unchecked(at / 32);
            if MIN {
                let sx = *act.sum.get_unchecked(at / 32);
                for r in 0..R {
                    acc_min[r] += min[r] * sx;
                }
            }
            for r in 0..R {
                let p = rows[r].add(blk * bytes + header + c * chunk_bytes);
                let codes = if BITS == 4 {
                    let b = _mm_loadu_si128(p as *const __m128i);
                    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(b), b);
                    _mm256_and_si256(both, nib)
                } else if SIGNED {
                    _mm256_xor_si256(_mm256_loadu_si256(p as *const __m256i), flip)
                } else {
                    _mm256_loadu_si256(p as *const __m256i)
                };
                let zero = _mm256_setzero_si256();
                let dot = _mm256_sub_epi32(
                    _mm256_dpbusd_epi32(zero, codes, xq),
                    _mm256_dpbusd_epi32(zero, offset[r], xq),
                );
                let ad = _mm256_set1_ps(scale[r] * dx);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), ad, acc[r]);
            }
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        let v = acc[r];
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        out[r] = _mm_cvtss_f32(s) + acc_min[r];
    }
    out
}
