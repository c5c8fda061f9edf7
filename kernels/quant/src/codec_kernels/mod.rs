//! Y = X·Wᵀ for the formats with a `Codec` (Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, Q8_K) at every ISA
//! tier: the batch-1 GEMV and the multi-token tile with f32 activations (`gemv`, `tile`) and
//! the int8-activation GEMV in llama.cpp's arithmetic (`q8`, activations from `act`). Each
//! body is plain Rust over fixed lane arrays, `#[inline(always)]`, compiled three times —
//! inside an AVX-512 (`avx512f,avx512bw,avx512vl,avx2,fma,f16c`) and an AVX2 (`avx2,fma,f16c`)
//! `#[target_feature]` wrapper, and plain for the portable tier — the pattern of
//! `kernel_cpu::ops`: LLVM vectorises each wrapper for its tier, and the AVX-512 build (which
//! this machine cannot run) is the same source the AVX2 and portable builds test here. A
//! wrapper runs only under `kernel_cpu::rows`' token for its tier, which detection mints, so
//! a tier the caller names and this CPU lacks falls back to a lower one (`Tier::of`).
//!
//! Checked in the test binary's assembly (`objdump -d`): the AVX2 wrappers' inner loops are
//! ymm code (gemv: `vpmovsxbd` + `vcvtdq2ps` + `vmulps`/`vaddps`; q8: `vpmaddwd`; tile:
//! `vmulps`/`vaddps` on 8 accumulators), the portable ones the same on xmm (SSE2/SSE4.1
//! shuffles for the widening).
//!
//! Rows are split over threads as the other kernels do: `team::for_each_chunk_mut` for the
//! GEMVs, `matvec::by_row_tasks` for the tiles.

/// The int8 activations (Q8_K, Q8_0, Q8_1) of each format.
pub mod act;
/// Batch 1, f32 activations.
pub mod gemv;
/// The per-tier integer pair dot and table lookup.
pub mod prims;
/// int8 activations.
pub mod q8;
/// Batch ≥ 2, f32 activations: decoded tiles × register-blocked micro-kernel.
pub mod tile;

use crate::codecs::{self, with_codec};
use crate::matrix::QuantMatrix;
use crate::unpack::Codec;
use act::CodecActivation;
use kernel_cpu::rows::{Avx2 as Avx2Token, Avx512};
use kernel_cpu::{team, Isa};
#[cfg(target_arch = "x86_64")]
use prims::Avx2;
use prims::{Plain, Prims};

/// Rows per thread task.
const TASK_ROWS: usize = 32;
/// Rows per GEMV pass (their x loads shared).
const ROWS: usize = 4;

/// The tier a call runs at. The vector variants hold `kernel_cpu::rows`' capability tokens,
/// which only detection mints (`for_tier` checks that this CPU has every feature of the tier:
/// AVX-512 F/BW/VL + AVX2, FMA, F16C, or AVX2, FMA, F16C — exactly what the `wide` and `mid`
/// wrappers of `tiered!` enable), so a `Tier` that runs a wrapper is proof the CPU has its
/// features, whatever `Isa` the public caller passed.
#[derive(Debug, Clone, Copy)]
enum Tier {
    Avx512(Avx512),
    Avx2(Avx2Token),
    Portable,
}

impl Tier {
    /// `isa`'s tier where this CPU has it, else the widest lower one it has: a caller-supplied
    /// tier the CPU lacks falls back rather than executing instructions the CPU does not have
    /// (`matvec::matmul` refuses such a tier, and one above the cap, with an error first).
    fn of(isa: Isa) -> Tier {
        if let Some(t) = Avx512::for_tier(isa) {
            Tier::Avx512(t)
        } else if let Some(t) = Avx2Token::for_tier(isa) {
            Tier::Avx2(t)
        } else {
            Tier::Portable
        }
    }
}

/// Whether these kernels take `format`.
pub fn supports(format: crate::WeightFormat) -> bool {
    codecs::has_codec(format)
}

/// Y = X·Wᵀ with f32 activations: the GEMV at batch 1, decoded tiles above, at `isa`'s tier
/// (or the widest lower one this CPU has: see `Tier::of`).
pub fn matmul_f32(w: &QuantMatrix, x: &[f32], batch: usize, y: &mut [f32], isa: Isa) {
    let tier = Tier::of(isa);
    with_codec!(w.format, C => f32_product::<C>(w, x, batch, y, tier),
        _ => unreachable!("{} has no codec kernels", w.format))
}

