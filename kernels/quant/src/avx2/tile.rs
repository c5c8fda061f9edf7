//! The small-batch kernel on AVX2: Y[b][r] = Σ_k w_rk·x_bk for R rows × B ≤ 4 activation
//! vectors held in R·B accumulators, the algorithm of `avx512::tile` in 8 lanes: each 8-lane
//! piece of codes is decoded once into weights (w = a·(c − offset) + b, one FMA) and used B
//! times. With 16 registers the quantised pass takes R = 2 rows (8 accumulators, 4 activation
//! vectors, the weight, the two rows' a and b), `dense_tile` R = 2 as well.

#[cfg(target_arch = "x86_64")]
use super::{codes8, hsum, widen8};
#[cfg(target_arch = "x86_64")]
use crate::plan::{Affine, BlockPlan};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// out[r][b] = Σ_k w_rk·x_bk; every `xs[b]` is `plan.permute_activation` of activation b.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (`Isa::has_avx2`).
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
#[target_feature(enable = "avx2,fma,f16c")]
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
    let mut acc = [[_mm256_setzero_ps(); B]; R];
    let ahead = R * nblocks * bytes;
    for blk in 0..nblocks {
        for row in rows {
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(ahead + blk * bytes) as *const i8);
        }
        let mut av = [0.0f32; R];
        let mut bv = [0.0f32; R];
        for r in 0..R {
            let (a, b) = H::affine(rows[r].add(blk * bytes));
            av[r] = a;
            bv[r] = b - a * plan.offset;
        }
        for c in 0..values / chunk {
            for h in 0..2 {
                for r in 0..R {
                    let wide = widen8::<SIGNED>(rows[r].add(blk * bytes + header + c * 16 + 8 * h));
                    let (a, b) = (_mm256_set1_ps(av[r]), _mm256_set1_ps(bv[r]));
                    for k in 0..per_byte {
                        let at = blk * values + c * chunk + 16 * k as usize + 8 * h;
                        let w = _mm256_fmadd_ps(codes8::<BITS>(wide, k), a, b);
                        for bi in 0..B {
                            let xk = _mm256_loadu_ps(xs[bi].add(at));
                            acc[r][bi] = _mm256_fmadd_ps(w, xk, acc[r][bi]);
                        }
                    }
                }
            }
        }
    }
    let mut out = [[0.0f32; B]; R];
    for r in 0..R {
        for b in 0..B {
            out[r][b] = hsum(acc[r][b]);
        }
    }
    out
}

/// out[r][b] = Σ_k w_rk·x_bk for dense rows of `cols` f32 (`F16 = false`) or f16 values.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; rows hold `cols` values, `xs[b]` `cols`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
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
    let mut acc = [[_mm256_setzero_ps(); B]; R];
    let full = cols / 8 * 8;
    for k in (0..full).step_by(8) {
        if (width * k) % 64 == 0 {
            for row in rows {
                let p = row.as_ptr().wrapping_add(R * width * cols + width * k);
                _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            }
        }
        for r in 0..R {
            let p = rows[r].as_ptr().add(width * k);
            let w = if F16 {
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
            } else {
                _mm256_loadu_ps(p as *const f32)
            };
            for b in 0..B {
                let xk = _mm256_loadu_ps(xs[b].as_ptr().add(k));
                acc[r][b] = _mm256_fmadd_ps(w, xk, acc[r][b]);
            }
        }
    }
    let mut out = [[0.0f32; B]; R];
    for r in 0..R {
        for b in 0..B {
            let mut s = hsum(acc[r][b]);
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
