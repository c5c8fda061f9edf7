//! `harness roofline`: measures this machine's read bandwidth, FMA peak and int8 MAC peak (or, with
//! `--device cuda`, the GPU's copy bandwidth and bf16 GEMM rate) and stores the best seen
//! under results/roofline/.

use crate::error::Result;
use crate::roofline;
use kernel_common::Device;
use std::path::Path;

/// Measures and stores; `set_threads` sizes the CPU pool first (`--threads`).
pub fn run(
    device: Device,
    replace: bool,
    results_dir: &Path,
    set_threads: impl FnOnce() -> Result<()>,
) -> Result<i32> {
    if let Device::Cuda(n) = device {
        let (fresh, path) = roofline::measure_cuda_and_record(results_dir, n)?;
        println!(
            "{} ({} SMs): device-to-device copy {:.0} GB/s (read + write), bf16 GEMM {:.0} GFLOP/s ({}) -> {}",
            fresh.cpu_model,
            fresh.threads,
            fresh.read_gbps,
            fresh.fma_gflops,
            fresh.fma_isa,
            path.display()
        );
        return Ok(0);
    }
    set_threads()?;
    let fresh = roofline::measure();
    println!(
        "{}, {} threads: measured read {:.1} GB/s, f32 FMA peak {:.1} GFLOP/s ({}), int8 MAC peak {:.1} GMAC/s ({})",
        fresh.cpu_model,
        fresh.threads,
        fresh.read_gbps,
        fresh.fma_gflops,
        fresh.fma_isa,
        fresh.int8_gmacs,
        fresh.int8_isa
    );
    let best = match roofline::stored(results_dir) {
        Some(old) if !replace => old.best_of(fresh),
        _ => fresh,
    };
    let path = roofline::store(results_dir, &best)?;
    println!(
        "stored (best seen): read {:.1} GB/s, FMA {:.1} GFLOP/s, int8 {:.1} GMAC/s -> {}",
        best.read_gbps,
        best.fma_gflops,
        best.int8_gmacs,
        path.display()
    );
    Ok(0)
}
