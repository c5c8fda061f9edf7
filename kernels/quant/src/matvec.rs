//! Y = X · Wᵀ with W in any `WeightFormat` (llama.cpp's `ggml_mul_mat` with quantised
//! weights): X is `batch` × cols, Y is `batch` × rows, both row-major. Rows are split over
//! threads (rayon); the inner loops are chosen per ISA tier (`kernel_cpu::Isa`: the active one,
//! or the one a variant names with `isa=`):
//! - batch 1 (decode), the fused GEMV: 4 rows at a time, codes decoded in registers
//!   (`avx512::gemv`, `avx2::gemv`), never materialising W; f32 weights use the same row
//!   blocking through `kernel_cpu::rows` (an f32 GEMV of equal care), f16 weights convert in
//!   registers (F16C).
//! - batch ≥ 2: the register-tile kernel (`avx512::tile`, `avx2::tile`): 2 rows (AVX-512: 4
//!   for f32/f16) × up to 4 activation vectors per pass, each weight chunk decoded once per
//!   pass; the same kernel reads f32/f16 weights (faster than faer's GEMM here: f32 4096×4096
//!   at batch 16, 8.8 ms vs 10.5 ms on AVX-512).
//! - int8 activations (`FusedQ8`, llama.cpp's path): the activation quantised per 32 values,
//!   integer dot products per chunk (`avx512::q8act` with VNNI, `avx2::q8act`, or
//!   `portable::rows_dot_q8`).
//!
//! The codec formats (Q5_0, Q5_1, IQ4_NL and the K-quants) have their own kernels at every tier
//! (`codec_kernels`), `Fused` and `FusedQ8` alike. Other formats the in-register kernels do not
//! take (3/5/6/7-bit codes, 2-bit groups of 32, groups that are not a multiple of the 16-byte
//! chunk, bf16) and the portable tier use `portable`.
//! `MatVecVariant::Dequant` is the unfused baseline: all of W dequantised to f32 on every call,
//! then the f32 product; `MatVecVariant::Faer` the library baseline: f32 weights, one faer GEMM
//! call.

use crate::act_q8::{self, Q8Activation};
use crate::format::WeightFormat;
use crate::matrix::QuantMatrix;
use crate::plan::BlockPlan;
use crate::{avx2, avx512, codec_kernels, portable};
use kernel_common::{error::Result, Cost, KernelError};
use kernel_cpu::gemm::{sgemm_parallel, Strides};
use kernel_cpu::rows::{self as row_kernels, RowKernels};
use kernel_cpu::{team, Isa};
use rayon::prelude::*;

/// How the product is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatVecVariant {
    /// Dequantise on the fly with f32 activations, at the given ISA tier (`None`: the active
    /// one, `Isa::active()`).
    Fused(Option<Isa>),
    /// Dequantise all of W to f32, then the f32 product.
    Dequant,
    /// f32 weights only: one whole-matrix GEMM by faer (its own packing and threading), the
    /// library baseline for the f32 kernels.
    Faer,
    /// llama.cpp's CPU path: the activation quantised to int8 per 32 values, integer dot
    /// products against 4- or 8-bit codes; batch > 1 runs it per activation. The tier as for
    /// `Fused`.
    FusedQ8(Option<Isa>),
    /// The CUDA dequantising GEMV (`cuda_gemv`, quant.cu): f16, sym4g32, q4_0, q8_0 at batch
    /// ≤ 8. `matmul` uploads, runs and downloads; experiments time the kernel alone.
    Cuda,
    /// int8 activations on 16-row interleaved tiles (`crate::packed`: llama.cpp's repacked
    /// layout), q4_0, q4_1 and q8_0; the tiles are built once by `Prepared::new` (untimed), or
    /// on every call when `matmul` is given the row-major matrix. The tier as for `Fused`.
    Packed(Option<Isa>),
}

impl MatVecVariant {
    /// The default: fused, f32 activations, the active tier.
    pub const FUSED: MatVecVariant = MatVecVariant::Fused(None);