/// Y = X·Wᵀ with each activation row quantised to the format's `vec_dot_type` (`act`), at
/// `isa`'s tier (or the widest lower one this CPU has: see `Tier::of`).
pub fn matmul_q8(w: &QuantMatrix, x: &[f32], batch: usize, y: &mut [f32], isa: Isa) {
    let tier = Tier::of(isa);
    debug_assert_eq!(x.len(), batch * w.cols);
    with_codec!(w.format, C => q8_product::<C>(w, x, y, tier),
        _ => unreachable!("{} has no codec kernels", w.format))
}

/// The rows `r0..r0 + n` of `w`'s bytes, R at a time.
#[inline(always)]
fn rows_at<const R: usize>(data: &[u8], rb: usize, r: usize) -> [&[u8]; R] {
    let mut rows: [&[u8]; R] = [&[]; R];
    for (j, row) in rows.iter_mut().enumerate() {
        *row = &data[(r + j) * rb..(r + j + 1) * rb];
    }
    rows
}

fn f32_product<C: Codec>(w: &QuantMatrix, x: &[f32], batch: usize, y: &mut [f32], tier: Tier) {
    let (data, rb, cols) = (w.bytes(), w.format.row_bytes(w.cols), w.cols);
    if batch == 1 {
        let xsum = gemv::sub_sums(x);
        team::for_each_chunk_mut(y, TASK_ROWS, |t, out| {
            gemv_task::<C>(
                tier,
                data,
                rb,
                t * TASK_ROWS,
                cols / C::VALUES,
                x,
                &xsum,
                out,
            )
        });
    } else {
        crate::matvec::by_row_tasks(w, batch, y, |r0, mr, out| {
            let mut scratch = vec![0.0f32; mr * tile::CHUNK];
            tile_task::<C>(tier, data, rb, cols, r0, mr, x, batch, out, &mut scratch)
        });
    }
}

fn q8_product<C: Codec>(w: &QuantMatrix, x: &[f32], y: &mut [f32], tier: Tier) {
    let (data, rb, cols) = (w.bytes(), w.format.row_bytes(w.cols), w.cols);
    for (xb, yb) in x.chunks(cols).zip(y.chunks_mut(w.rows)) {
        let a = act::quantize(w.format, xb);
        team::for_each_chunk_mut(yb, TASK_ROWS, |t, out| {
            q8_task::<C>(tier, data, rb, t * TASK_ROWS, cols / C::VALUES, &a, out)
        });
    }
}

/// One GEMV task: rows r0.. (as many as `out` holds), ROWS at a time, then one by one.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gemv_body<C: Codec, P: Prims>(
    data: &[u8],
    rb: usize,
    r0: usize,
    nblocks: usize,
    x: &[f32],
    xsum: &[f32],
    out: &mut [f32],
) {
    let mut i = 0;
    while i + ROWS <= out.len() {
        let got = gemv::rows_dot::<C, P, ROWS>(rows_at(data, rb, r0 + i), nblocks, x, xsum);
        out[i..i + ROWS].copy_from_slice(&got);
        i += ROWS;
    }
    while i < out.len() {
        out[i] = gemv::rows_dot::<C, P, 1>(rows_at(data, rb, r0 + i), nblocks, x, xsum)[0];
        i += 1;
    }
}

/// One int8-activation task, as `gemv_body`.
#[inline(always)]
fn q8_body<C: Codec, P: Prims>(
    data: &[u8],
    rb: usize,
    r0: usize,
    nblocks: usize,
    a: &CodecActivation,
    out: &mut [f32],
) {
    let mut i = 0;
    while i + ROWS <= out.len() {
        let got = q8::rows_dot_q8::<C, P, ROWS>(rows_at(data, rb, r0 + i), nblocks, a);
        out[i..i + ROWS].copy_from_slice(&got);
        i += ROWS;
    }
    while i < out.len() {
        out[i] = q8::rows_dot_q8::<C, P, 1>(rows_at(data, rb, r0 + i), nblocks, a)[0];
        i += 1;
    }
}

