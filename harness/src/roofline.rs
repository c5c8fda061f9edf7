//! This machine's limits, measured once and stored per machine kind and thread count in
//! `results/roofline/<machine>-<threads>t.json`: read bandwidth from a parallel streaming sum
//! over a buffer 16× the L3, and the f32 FMA peak from independent FMA chains on every thread
//! (AVX2 and, where present, AVX-512; the larger is the limit). Williams et al., "Roofline".

use crate::error::{HarnessError, Result};
use crate::machine;
use kernel_common::simd;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Measured limits of one machine at one thread count.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Roofline {
    pub machine: String,
    pub cpu_model: String,
    pub threads: usize,
    /// Best streaming read bandwidth, GB/s (10^9 bytes per second).
    pub read_gbps: f64,
    /// Best f32 FMA throughput, GFLOP/s.
    pub fma_gflops: f64,
    /// Instruction set that reached `fma_gflops`.
    pub fma_isa: String,
    pub measured_at: String,
    pub method: String,
}

/// Bytes streamed per bandwidth pass.
const STREAM_BYTES: usize = 512 << 20;

fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; simd::LANES];
    for blk in x.chunks_exact(simd::LANES) {
        for l in 0..simd::LANES {
            acc[l] += blk[l];
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_lanes_avx2(x: &[f32]) -> f32 {
    sum_lanes(x)
}

fn stream_sum(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd::avx2_fma_available() {
        // SAFETY: AVX2 was detected on this CPU.
        return unsafe { sum_lanes_avx2(x) };
    }
    sum_lanes(x)
}

/// Best of `passes` parallel streaming reads, in GB/s.
pub fn measure_read_bandwidth(passes: usize) -> f64 {
    let data: Vec<f32> = (0..STREAM_BYTES / 4)
        .into_par_iter()
        .map(|i| (i % 7) as f32)
        .collect();
    let chunk = data.len() / (4 * rayon::current_num_threads());
    let mut best = f64::INFINITY;
    for _ in 0..passes {
        let t = Instant::now();
        let s: f32 = data.par_chunks(chunk).map(stream_sum).sum();
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(s);
    }
    STREAM_BYTES as f64 / best / 1e9
}

const CHAINS: usize = 12;
const FMA_ITERS: usize = 20_000_000;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_chains_avx2(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut out = [0.0f32; 8];
    let s = acc
        .iter()
        .fold(_mm256_setzero_ps(), |s, x| _mm256_add_ps(s, *x));
    // SAFETY: `out` holds 8 f32, what one unaligned 256-bit store writes.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
    out.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fma_chains_avx512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(1e-7);
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    _mm512_reduce_add_ps(
        acc.iter()
            .fold(_mm512_setzero_ps(), |s, x| _mm512_add_ps(s, *x)),
    )
}

fn fma_chains_scalar(iters: usize) -> f32 {
    let mut acc = [1.0f32; CHAINS];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = x.mul_add(0.999_999, 1e-7);
        }
    }
    acc.iter().sum()
}

/// GFLOP/s of `kernel` (lanes f32 per FMA) run on every thread at once, best of 5.
fn fma_rate(lanes: usize, kernel: fn(usize) -> f32) -> f64 {
    let threads = rayon::current_num_threads();
    let iters = FMA_ITERS / lanes.max(1) * 8;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        let s: f32 = (0..threads).into_par_iter().map(|_| kernel(iters)).sum();
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(s);
    }
    (threads * iters * CHAINS * lanes * 2) as f64 / best / 1e9
}

/// The best f32 FMA rate over the instruction sets this CPU has, with its name.
pub fn measure_fma_peak() -> (f64, String) {
    let mut best = (0.0, "none".to_string());
    #[cfg(target_arch = "x86_64")]
    {
        if simd::avx2_fma_available() {
            // SAFETY (both closures): the features were detected just above.
            let r = fma_rate(8, |n| unsafe { fma_chains_avx2(n) });
            if r > best.0 {
                best = (r, "avx2+fma".into());
            }
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            let r = fma_rate(16, |n| unsafe { fma_chains_avx512(n) });
            if r > best.0 {
                best = (r, "avx512f".into());
            }
        }
    }
    if best.0 == 0.0 {
        best = (fma_rate(1, fma_chains_scalar), "scalar".to_string());
    }
    best
}

/// Measures both limits with the current rayon pool.
pub fn measure() -> Roofline {
    let read_gbps = measure_read_bandwidth(10);
    let (fma_gflops, fma_isa) = measure_fma_peak();
    Roofline {
        machine: machine::machine_key(),
        cpu_model: machine::cpu_model(),
        threads: rayon::current_num_threads(),
        read_gbps,
        fma_gflops,
        fma_isa,
        measured_at: machine::now_rfc3339(),
        method: format!(
            "read: best of 10 parallel streaming sums over {} MiB; fma: best of 5, {CHAINS} independent FMA chains per thread",
            STREAM_BYTES >> 20
        ),
    }
}

/// Where the roofline of this machine at the current thread count is stored.
pub fn path(results: &Path) -> PathBuf {
    results.join("roofline").join(format!(
        "{}-{}t.json",
        machine::machine_key(),
        rayon::current_num_threads()
    ))
}

/// Writes `roof` to its per-machine file.
pub fn store(results: &Path, roof: &Roofline) -> Result<PathBuf> {
    let p = path(results);
    std::fs::create_dir_all(p.parent().expect("roofline path has a parent"))
        .map_err(HarnessError::io("creating results/roofline"))?;
    std::fs::write(&p, serde_json::to_string_pretty(roof)? + "\n")
        .map_err(HarnessError::io(format!("writing {}", p.display())))?;
    Ok(p)
}

/// The stored roofline of this machine, or a fresh measurement (stored) when there is none.
pub fn load_or_measure(results: &Path) -> Result<Roofline> {
    let p = path(results);
    if let Ok(text) = std::fs::read_to_string(&p) {
        return serde_json::from_str(&text).map_err(|e| {
            HarnessError::Usage(format!(
                "{} is not a roofline file ({e}); delete it to re-measure",
                p.display()
            ))
        });
    }
    eprintln!(
        "no roofline for this machine yet: measuring it (a few seconds) into {}",
        p.display()
    );
    let roof = measure();
    store(results, &roof)?;
    Ok(roof)
}