    /// The ISA tier the variant's CPU kernels run at if called now from this thread (the
    /// baselines' own loops run at the active tier); an error when the variant names a tier
    /// this CPU lacks or the cap excludes. `None` for CUDA.
    pub fn isa(self) -> Result<Option<Isa>> {
        match self {
            MatVecVariant::Cuda => Ok(None),
            MatVecVariant::Fused(Some(isa))
            | MatVecVariant::FusedQ8(Some(isa))
            | MatVecVariant::Packed(Some(isa)) => isa
                .require()
                .map(Some)
                .map_err(|e| KernelError::Unsupported(e.to_string())),
            _ => Ok(Some(Isa::active())),
        }
    }
}

/// Whether `variant` can multiply weights stored as `format` (on this CPU, under the cap).
pub fn supports(variant: MatVecVariant, format: WeightFormat) -> Result<()> {
    if variant == MatVecVariant::Cuda {
        return crate::cuda::gemv_entry(format).map(|_| ());
    }
    variant.isa()?;
    if variant == MatVecVariant::Faer && format != WeightFormat::F32 {
        return Err(KernelError::Unsupported(format!(
            "faer multiplies f32 weights, not {format}"
        )));
    }
    if matches!(variant, MatVecVariant::Packed(_)) && !crate::packed::packable(format) {
        return Err(KernelError::Unsupported(format!(
            "packed takes {}, not {format}",
            crate::packed::packable_names()
        )));
    }
    if matches!(variant, MatVecVariant::FusedQ8(_))
        && !codec_kernels::supports(format)
        && !BlockPlan::for_format(format).is_some_and(|p| act_q8::supports(&p))
    {
        return Err(KernelError::Unsupported(format!(
            "act=q8 takes the ggml blocks (q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl, q2_k..q6_k, q8_k) and 4- or 8-bit codes in groups of 32k (sym/asym 4 and 8), not {format}"
        )));
    }
    Ok(())
}

/// The activation a variant actually multiplies on weights of `format`: x itself, or for
/// `FusedQ8` / `Packed` its int8 quantisation dequantised — per 32 values (Q8_0 / Q8_1), or
/// per 256 (Q8_K) for the K-quants — what the reference must use to judge that variant.
pub fn activation_as_seen(
    variant: MatVecVariant,
    format: WeightFormat,
    x: &[f32],
    cols: usize,
) -> Vec<f32> {
    match variant {
        MatVecVariant::Packed(_) if crate::packed::block_values(format) == crate::packed::SUPER => {
            x.chunks(cols)
                .flat_map(crate::packed_q4k::activation_as_seen)
                .collect()
        }
        MatVecVariant::FusedQ8(_) if codec_kernels::supports(format) => x
            .chunks(cols)
            .flat_map(|xb| codec_kernels::act::activation_as_seen(format, xb))
            .collect(),
        MatVecVariant::FusedQ8(_) | MatVecVariant::Packed(_) => x
            .chunks(cols)
            .flat_map(act_q8::activation_as_seen)
            .collect(),
        _ => x.to_vec(),
    }
}

/// Rows per thread task.
const TASK_ROWS: usize = 32;
/// Rows per pass of the int8-activation kernels.
const Q8_ROWS: usize = 8;

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
    // Resolved here, on the calling thread, before any work is forked (`Isa::active` reads
    // this thread's choice).
    let isa = variant.isa()?.unwrap_or(Isa::Portable);
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
        MatVecVariant::Packed(_) => {
            crate::packed::matmul(&crate::packed::PackedMatrix::pack(w)?, x, batch, y, isa)
        }
        MatVecVariant::FusedQ8(_) if codec_kernels::supports(w.format) => {
            codec_kernels::matmul_q8(w, x, batch, y, isa);
            Ok(())
        }
        MatVecVariant::FusedQ8(_) => {
            let plan = BlockPlan::for_format(w.format).expect("supports() checked the format");
            for (xb, yb) in x.chunks(w.cols).zip(y.chunks_mut(w.rows)) {
                let act = act_q8::quantize_activation(&plan, xb);
                gemv_q8(w, &plan, &act, yb, isa);
            }
            Ok(())
        }
        MatVecVariant::Dequant => {
            let dense = w.dequantize();
            let bytes: Vec<u8> = dense.iter().flat_map(|v| v.to_le_bytes()).collect();
            let f = QuantMatrix::from_bytes(WeightFormat::F32, w.rows, w.cols, bytes)?;
            matmul(&f, x, batch, y, MatVecVariant::Fused(Some(isa)))
        }
        MatVecVariant::Fused(_) if codec_kernels::supports(w.format) => {
            codec_kernels::matmul_f32(w, x, batch, y, isa);
            Ok(())
        }
        MatVecVariant::Fused(_) => {
            let kernel = Kernel::new(w, isa);
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

/// A vector tier that has in-register kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Simd {
    Avx512,
    Avx2,
}

