//! Y = X · Wᵀ with W in any `WeightFormat` (llama.cpp's `ggml_mul_mat` with quantised
//! weights and f32 activations): X is `batch` × cols, Y is `batch` × rows, both row-major.
//!
//! Rows are split over threads (rayon). With AVX-512 (`Isa::Auto` on a CPU that has it):
//! - batch 1 (decode), the fused GEMV: 4 rows at a time, codes decoded in registers
//!   (`avx512::gemv`), never materialising W; f32 weights use the same row blocking through
//!   `kernel_common::rows` (an f32 GEMV of equal care), f16 weights convert in registers.
//! - batch ≥ 2: the register-tile kernel (`avx512::tile`): 2 rows (4 for f32/f16) × up to 4
//!   activation vectors per pass, each weight chunk decoded once per pass; the same kernel
//!   reads f32/f16 weights (faster than faer's GEMM here: f32 4096×4096 at batch 16, 8.8 ms
//!   vs 10.5 ms).
//!
//! Formats the in-register kernels do not take (3/5/6/7-bit codes, 2-bit groups of 32, groups
//! that are not a multiple of the 16-byte chunk) and `Isa::Portable`: batch 1 decodes a few
//! blocks at a time into scratch and takes dot products; batch ≥ 2 decodes 64-row × 512-column
//! tiles to f32 and multiplies them by faer's GEMM. `MatVecVariant::Dequant` is the unfused
//! baseline: all of W dequantised to f32 on every call, then the f32 product;
//! `MatVecVariant::Faer` the library baseline: f32 weights, one faer GEMM call.

use crate::avx512::{self, q8act, BlockPlan};
use crate::format::WeightFormat;
use crate::matrix::QuantMatrix;
use kernel_common::gemm::{sgemm, sgemm_parallel, Strides};
use kernel_common::rows::{Avx512, RowKernels};
use kernel_common::{error::Result, Cost, KernelError};
use rayon::prelude::*;

/// Instruction set of the fused kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 when the CPU has it, else portable.
    Auto,
    /// Plain loops (block decode + dot, decoded tiles + GEMM), any CPU.
    Portable,
}

/// How the product is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatVecVariant {
    /// Dequantise on the fly.
    Fused(Isa),
    /// Dequantise all of W to f32, then the f32 product.
    Dequant,
    /// f32 weights only: one whole-matrix GEMM by faer (its own packing and threading), the
    /// library baseline for the f32 kernels.
    Faer,
    /// llama.cpp's CPU path: the activation quantised to int8 per 32 values, integer dot
    /// products (AVX-512 VNNI) against 4- or 8-bit codes (`avx512::q8act`); batch > 1 runs it
    /// per activation.
    FusedQ8,
    /// The CUDA dequantising GEMV (`cuda_gemv`, quant.cu): f16, sym4g32, q4_0, q8_0 at batch
    /// ≤ 8. `matmul` uploads, runs and downloads; experiments time the kernel alone.
    Cuda,
}

/// Whether `variant` can multiply weights stored as `format`.
pub fn supports(variant: MatVecVariant, format: WeightFormat) -> Result<()> {
    if variant == MatVecVariant::Cuda {
        return crate::cuda::gemv_entry(format).map(|_| ());
    }
    if variant == MatVecVariant::Faer && format != WeightFormat::F32 {
        return Err(KernelError::Unsupported(format!(
            "faer multiplies f32 weights, not {format}"
        )));
    }
    if variant == MatVecVariant::FusedQ8 {
        if !BlockPlan::for_format(format).is_some_and(|p| q8act::supports(&p)) {
            return Err(KernelError::Unsupported(format!(
                "act=q8 takes 4- or 8-bit codes in groups of 32k (q4_0, q4_1, q8_0, sym/asym 4 and 8), not {format}"
            )));
        }
        if !q8act::available() {
            return Err(KernelError::Unsupported(
                "act=q8 needs AVX-512 VNNI, which this CPU lacks".into(),
            ));
        }
    }
    Ok(())
}