/// Declares `$name(tier, args)`: `$avx512` / `$avx2` (inside `#[target_feature]` wrappers)
/// or `$portable`, each a call of one `#[inline(always)]` body.
macro_rules! tiered {
    ($name:ident, ($($a:ident: $t:ty),*), $avx512:expr, $avx2:expr, $portable:expr) => {
        #[allow(clippy::too_many_arguments)]
        fn $name<C: Codec>(tier: Tier, $($a: $t),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[allow(clippy::too_many_arguments)]
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
                unsafe fn wide<C: Codec>($($a: $t),*) {
                    $avx512
                }
                #[allow(clippy::too_many_arguments)]
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn mid<C: Codec>($($a: $t),*) {
                    $avx2
                }
                match tier {
                    // SAFETY: the `Avx512` token exists only where this CPU has AVX-512
                    // F/BW/VL, AVX2, FMA and F16C (`Isa::Avx512.supported()`), `wide`'s features.
                    Tier::Avx512(_detected) => return unsafe { wide::<C>($($a),*) },
                    // SAFETY: likewise the `Avx2` token: AVX2, FMA and F16C, `mid`'s features.
                    Tier::Avx2(_detected) => return unsafe { mid::<C>($($a),*) },
                    Tier::Portable => {}
                }
            }
            $portable
        }
    };
}

tiered!(
    gemv_task,
    (data: &[u8], rb: usize, r0: usize, nblocks: usize, x: &[f32], xsum: &[f32], out: &mut [f32]),
    gemv_body::<C, Avx2>(data, rb, r0, nblocks, x, xsum, out),
    gemv_body::<C, Avx2>(data, rb, r0, nblocks, x, xsum, out),
    gemv_body::<C, Plain>(data, rb, r0, nblocks, x, xsum, out)
);

tiered!(
    q8_task,
    (data: &[u8], rb: usize, r0: usize, nblocks: usize, a: &CodecActivation, out: &mut [f32]),
    q8_body::<C, Avx2>(data, rb, r0, nblocks, a, out),
    q8_body::<C, Avx2>(data, rb, r0, nblocks, a, out),
    q8_body::<C, Plain>(data, rb, r0, nblocks, a, out)
);

tiered!(
    tile_task,
    (data: &[u8], rb: usize, cols: usize, r0: usize, mr: usize, x: &[f32], batch: usize,
     out: &mut [f32], w: &mut [f32]),
    tile::task::<C, Avx2, 16, 4, 4>(data, rb, cols, r0, mr, x, batch, out, w),
    tile::task::<C, Avx2, 8, 2, 4>(data, rb, cols, r0, mr, x, batch, out, w),
    tile::task::<C, Plain, 4, 2, 4>(data, rb, cols, r0, mr, x, batch, out, w)
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{WeightDist, WeightFormat};

    type Product = fn(&QuantMatrix, &[f32], usize, &mut [f32], Isa);

    #[test]
    fn a_tier_runs_a_wrapper_only_with_the_cpus_token() {
        for isa in Isa::ALL {
            let tier = Tier::of(isa);
            let want = if isa.has_avx512() && Isa::Avx512.supported() {
                "avx512"
            } else if isa.has_avx2() && Isa::Avx2.supported() {
                "avx2"
            } else {
                "portable"
            };
            let got = match tier {
                Tier::Avx512(_) => "avx512",
                Tier::Avx2(_) => "avx2",
                Tier::Portable => "portable",
            };
            assert_eq!(got, want, "{isa}");
        }
    }

    #[test]
    fn every_named_tier_runs_and_agrees_with_the_portable_one() {
        // Every tier, including any this CPU lacks (which falls back instead of executing its
        // instructions) and under a portable cap on this thread (the public functions take the
        // tier they are given; the cap is `matvec::matmul`'s to enforce).
        let (rows, cols) = (9, 256);
        let w = WeightDist::Gaussian.sample(rows, cols, 3);
        for name in ["q5_0", "iq4_nl", "q4_k"] {
            let m =
                QuantMatrix::quantize(WeightFormat::parse(name).unwrap(), rows, cols, &w).unwrap();
            for batch in [1, 3] {
                let x = WeightDist::Gaussian.sample(batch, cols, 5);
                let run = |f: Product, isa| {
                    let mut y = vec![f32::NAN; batch * rows];
                    f(&m, &x, batch, &mut y, isa);
                    y
                };
                for f in [matmul_f32 as Product, matmul_q8] {
                    let want = run(f, Isa::Portable);
                    let check = |got: Vec<f32>, isa: Isa| {
                        for (g, w) in got.iter().zip(&want) {
                            assert!(
                                (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                                "{name} batch {batch} {isa}: {g} vs {w}"
                            );
                        }
                    };
                    for isa in Isa::ALL {
                        check(run(f, isa), isa);
                        kernel_cpu::isa::with_isa(Isa::Portable, || check(run(f, isa), isa))
                            .unwrap();
                    }
                }
            }
        }
    }
}