/// Which inner loop a call uses.
enum Kernel {
    /// In-register decode of a quantised format.
    Codes(BlockPlan, Simd),
    /// f32 or f16 weights.
    Dense { f16: bool, simd: Simd },
    /// Decode into scratch (GEMV) or tiles + faer GEMM (batch ≥ 2).
    Portable,
}

impl Kernel {
    fn new(w: &QuantMatrix, isa: Isa) -> Kernel {
        let simd = if isa.has_avx512() {
            Simd::Avx512
        } else if isa.has_avx2() {
            Simd::Avx2
        } else {
            return Kernel::Portable;
        };
        match w.format {
            WeightFormat::F32 if f32_rows(w).is_some() => Kernel::Dense { f16: false, simd },
            WeightFormat::F16 => Kernel::Dense { f16: true, simd },
            f => BlockPlan::for_format(f).map_or(Kernel::Portable, |p| Kernel::Codes(p, simd)),
        }
    }

    /// An activation vector in the order the kernel reads it.
    fn activation(&self, x: &[f32]) -> Vec<f32> {
        match self {
            Kernel::Codes(plan, _) => plan.permute_activation(x),
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
            return portable::decoded_tile_gemm(w, r0, mr, x, acts.len(), out);
        }
        let batch = acts.len();
        // Rows per pass: on AVX-512, 4 × 4 accumulators fit the 32 vector registers for dense
        // weights; a quantised pass also holds each row's codes, scale and bias, and 4 rows
        // spilled (4096×4096 Q4_0 at batch 16: 9.0 ms with 4 rows, 5.6 ms with 2). AVX2 has 16
        // registers: 2 rows × 4 activations for every format.
        let per_pass = match self {
            Kernel::Dense {
                simd: Simd::Avx512, ..
            } => 4,
            _ => 2,
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
        // SAFETY: Codes and Dense are built only for a tier `Isa::require`/`Isa::active`
        // allowed, so the CPU has its features; the kernels assert that rows and activations
        // cover `cols` values.
        unsafe {
            use Simd::*;
            match self {
                Kernel::Codes(plan, Avx512) => {
                    return avx512::tile::rows_tile::<R, B>(plan, rows, w.cols / plan.values, xs)
                }
                Kernel::Codes(plan, Avx2) => {
                    return avx2::tile::rows_tile::<R, B>(plan, rows, w.cols / plan.values, xs)
                }
                Kernel::Dense {
                    f16: true,
                    simd: Avx512,
                } => return avx512::tile::dense_tile::<R, B, true>(rows, w.cols, xs),
                Kernel::Dense {
                    f16: false,
                    simd: Avx512,
                } => return avx512::tile::dense_tile::<R, B, false>(rows, w.cols, xs),
                Kernel::Dense {
                    f16: true,
                    simd: Avx2,
                } => return avx2::tile::dense_tile::<R, B, true>(rows, w.cols, xs),
                Kernel::Dense {
                    f16: false,
                    simd: Avx2,
                } => return avx2::tile::dense_tile::<R, B, false>(rows, w.cols, xs),
                Kernel::Portable => {}
            }
        }
        unreachable!("the portable kernel decodes tiles instead")
    }
}

/// Runs `task(r0, mr, out)` over row tasks in parallel, each filling a batch × mr block, and
/// scatters the blocks into y (batch × rows).
pub(crate) fn by_row_tasks(
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
    let rb = w.format.row_bytes(w.cols);
    let data = w.bytes();
    team::for_each_chunk_mut(y, TASK_ROWS, |t, out| {
        let r0 = t * TASK_ROWS;
        let mut scratch = (vec![], vec![]);
        let mut i = 0;
        while i + 4 <= out.len() && !matches!(kernel, Kernel::Portable) {
            let r = r0 + i;
            let rows: [&[u8]; 4] = std::array::from_fn(|j| &data[(r + j) * rb..(r + j + 1) * rb]);
            out[i..i + 4].copy_from_slice(&rows_dot4(kernel, w, dense, r, rows, x, &xs));
            i += 4;
        }
        for (j, o) in out.iter_mut().enumerate().skip(i) {
            *o = portable::row_dot(w, r0 + j, x, &mut scratch);
        }
    });
}

/// Four rows from `r` against x (`xs`: x permuted for the kernel).
fn rows_dot4(
    kernel: &Kernel,
    w: &QuantMatrix,
    dense: Option<&[f32]>,
    r: usize,
    rows: [&[u8]; 4],
    x: &[f32],
    xs: &[f32],
) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: Codes/Dense exist only for a tier the CPU runs (see `rows_tile`); the kernels
    // assert their slices cover the rows.
    unsafe {
        use Simd::*;
        match (kernel, dense) {
            (Kernel::Dense { f16: false, simd }, Some(d)) => {
                let four = &d[r * w.cols..(r + 4) * w.cols];
                let tier = if *simd == Avx512 {
                    Isa::Avx512
                } else {
                    Isa::Avx2
                };
                return match (
                    row_kernels::Avx512::for_tier(tier),
                    row_kernels::Avx2::for_tier(tier),
                ) {
                    (Some(k), _) => k.dot_rows::<4>(four, w.cols, x),
                    (_, Some(k)) => k.dot_rows::<4>(four, w.cols, x),
                    _ => row_kernels::Portable.dot_rows::<4>(four, w.cols, x),
                };
            }
            (Kernel::Codes(plan, Avx512), _) => {
                return avx512::gemv::rows_dot::<4>(plan, rows, w.cols / plan.values, xs)
            }
            (Kernel::Codes(plan, Avx2), _) => {
                return avx2::gemv::rows_dot::<4>(plan, rows, w.cols / plan.values, xs)
            }
            (
                Kernel::Dense {
                    f16: true,
                    simd: Avx512,
                },
                _,
            ) => return avx512::gemv::f16_rows_dot::<4>(rows, x),
            (
                Kernel::Dense {
                    f16: true,
                    simd: Avx2,
                },
                _,
            ) => return avx2::gemv::f16_rows_dot::<4>(rows, x),
            _ => {}
        }
    }
    let mut scratch = (vec![], vec![]);
    std::array::from_fn(|j| portable::row_dot(w, r + j, x, &mut scratch))
}