/// The activation a variant actually multiplies: x itself, or for `FusedQ8` its int8
/// quantisation dequantised (what the reference must use to judge that variant).
pub fn activation_as_seen(variant: MatVecVariant, x: &[f32], cols: usize) -> Vec<f32> {
    match variant {
        MatVecVariant::FusedQ8 => x.chunks(cols).flat_map(q8act::activation_as_seen).collect(),
        _ => x.to_vec(),
    }
}

/// Rows per thread task.
const TASK_ROWS: usize = 32;
/// Rows and columns of the portable GEMM's decoded tile.
const TILE_ROWS: usize = 64;
const TILE_COLS: usize = 512;

/// Minimum traffic and useful FLOPs of one product.
pub fn cost(w: &QuantMatrix, batch: usize) -> Cost {
    Cost {
        bytes: (w.bytes().len() + 4 * batch * (w.cols + w.rows)) as u64,
        flops: (2 * batch * w.rows * w.cols) as u64,
    }
}

fn check(w: &QuantMatrix, x: &[f32], batch: usize, y: &[f32]) -> Result<()> {
    if batch == 0 || x.len() != batch * w.cols || y.len() != batch * w.rows {
        return Err(KernelError::BadBuffer(format!(
            "matmul of {}×{} weights with batch {batch}: x has {} values (want {}), y {} (want {})",
            w.rows,
            w.cols,
            x.len(),
            batch * w.cols,
            y.len(),
            batch * w.rows
        )));
    }
    Ok(())
}

/// Y = X · Wᵀ.
pub fn matmul(
    w: &QuantMatrix,
    x: &[f32],
    batch: usize,
    y: &mut [f32],
    variant: MatVecVariant,
) -> Result<()> {
    check(w, x, batch, y)?;
    supports(variant, w.format)?;
    match variant {
        MatVecVariant::Cuda => {
            y.copy_from_slice(&crate::cuda::gemv_cuda(w, x, batch)?);
            Ok(())
        }
        MatVecVariant::Faer => {
            let dense = f32_rows(w).ok_or_else(|| {
                KernelError::BadBuffer("f32 weights are not 4-byte aligned".into())
            })?;
            sgemm_parallel(
                batch,
                w.cols,
                w.rows,
                x,
                Strides::row_major(w.cols),
                dense,
                Strides::transposed(w.cols),
                y,
                w.rows,
            );
            Ok(())
        }
        MatVecVariant::FusedQ8 => {
            let plan = BlockPlan::for_format(w.format).expect("supports() checked the format");
            for (xb, yb) in x.chunks(w.cols).zip(y.chunks_mut(w.rows)) {
                gemv_q8(w, &plan, &q8act::quantize_activation(&plan, xb), yb);
            }
            Ok(())
        }
        MatVecVariant::Dequant => {
            let dense = w.dequantize();
            let bytes: Vec<u8> = dense.iter().flat_map(|v| v.to_le_bytes()).collect();
            let f = QuantMatrix::from_bytes(WeightFormat::F32, w.rows, w.cols, bytes)?;
            matmul(&f, x, batch, y, MatVecVariant::Fused(Isa::Auto))
        }
        MatVecVariant::Fused(isa) => {
            let simd = isa == Isa::Auto && avx512::available();
            let kernel = Kernel::new(w, simd);
            if batch == 1 {
                gemv(w, x, y, &kernel);
            } else {
                let acts: Vec<Vec<f32>> =
                    x.chunks(w.cols).map(|xb| kernel.activation(xb)).collect();
                by_row_tasks(w, batch, y, |r0, mr, out| {
                    kernel.tile(w, r0, mr, x, &acts, out)
                });
            }
            Ok(())
        }
    }
}

/// Which inner loop a call uses.
enum Kernel {
    /// In-register decode of a quantised format.
    Codes(BlockPlan),
    /// f32 or f16 weights, AVX-512.
    Dense { f16: bool },
    /// Decode into scratch (GEMV) or tiles + faer GEMM (batch ≥ 2).
    Portable,
}

