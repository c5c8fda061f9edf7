//! The B = 1 kernel: y_r = Σ_k w_rk·x_k for R rows. Per block and row, bacc_r = Σ (c − offset)·x
//! lane-wise, started from the shared vector −offset·xv (xv = the block's x summed lane-wise,
//! computed once for all R rows); then acc_r += a_r·bacc_r and, when the header has b,
//! bacc_b_r += b_r·xv. One horizontal sum per row at the end.
//!
//! Measured on the 2-core Zen 4 (Q4_0, 4096×4096, criterion, W in L3): the first version added
//! (b − a·offset)·Σx as a scalar per row and block, and the compiler packed the R rows' scalars
//! into xmm lanes with shuffles: that part took half the samples (687 µs → 609 µs after).

#[cfg(target_arch = "x86_64")]
use super::{codes, widen};
#[cfg(target_arch = "x86_64")]
use crate::plan::{Affine, BlockPlan};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// y_r = Σ_k w_rk·x_k for R rows of packed bytes; `xs` is `plan.permute_activation(x)`.
///
/// # Safety
/// The CPU must have AVX-512F/BW, F16C and FMA (`Isa::has_avx512`).
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
#[target_feature(enable = "avx512f,avx512bw,f16c,fma")]
unsafe fn rows_dot_impl<H: Affine, const BITS: u32, const SIGNED: bool, const R: usize>(
    plan: &BlockPlan,
    rows: [*const u8; R],
    nblocks: usize,
    xs: *const f32,
) -> [f32; R] {
    let per_byte = 8 / BITS;
    let chunk = 16 * per_byte as usize;
    let neg_offset = _mm512_set1_ps(-plan.offset);
    let (values, bytes, header) = (plan.values, plan.bytes, plan.header_bytes);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut acc_b = [_mm512_setzero_ps(); R];
    // The next R rows follow these in memory: fetch them while these are computed (each
    // row's 4-row group is a short stream the hardware prefetcher barely ramps up on).
    let ahead = R * nblocks * bytes;
    for blk in 0..nblocks {
        for row in rows {
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(ahead + blk * bytes) as *const i8);
        }
        let xb = xs.add(blk * values);
        let mut xv = _mm512_setzero_ps();
        let mut bacc = [_mm512_setzero_ps(); R];
        for c in 0..values / chunk {
            // Plain loops, not `array::from_fn`: a closure is a function of its own, without
            // this function's target features, so the intrinsics inside it are not inlined.
            let mut wide = [_mm512_setzero_si512(); R];
            for r in 0..R {
                wide[r] = widen::<SIGNED>(rows[r].add(blk * bytes + header + c * 16));
            }
            for k in 0..per_byte {
                let xk = _mm512_loadu_ps(xb.add(c * chunk + 16 * k as usize));
                xv = _mm512_add_ps(xv, xk);
                for r in 0..R {
                    bacc[r] = _mm512_fmadd_ps(codes::<BITS>(wide[r], k), xk, bacc[r]);
                }
            }
        }
        let shift = _mm512_mul_ps(neg_offset, xv);
        let mut heads = [std::ptr::null::<u8>(); R];
        for r in 0..R {
            heads[r] = rows[r].add(blk * bytes);
        }
        // The R rows' headers in one conversion (`Affine::affine8`), each lane broadcast by
        // one permute: reading them one by one was a `vpinsrw` and a broadcast per row.
        let (av, bv) = H::affine8::<R>(heads);
        let (av, bv) = (_mm512_castps256_ps512(av), _mm512_castps256_ps512(bv));
        for r in 0..R {
            let lane = _mm512_set1_epi32(r as i32);
            let t = _mm512_add_ps(bacc[r], shift);
            acc[r] = _mm512_fmadd_ps(t, _mm512_permutexvar_ps(lane, av), acc[r]);
            if H::HAS_B {
                acc_b[r] = _mm512_fmadd_ps(xv, _mm512_permutexvar_ps(lane, bv), acc_b[r]);
            }
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc_b[r]));
    }
    out
}

/// y_r = Σ_k w_rk·x_k for R rows of little-endian f16 weights (`vcvtph2ps` then FMA).
///
/// # Safety
/// As `rows_dot`; every row holds `x.len()` f16 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,f16c,fma")]
pub unsafe fn f16_rows_dot<const R: usize>(rows: [&[u8]; R], x: &[f32]) -> [f32; R] {
    let n = x.len();
    for r in rows {
        assert!(r.len() >= 2 * n);
    }
    let mut acc = [_mm512_setzero_ps(); R];
    let full = n / 16 * 16;
    for k in (0..full).step_by(16) {
        let xv = _mm512_loadu_ps(x.as_ptr().add(k));
        if k % 32 == 0 {
            for row in rows {
                let p = row.as_ptr().wrapping_add(R * 2 * n + 2 * k);
                _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            }
        }
        for r in 0..R {
            let h = _mm256_loadu_si256(rows[r].as_ptr().add(2 * k) as *const __m256i);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtph_ps(h), xv, acc[r]);
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        let mut s = _mm512_reduce_add_ps(acc[r]);
        for (k, xv) in x.iter().enumerate().skip(full) {
            s += crate::ggml::f16_at(&rows[r][2 * k..]) * xv;
        }
        out[r] = s;
    }
    out
}