fn gemv_q8(w: &QuantMatrix, plan: &BlockPlan, act: &Q8Activation, y: &mut [f32], isa: Isa) {
    let nblocks = w.cols / plan.values;
    let vnni = isa.has_avx512_vnni();
    let rb = w.format.row_bytes(w.cols);
    let data = w.bytes();
    team::for_each_chunk_mut(y, TASK_ROWS, |t, out| {
        let r0 = t * TASK_ROWS;
        let mut i = 0;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supports()` checked the format; the tier was allowed by `Isa::require` /
        // `Isa::active`, so the CPU has its features; the kernels assert that rows and
        // activation cover the blocks.
        unsafe {
            while i + Q8_ROWS <= out.len() && isa.has_avx2() {
                let r = r0 + i;
                let rows: [&[u8]; Q8_ROWS] =
                    std::array::from_fn(|j| &data[(r + j) * rb..(r + j + 1) * rb]);
                let got = if vnni {
                    avx512::q8act::rows_dot_q8::<Q8_ROWS>(plan, rows, nblocks, act)
                } else {
                    avx2::q8act::rows_dot_q8::<Q8_ROWS>(plan, rows, nblocks, act)
                };
                out[i..i + Q8_ROWS].copy_from_slice(&got);
                i += Q8_ROWS;
            }
        }
        for (j, o) in out.iter_mut().enumerate().skip(i) {
            *o = portable::rows_dot_q8(plan, w.row(r0 + j), nblocks, act);
        }
    });
}