impl Kernel {
    fn new(w: &QuantMatrix, simd: bool) -> Kernel {
        if !simd {
            return Kernel::Portable;
        }
        match w.format {
            WeightFormat::F32 if f32_rows(w).is_some() => Kernel::Dense { f16: false },
            WeightFormat::F16 => Kernel::Dense { f16: true },
            f => BlockPlan::for_format(f).map_or(Kernel::Portable, Kernel::Codes),
        }
    }

    /// An activation vector in the order the kernel reads it.
    fn activation(&self, x: &[f32]) -> Vec<f32> {
        match self {
            Kernel::Codes(plan) => plan.permute_activation(x),
            _ => x.to_vec(),
        }
    }

    /// out[b·mr + i] = row r0 + i of W · activation b, for `mr` rows and every activation.
    fn tile(
        &self,
        w: &QuantMatrix,
        r0: usize,
        mr: usize,
        x: &[f32],
        acts: &[Vec<f32>],
        out: &mut [f32],
    ) {
        if matches!(self, Kernel::Portable) {
            return decoded_tile_gemm(w, r0, mr, x, acts.len(), out);
        }
        let batch = acts.len();
        // Rows per pass: 4 × 4 accumulators fit the 32 vector registers for dense weights; a
        // quantised pass also holds each row's codes, scale and bias, and 4 rows spilled
        // (4096×4096 Q4_0 at batch 16: 9.0 ms with 4 rows, 5.6 ms with 2).
        let per_pass = if matches!(self, Kernel::Dense { .. }) {
            4
        } else {
            2
        };
        let mut i = 0;
        while i < mr {
            let take = if mr - i >= per_pass { per_pass } else { 1 };
            let mut b = 0;
            while b < batch {
                let nb = (batch - b).min(4);
                let xs = &acts[b..b + nb];
                match (take, nb) {
                    (4, 4) => self.put::<4, 4>(w, r0 + i, xs, out, mr, i, b),
                    (4, 3) => self.put::<4, 3>(w, r0 + i, xs, out, mr, i, b),
                    (4, 2) => self.put::<4, 2>(w, r0 + i, xs, out, mr, i, b),
                    (4, _) => self.put::<4, 1>(w, r0 + i, xs, out, mr, i, b),
                    (2, 4) => self.put::<2, 4>(w, r0 + i, xs, out, mr, i, b),
                    (2, 3) => self.put::<2, 3>(w, r0 + i, xs, out, mr, i, b),
                    (2, 2) => self.put::<2, 2>(w, r0 + i, xs, out, mr, i, b),
                    (2, _) => self.put::<2, 1>(w, r0 + i, xs, out, mr, i, b),
                    (_, 4) => self.put::<1, 4>(w, r0 + i, xs, out, mr, i, b),
                    (_, 3) => self.put::<1, 3>(w, r0 + i, xs, out, mr, i, b),
                    (_, 2) => self.put::<1, 2>(w, r0 + i, xs, out, mr, i, b),
                    _ => self.put::<1, 1>(w, r0 + i, xs, out, mr, i, b),
                }
                b += nb;
            }
            i += take;
        }
    }

    /// R rows from `r` × B activations into `out` (batch × mr, rows from `i`, batch from `b`).
    #[allow(clippy::too_many_arguments)]
    fn put<const R: usize, const B: usize>(
        &self,
        w: &QuantMatrix,
        r: usize,
        acts: &[Vec<f32>],
        out: &mut [f32],
        mr: usize,
        i: usize,
        b: usize,
    ) {
        let rows: [&[u8]; R] = std::array::from_fn(|j| w.row(r + j));
        let xs: [&[f32]; B] = std::array::from_fn(|j| acts[j].as_slice());
        let got = self.rows_tile::<R, B>(w, rows, xs);
        for (j, vals) in got.iter().enumerate() {
            for (k, v) in vals.iter().enumerate() {
                out[(b + k) * mr + i + j] = *v;
            }
        }
    }

