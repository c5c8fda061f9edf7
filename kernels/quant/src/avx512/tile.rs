//! The small-batch kernel: Y[b][r] = Σ_k w_rk·x_bk for R rows × B ≤ 4 activation vectors held
//! in R·B vector accumulators. Each 16-lane chunk of codes is decoded once into weights
//! (w = a·(c − offset) + b, one FMA) and used B times, so decode work is shared by the batch
//! and W streams from memory once per B vectors; `dense_tile` is the same loop over f32 or
//! f16 weights (the baselines the quantised formats are compared with).
//!
//! It replaced decoding 64-row tiles to f32 and calling faer's GEMM for batches 2..64: with
//! m = batch ≤ 64 that spent most of its time packing (4096×4096 at batch 16: f32 10.5 ms,
//! Q4_0 10.6 ms; see the quant_tradeoff notes in README for the numbers after).

#[cfg(target_arch = "x86_64")]
use super::{codes, widen};
#[cfg(target_arch = "x86_64")]
use crate::plan::{Affine, BlockPlan};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// out[r][b] = Σ_k w_rk·x_bk; every `xs[b]` is `plan.permute_activation` of activation b.
///
/// # Safety
/// The CPU must have AVX-512F/BW, F16C and FMA (`Isa::has_avx512`).
#[cfg(target_arch = "x86_64")]
pub unsafe fn rows_tile<const R: usize, const B: usize>(
    plan: &BlockPlan,
    rows: [&[u8]; R],
    nblocks: usize,
    xs: [&[f32]; B],
) -> [[f32; B]; R] {
    for x in xs {
        assert!(x.len() >= nblocks * plan.values);
    }
    for r in rows {
        assert!(r.len() >= nblocks * plan.bytes);
    }
    let ptrs = rows.map(|r| r.as_ptr());
    let xp = xs.map(|x| x.as_ptr());
    crate::plan::dispatch!(plan, rows_tile_impl, [R, B], plan, ptrs, nblocks, xp)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,f16c,fma")]
unsafe fn rows_tile_impl<
    H: Affine,
    const BITS: u32,
    const SIGNED: bool,
    const R: usize,
    const B: usize,
>(
    plan: &BlockPlan,
    rows: [*const u8; R],
    nblocks: usize,
    xs: [*const f32; B],
) -> [[f32; B]; R] {
    let per_byte = 8 / BITS;
    let chunk = 16 * per_byte as usize;
    let (values, bytes, header) = (plan.values, plan.bytes, plan.header_bytes);
    let mut acc = [[_mm512_setzero_ps(); B]; R];
    let ahead = R * nblocks * bytes;
    for blk in 0..nblocks {
        for row in rows {
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(ahead + blk * bytes) as *const i8);
        }
        let mut av = [_mm512_setzero_ps(); R];
        let mut bv = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let (a, b) = H::affine(rows[r].add(blk * bytes));
            av[r] = _mm512_set1_ps(a);
            bv[r] = _mm512_set1_ps(b - a * plan.offset);
        }
        for c in 0..values / chunk {
            // Plain loops, not `array::from_fn`: a closure does not inherit this function's
            // target features, so intrinsics inside one are calls, not instructions.
            let mut wide = [_mm512_setzero_si512(); R];
            for r in 0..R {
                wide[r] = widen::<SIGNED>(rows[r].add(blk * bytes + header + c * 16));
            }
            for k in 0..per_byte {
                let at = blk * values + c * chunk + 16 * k as usize;
                let mut xk = [_mm512_setzero_ps(); B];
                for b in 0..B {
                    xk[b] = _mm512_loadu_ps(xs[b].add(at));
                }
                for r in 0..R {
                    let w = _mm512_fmadd_ps(codes::<BITS>(wide[r], k), av[r], bv[r]);
                    for b in 0..B {
                        acc[r][b] = _mm512_fmadd_ps(w, xk[b], acc[r][b]);
                    }
                }
            }
        }
    }
    let mut out = [[0.0f32; B]; R];
    for r in 0..R {
        for b in 0..B {
            out[r][b] = _mm512_reduce_add_ps(acc[r][b]);
        }
    }
    out
}

/// out[r][b] = Σ_k w_rk·x_bk for dense rows of `cols` f32 (`F16 = false`) or f16 values.
///
/// # Safety
/// The CPU must have AVX-512F/BW, F16C and FMA; rows hold `cols` values, `xs[b]` `cols`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,f16c,fma")]
#[allow(clippy::needless_range_loop)] // r and b index register arrays in step
pub unsafe fn dense_tile<const R: usize, const B: usize, const F16: bool>(
    rows: [&[u8]; R],
    cols: usize,
    xs: [&[f32]; B],
) -> [[f32; B]; R] {
    let width = if F16 { 2 } else { 4 };
    for r in rows {
        assert!(r.len() >= width * cols);
    }
    for x in xs {
        assert!(x.len() >= cols);
    }
    let mut acc = [[_mm512_setzero_ps(); B]; R];
    let full = cols / 16 * 16;
    for k in (0..full).step_by(16) {
        if (width * k) % 64 == 0 {
            for row in rows {
                let p = row.as_ptr().wrapping_add(R * width * cols + width * k);
                _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            }
        }
        let mut xk = [_mm512_setzero_ps(); B];
        for b in 0..B {
            xk[b] = _mm512_loadu_ps(xs[b].as_ptr().add(k));
        }
        for r in 0..R {
            let p = rows[r].as_ptr().add(width * k);
            let w = if F16 {
                _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
            } else {
                _mm512_loadu_ps(p as *const f32)
            };
            for b in 0..B {
                acc[r][b] = _mm512_fmadd_ps(w, xk[b], acc[r][b]);
            }
        }
    }
    let mut out = [[0.0f32; B]; R];
    for r in 0..R {
        for b in 0..B {
            let mut s = _mm512_reduce_add_ps(acc[r][b]);
            for k in full..cols {
                let p = &rows[r][width * k..];
                let w = if F16 {
                    crate::ggml::f16_at(p)
                } else {
                    f32::from_le_bytes([p[0], p[1], p[2], p[3]])
                };
                s += w * xs[b][k];
            }
            out[r][b] = s;
        }
    }
    out
}
