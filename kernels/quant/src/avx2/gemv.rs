//! The B = 1 kernel on AVX2: y_r = Σ_k w_rk·x_k for R rows, the algorithm of
//! `avx512::gemv` in 8 lanes. Per block and row, bacc_r = Σ c·x lane-wise; the block's x summed
//! lane-wise (xv) is shared by the R rows; then acc_r += a_r·(bacc_r − offset·xv) and, when the
//! header has b, acc_r += b_r·xv. One horizontal sum per row at the end.
//!
//! Loop order for 16 registers: per half-chunk the activation vectors are loaded once (one per
//! code in a byte), then each row's 8 bytes are widened and multiplied against them, so only
//! one row's codes are live at a time.

#[cfg(target_arch = "x86_64")]
use super::{codes8, hsum, widen8};
#[cfg(target_arch = "x86_64")]
use crate::plan::{Affine, BlockPlan};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// y_r = Σ_k w_rk·x_k for R rows of packed bytes; `xs` is `plan.permute_activation(x)`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (`Isa::has_avx2`).
#[cfg(target_arch = "x86_64")]
pub unsafe fn rows_dot<const R: usize>(
    plan: &BlockPlan,
    rows: [&[u8]; R],
    nblocks: usize,
    xs: &[f32],
) -> [f32; R] {
    assert!(R <= 8 && xs.len() >= nblocks * plan.values);
    for r in rows {
        assert!(r.len() >= nblocks * plan.bytes);
    }
    let ptrs = rows.map(|r| r.as_ptr());
    let x = xs.as_ptr();
    crate::plan::dispatch!(plan, rows_dot_impl, [R], plan, ptrs, nblocks, x)
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // k / h index register arrays in step with the loads
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_dot_impl<H: Affine, const BITS: u32, const SIGNED: bool, const R: usize>(
    plan: &BlockPlan,
    rows: [*const u8; R],
    nblocks: usize,
    xs: *const f32,
) -> [f32; R] {
    let per_byte = (8 / BITS) as usize;
    let chunk = 16 * per_byte;
    let neg_offset = _mm256_set1_ps(-plan.offset);
    let (values, bytes, header) = (plan.values, plan.bytes, plan.header_bytes);
    let mut acc = [_mm256_setzero_ps(); R];
    // The next R rows follow these in memory: fetch them while these are computed.
    let ahead = R * nblocks * bytes;
    for blk in 0..nblocks {
        for row in rows {
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(ahead + blk * bytes) as *const i8);
        }
        let xb = xs.add(blk * values);
        let mut xv = _mm256_setzero_ps();
        let mut bacc = [_mm256_setzero_ps(); R];
        for c in 0..values / chunk {
            for h in 0..2 {
                // Plain loops, not closures: a closure does not inherit the target features.
                let mut xk = [_mm256_setzero_ps(); 4];
                for k in 0..per_byte {
                    xk[k] = _mm256_loadu_ps(xb.add(c * chunk + 16 * k + 8 * h));
                    xv = _mm256_add_ps(xv, xk[k]);
                }
                for r in 0..R {
                    let wide = widen8::<SIGNED>(rows[r].add(blk * bytes + header + c * 16 + 8 * h));
                    for k in 0..per_byte {
                        bacc[r] = _mm256_fmadd_ps(codes8::<BITS>(wide, k as u32), xk[k], bacc[r]);
                    }
                }
            }
        }
        let mut heads = [std::ptr::null::<u8>(); R];
        for r in 0..R {
            heads[r] = rows[r].add(blk * bytes);
        }
        let (av, bv) = H::affine8::<R>(heads);
        for r in 0..R {
            let lane = _mm256_set1_epi32(r as i32);
            let t = _mm256_fmadd_ps(neg_offset, xv, bacc[r]);
            acc[r] = _mm256_fmadd_ps(t, _mm256_permutevar8x32_ps(av, lane), acc[r]);
            if H::HAS_B {
                acc[r] = _mm256_fmadd_ps(xv, _mm256_permutevar8x32_ps(bv, lane), acc[r]);
            }
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        out[r] = hsum(acc[r]);
    }
    out
}

/// y_r = Σ_k w_rk·x_k for R rows of little-endian f16 weights (`vcvtph2ps` then FMA).
///
/// # Safety
/// As `rows_dot`; every row holds `x.len()` f16 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_rows_dot<const R: usize>(rows: [&[u8]; R], x: &[f32]) -> [f32; R] {
    let n = x.len();
    for r in rows {
        assert!(r.len() >= 2 * n);
    }
    let mut acc = [_mm256_setzero_ps(); R];
    let full = n / 8 * 8;
    for k in (0..full).step_by(8) {
        let xv = _mm256_loadu_ps(x.as_ptr().add(k));
        if k % 32 == 0 {
            for row in rows {
                let p = row.as_ptr().wrapping_add(R * 2 * n + 2 * k);
                _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            }
        }
        for r in 0..R {
            let h = _mm_loadu_si128(rows[r].as_ptr().add(2 * k) as *const __m128i);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(h), xv, acc[r]);
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        let mut s = hsum(acc[r]);
        for (k, xv) in x.iter().enumerate().skip(full) {
            s += crate::ggml::f16_at(&rows[r][2 * k..]) * xv;
        }
        out[r] = s;
    }
    out
}