    fn rows_tile<const R: usize, const B: usize>(
        &self,
        w: &QuantMatrix,
        rows: [&[u8]; R],
        xs: [&[f32]; B],
    ) -> [[f32; B]; R] {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Codes and Dense are only built after `avx512::available()`; the kernels
        // assert that rows and activations cover `cols` values.
        unsafe {
            match self {
                Kernel::Codes(plan) => {
                    return avx512::tile::rows_tile::<R, B>(plan, rows, w.cols / plan.values, xs)
                }
                Kernel::Dense { f16: true } => {
                    return avx512::tile::dense_tile::<R, B, true>(rows, w.cols, xs)
                }
                Kernel::Dense { f16: false } => {
                    return avx512::tile::dense_tile::<R, B, false>(rows, w.cols, xs)
                }
                Kernel::Portable => {}
            }
        }
        unreachable!("the portable kernel decodes tiles instead")
    }
}

/// Runs `task(r0, mr, out)` over row tasks in parallel, each filling a batch × mr block, and
/// scatters the blocks into y (batch × rows).
fn by_row_tasks(
    w: &QuantMatrix,
    batch: usize,
    y: &mut [f32],
    task: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    let starts: Vec<usize> = (0..w.rows).step_by(TASK_ROWS).collect();
    let parts: Vec<Vec<f32>> = starts
        .par_iter()
        .map(|&r0| {
            let mr = TASK_ROWS.min(w.rows - r0);
            let mut out = vec![0.0f32; batch * mr];
            task(r0, mr, &mut out);
            out
        })
        .collect();
    for (&r0, part) in starts.iter().zip(&parts) {
        let mr = part.len() / batch;
        for b in 0..batch {
            y[b * w.rows + r0..b * w.rows + r0 + mr].copy_from_slice(&part[b * mr..(b + 1) * mr]);
        }
    }
}

/// The rows of `w` as f32 when the format is f32 and the bytes are aligned.
fn f32_rows(w: &QuantMatrix) -> Option<&[f32]> {
    if w.format != WeightFormat::F32 {
        return None;
    }
    // SAFETY: any bit pattern is a valid f32; align_to only yields the aligned middle.
    let (pre, mid, post) = unsafe { w.bytes().align_to::<f32>() };
    (pre.is_empty() && post.is_empty()).then_some(mid)
}

fn gemv(w: &QuantMatrix, x: &[f32], y: &mut [f32], kernel: &Kernel) {
    let xs = kernel.activation(x);
    let dense = f32_rows(w);
    let avx512 = Avx512::detect();
    y.par_chunks_mut(TASK_ROWS)
        .enumerate()
        .for_each(|(t, out)| {
            let r0 = t * TASK_ROWS;
            let mut scratch = (vec![], vec![]);
            let mut i = 0;
            while i + 4 <= out.len() && !matches!(kernel, Kernel::Portable) {
                let r = r0 + i;
                let rows = [w.row(r), w.row(r + 1), w.row(r + 2), w.row(r + 3)];
                let four = match (kernel, dense, avx512) {
                    (Kernel::Dense { f16: false }, Some(d), Some(k)) => {
                        k.dot_rows::<4>(&d[r * w.cols..(r + 4) * w.cols], w.cols, x)
                    }
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: Codes/Dense exist only after `avx512::available()`; the kernels
                    // assert their slices cover the rows.
                    (Kernel::Codes(plan), _, _) => unsafe {
                        avx512::gemv::rows_dot::<4>(plan, rows, w.cols / plan.values, &xs)
                    },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as above.
                    (Kernel::Dense { f16: true }, _, _) => unsafe {
                        avx512::gemv::f16_rows_dot::<4>(rows, x)
                    },
                    _ => std::array::from_fn(|j| row_portable(w, r + j, x, &mut scratch)),
                };
                out[i..i + 4].copy_from_slice(&four);
                i += 4;
            }
            for (j, o) in out.iter_mut().enumerate().skip(i) {
                *o = row_portable(w, r0 + j, x, &mut scratch);
            }
        });
}

