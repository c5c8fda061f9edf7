//! The device's two ceilings, measured through the workbench's machinery: read+write
//! bandwidth of a large device-to-device copy (`cuMemcpyDtoDAsync`, bytes read plus bytes
//! written), and the bf16 rate of `roofline.cu`'s tensor-core GEMM on random data (checked
//! against an f64 host product on sampled entries before it is timed). Both timed cold with
//! CUDA events (`CudaRuntime::time_cold`: L2 flushed before each repetition, whatever the
//! caller's `Flush` mode), median of the repetitions.

use crate::buffer::f32_from_bytes;
use crate::runtime::{driver, CudaRuntime};
use crate::{KernelSource, Launch};
use half::bf16;
use kernel_common::error::{KernelError, Result};
use kernel_common::inputs::{derive_seed, normal_buffer_par};
use kernel_common::DType;

/// `roofline.cu`, with the prelude prepended (what `cuda_source!` does for the families, whose
/// `.cu` files live in their own `src/cuda/`).
pub const SOURCE: KernelSource = KernelSource {
    family: "roofline",
    file: "roofline.cu",
    code: concat!(include_str!("prelude.cuh"), include_str!("roofline.cu")),
    entries: &["gemm_bf16"],
};

/// GEMM tile sizes (`GB_M`, `GB_N`, `GB_K` in roofline.cu).
pub const GEMM_TILE: (usize, usize, usize) = (128, 128, 32);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// GB/s of a `bytes`-byte device-to-device copy (2·bytes moved per copy), median of `reps`.
pub fn copy_gbps(rt: &CudaRuntime, bytes: usize, reps: usize) -> Result<f64> {
    let src = rt.zeros::<u8>(bytes)?;
    let mut dst = rt.zeros::<u8>(bytes)?;
    let samples = rt.time_cold(reps, || {
        driver(
            rt.stream.memcpy_dtod(&src, &mut dst),
            "device-to-device copy",
        )
    })?;
    Ok(2.0 * bytes as f64 / median(samples) / 1e9)
}

/// The launch of an m×n×k GEMM (each a multiple of its tile).
pub fn plan_gemm(m: usize, n: usize, k: usize) -> Result<Launch> {
    let (tm, tn, tk) = GEMM_TILE;
    if m == 0
        || !m.is_multiple_of(tm)
        || !n.is_multiple_of(tn)
        || n == 0
        || !k.is_multiple_of(tk)
        || k == 0
    {
        return Err(KernelError::InvalidShape(format!(
            "the roofline GEMM takes m, n multiples of {tm}/{tn} and k of {tk}, got {m}×{n}×{k}"
        )));
    }
    Launch::new((n / tn, m / tm, 1), 256, 0)
}

/// Result of the GEMM measurement.
#[derive(Debug, Clone, Copy)]
pub struct GemmRate {
    pub gflops: f64,
    /// Largest relative error of the sampled entries against the f64 host product.
    pub max_rel_err: f64,
}

/// bf16 GFLOP/s of an n×n×n GEMM on seeded normal data, median of `reps`.
pub fn gemm_bf16_gflops(rt: &CudaRuntime, n: usize, reps: usize, seed: u64) -> Result<GemmRate> {
    let launch = plan_gemm(n, n, n)?;
    let f = rt.function(&SOURCE, "gemm_bf16")?;
    let random = |i| match normal_buffer_par(derive_seed(seed, i), DType::BF16, n * n) {
        kernel_common::Buffer::BF16(v) => v,
        _ => unreachable!("asked for bf16"),
    };
    let (a, b): (Vec<bf16>, Vec<bf16>) = (random(1), random(2));
    let ad = rt.upload(&crate::bf16_bits(&a))?;
    let bd = rt.upload(&crate::bf16_bits(&b))?;
    let mut cd = rt.upload(&vec![0xffu8; n * n * 4])?;
    let ni = crate::int_arg("n", n)?;
    crate::cuda_launch!(rt, f, launch, &ad, &bd, &mut cd, &ni, &ni, &ni)?;
    rt.sync()?;
    let c = f32_from_bytes(&rt.download(&cd)?);
    let mut max_rel_err = 0.0f64;
    for s in 0..64usize {
        let (i, j) = ((s * 7919) % n, (s * 104_729 + 13) % n);
        let want: f64 = (0..n)
            .map(|t| a[i * n + t].to_f64() * b[j * n + t].to_f64())
            .sum();
        let scale: f64 = (0..n)
            .map(|t| (a[i * n + t].to_f64() * b[j * n + t].to_f64()).abs())
            .sum();
        let got = c[i * n + j] as f64;
        if !got.is_finite() {
            return Err(KernelError::DeviceFailure(format!(
                "roofline GEMM left C[{i},{j}] unwritten"
            )));
        }
        max_rel_err = max_rel_err.max((got - want).abs() / scale.max(1e-30));
    }
    if max_rel_err > 1e-3 {
        return Err(KernelError::DeviceFailure(format!(
            "roofline GEMM is wrong: relative error {max_rel_err:.2e} on sampled entries"
        )));
    }
    let samples = rt.time_cold(reps, || {
        crate::cuda_launch!(rt, f, launch, &ad, &bd, &mut cd, &ni, &ni, &ni)
    })?;
    Ok(GemmRate {
        gflops: 2.0 * (n as f64).powi(3) / median(samples) / 1e9,
        max_rel_err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_plan_tiles() {
        let l = plan_gemm(8192, 4096, 8192).unwrap();
        assert_eq!(l.grid, (32, 64, 1));
        assert_eq!(l.block.0, 256);
        assert!(plan_gemm(100, 128, 32).is_err());
        assert!(plan_gemm(128, 128, 48).is_err());
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }
}