#[cfg(target_arch = "x86_64")]
fn gemv_q8(w: &QuantMatrix, plan: &BlockPlan, act: &q8act::Q8Activation, y: &mut [f32]) {
    let nblocks = w.cols / plan.values;
    y.par_chunks_mut(TASK_ROWS)
        .enumerate()
        .for_each(|(t, out)| {
            let r0 = t * TASK_ROWS;
            let mut i = 0;
            // SAFETY: `supports()` checked the format and `q8act::available()`; the kernel asserts
            // that rows and activation cover the blocks.
            unsafe {
                while i + 4 <= out.len() {
                    let r = r0 + i;
                    let rows = [w.row(r), w.row(r + 1), w.row(r + 2), w.row(r + 3)];
                    let four = q8act::rows_dot_q8::<4>(plan, rows, nblocks, act);
                    out[i..i + 4].copy_from_slice(&four);
                    i += 4;
                }
                for (j, o) in out.iter_mut().enumerate().skip(i) {
                    *o = q8act::rows_dot_q8::<1>(plan, [w.row(r0 + j)], nblocks, act)[0];
                }
            }
        });
}

#[cfg(not(target_arch = "x86_64"))]
fn gemv_q8(_: &QuantMatrix, _: &BlockPlan, _: &q8act::Q8Activation, _: &mut [f32]) {
    unreachable!("supports() refuses act=q8 off x86-64");
}

/// One row: decode a few blocks into scratch, dot them with x.
fn row_portable(w: &QuantMatrix, r: usize, x: &[f32], scratch: &mut (Vec<f32>, Vec<u8>)) -> f32 {
    let bv = w.format.block_values();
    let (vals, codes) = scratch;
    // Decode several small blocks at once so each dot product runs over a useful length.
    let span = bv.max(256).next_multiple_of(bv).min(w.cols);
    vals.resize(span, 0.0);
    let mut sum = 0.0f32;
    for (k, xs) in x.chunks(span).enumerate() {
        let part = &mut vals[..xs.len()];
        w.decode_row_range(r, k * span, part, codes);
        sum += kernel_common::simd::dot_plain(part, xs);
    }
    sum
}

/// Portable batch ≥ 2: decode TILE_ROWS × TILE_COLS of W to f32, multiply by faer's GEMM.
fn decoded_tile_gemm(
    w: &QuantMatrix,
    r0: usize,
    mr: usize,
    x: &[f32],
    batch: usize,
    out: &mut [f32],
) {
    let cols = w.cols;
    let kc = TILE_COLS
        .next_multiple_of(w.format.block_values())
        .min(cols);
    let mut tile = vec![0.0f32; TILE_ROWS.min(mr) * kc];
    let mut codes = vec![];
    for (t0, tr) in (0..mr)
        .step_by(TILE_ROWS)
        .map(|t| (t, TILE_ROWS.min(mr - t)))
    {
        let mut c = vec![0.0f32; batch * tr];
        for k0 in (0..cols).step_by(kc) {
            let kw = kc.min(cols - k0);
            for i in 0..tr {
                w.decode_row_range(r0 + t0 + i, k0, &mut tile[i * kw..(i + 1) * kw], &mut codes);
            }
            sgemm(
                batch,
                kw,
                tr,
                1.0,
                &x[k0..],
                Strides::row_major(cols),
                &tile[..tr * kw],
                Strides::transposed(kw),
                if k0 == 0 { 0.0 } else { 1.0 },
                &mut c,
                tr,
            );
        }
        for b in 0..batch {
            out[b * mr + t0..b * mr + t0 + tr].copy_from_slice(&c[b * tr..(b + 1) * tr]);
        }
    }
}
