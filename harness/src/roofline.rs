//! This machine's limits: read bandwidth from a parallel streaming sum over a buffer 16× the
//! L3, the f32 FMA peak from independent FMA chains on every thread (AVX2 and, where
//! present, AVX-512; the larger is the limit), and the int8 multiply-accumulate peak of the
//! instruction the int8-activation products are built on (`vpdpbusd` with AVX-512 VNNI,
//! `vpmaddubsw` into i16 sums on AVX2), from independent chains likewise. Williams et al., "Roofline". Every experiment
//! measures them afresh when it starts and compares its rows with that measurement (this
//! shared VM's bandwidth moved between 25 and 50 GB/s within an hour); the best values ever
//! seen are kept per machine and thread count in `results/roofline/<machine>-<threads>t.json`.

use crate::error::{HarnessError, Result};
use crate::machine;
use kernel_cpu::simd;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Measured limits of one machine at one thread count (`Default`: none measured, as in
/// `harness plan`, which measures nothing).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
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
    /// Best int8 multiply-accumulate throughput, GMAC/s (0 in files written before it was
    /// measured).
    #[serde(default)]
    pub int8_gmacs: f64,
    /// Instruction that reached `int8_gmacs`.
    #[serde(default)]
    pub int8_isa: String,
    pub read_measured_at: String,
    pub fma_measured_at: String,
    pub method: String,
}

impl Roofline {
    /// The larger of each limit from `self` and `other`, each with its own time: a limit is a
    /// peak, and on a shared machine noise only lowers a measurement.
    pub fn best_of(self, other: Roofline) -> Roofline {
        let (read_gbps, read_measured_at) = if other.read_gbps > self.read_gbps {
            (other.read_gbps, other.read_measured_at.clone())
        } else {
            (self.read_gbps, self.read_measured_at.clone())
        };
        let (fma_gflops, fma_isa, fma_measured_at) = if other.fma_gflops > self.fma_gflops {
            (
                other.fma_gflops,
                other.fma_isa.clone(),
                other.fma_measured_at.clone(),
            )
        } else {
            (
                self.fma_gflops,
                self.fma_isa.clone(),
                self.fma_measured_at.clone(),
            )
        };
        let (int8_gmacs, int8_isa) = if other.int8_gmacs > self.int8_gmacs {
            (other.int8_gmacs, other.int8_isa.clone())
        } else {
            (self.int8_gmacs, self.int8_isa.clone())
        };
        Roofline {
            read_gbps,
            read_measured_at,
            fma_gflops,
            fma_isa,
            fma_measured_at,
            int8_gmacs,
            int8_isa,
            ..other
        }
    }
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
    if kernel_cpu::Isa::Avx2.supported() {
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
        // The machine's ceiling, whatever --isa caps the kernels at: the roofline is a
        // property of the machine, and an avx2-capped run reads its % against it.
        if kernel_cpu::Isa::Avx2.supported() {
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

/// Independent `vpdpbusd` chains (64 int8 MACs each); returns a value so none is dropped.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
fn int8_chains_vnni(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_epi8(3), _mm512_set1_epi8(-2));
    let mut acc = [_mm512_setzero_si512(); CHAINS];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_dpbusd_epi32(*x, a, b);
        }
    }
    let s = acc
        .iter()
        .fold(_mm512_setzero_si512(), |s, x| _mm512_add_epi32(s, *x));
    _mm512_reduce_add_epi32(s) as f32
}

/// Independent `vpmaddubsw` + `vpaddw` chains (32 int8 MACs each, summed in i16: the AVX2
/// tiles' inner step).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn int8_chains_avx2(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_epi8(3), _mm256_set1_epi8(-2));
    let mut acc = [_mm256_setzero_si256(); CHAINS];
    let _ = a;
    for _ in 0..iters {
        for x in acc.iter_mut() {
            // The chain's own value is the unsigned operand, so no product is loop-invariant
            // (the compiler would hoist it and leave additions only).
            *x = _mm256_add_epi16(*x, _mm256_maddubs_epi16(*x, b));
        }
    }
    let s = acc
        .iter()
        .fold(_mm256_setzero_si256(), |s, x| _mm256_add_epi16(s, *x));
    let mut out = [0i16; 16];
    // SAFETY: `out` holds 16 i16, what one unaligned 256-bit store writes.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, s) };
    out.iter().map(|&v| v as f32).sum()
}

/// The best int8 MAC rate (GMAC/s) over the instructions this CPU has, with its name; 0 and
/// "none" where it has neither.
pub fn measure_int8_peak() -> (f64, String) {
    let mut best = (0.0, "none".to_string());
    #[cfg(target_arch = "x86_64")]
    {
        if kernel_cpu::Isa::Avx2.supported() {
            // SAFETY (both closures): the features were detected just above.
            // fma_rate counts 2 per lane and instruction: half of it is the MACs.
            let r = fma_rate(32, |n| unsafe { int8_chains_avx2(n) }) / 2.0;
            if r > best.0 {
                best = (r, "vpmaddubsw".into());
            }
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vnni")
        {
            let r = fma_rate(64, |n| unsafe { int8_chains_vnni(n) }) / 2.0;
            if r > best.0 {
                best = (r, "vpdpbusd".into());
            }
        }
    }
    best
}

/// Measures the limits with the current rayon pool.
pub fn measure() -> Roofline {
    let read_gbps = measure_read_bandwidth(10);
    let (fma_gflops, fma_isa) = measure_fma_peak();
    let (int8_gmacs, int8_isa) = measure_int8_peak();
    let now = machine::now_rfc3339();
    Roofline {
        machine: machine::machine_key(),
        cpu_model: machine::cpu_model(),
        threads: rayon::current_num_threads(),
        read_gbps,
        fma_gflops,
        fma_isa,
        int8_gmacs,
        int8_isa,
        read_measured_at: now.clone(),
        fma_measured_at: now,
        method: format!(
            "read: best of 10 parallel streaming sums over {} MiB; fma: best of 5, {CHAINS} independent FMA chains per thread; int8: the same with vpdpbusd (AVX-512 VNNI) or vpmaddubsw + vpaddw (AVX2) chains",
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
    // Shards of a sweep on one machine store concurrently: whole files only.
    crate::atomic::write(&p, serde_json::to_string_pretty(roof)? + "\n")?;
    Ok(p)
}

/// The stored roofline of this machine, if there is a readable one.
pub fn stored(results: &Path) -> Option<Roofline> {
    serde_json::from_str(&std::fs::read_to_string(path(results)).ok()?).ok()
}

/// Bytes of the device copy (each copy reads and writes this much).
pub const CUDA_COPY_BYTES: usize = 2 << 30;
/// n of the n×n×n bf16 GEMM.
pub const CUDA_GEMM_N: usize = 8192;

/// `$WORKBENCH_CUDA_ROOFLINE=MIB,N` shrinks the copy to MIB MiB and the GEMM to N (a multiple
/// of 128): for tests on the CPU emulator, where the full sizes would take hours.
fn cuda_roofline_sizes() -> Result<(usize, usize)> {
    let Ok(text) = std::env::var("WORKBENCH_CUDA_ROOFLINE") else {
        return Ok((CUDA_COPY_BYTES, CUDA_GEMM_N));
    };
    text.split_once(',')
        .and_then(|(m, n)| {
            Some((
                m.trim().parse::<usize>().ok()? << 20,
                n.trim().parse().ok()?,
            ))
        })
        .filter(|&(m, n)| m > 0 && n > 0)
        .ok_or_else(|| {
            HarnessError::Usage(format!(
                "WORKBENCH_CUDA_ROOFLINE='{text}' must be COPY_MIB,GEMM_N (e.g. 16,256)"
            ))
        })
}

/// CUDA device `ordinal`'s ceilings as a `Roofline`: `read_gbps` is a 2 GiB device-to-device
/// copy's bytes read plus written per second, `fma_gflops` the bf16 rate of the workbench's
/// own tensor-core GEMM (roofline.cu: mma.sync, not cuBLAS, so a lower bound on the chip's);
/// `cpu_model` names the GPU and `threads` counts its multiprocessors.
pub fn measure_cuda(ordinal: usize) -> Result<Roofline> {
    use kernel_cuda::{roofline as dev, CudaRuntime};
    let (copy_bytes, gemm_n) = cuda_roofline_sizes()?;
    let rt = CudaRuntime::get(ordinal)?;
    let read_gbps = dev::copy_gbps(&rt, copy_bytes, 20)?;
    let gemm = dev::gemm_bf16_gflops(&rt, gemm_n, 10, 0x600F)?;
    let now = machine::now_rfc3339();
    Ok(Roofline {
        machine: format!("cuda-{}", slug(&rt.name)),
        cpu_model: rt.name.clone(),
        threads: rt.sm_count,
        read_gbps,
        fma_gflops: gemm.gflops,
        fma_isa: format!(
            "bf16 mma.sync.m16n8k16, workbench GEMM {n}x{n}x{n} (sampled rel. err {:.1e})",
            gemm.max_rel_err,
            n = gemm_n
        ),
        // The device roofline measures no int8 peak.
        int8_gmacs: 0.0,
        int8_isa: String::new(),
        read_measured_at: now.clone(),
        fma_measured_at: now,
        method: format!(
            "CUDA events, median: 20 device-to-device copies of {} MiB (read + write bytes); 10 bf16 GEMMs on seeded normal data, checked on 64 sampled entries first",
            copy_bytes >> 20
        ),
    })
}

fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.to_lowercase().chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

/// Where a device's roofline is stored.
pub fn cuda_path(results: &Path, roof: &Roofline) -> PathBuf {
    results
        .join("roofline")
        .join(format!("{}.json", roof.machine))
}

/// Measures device `ordinal` now, folds it into its stored best-seen file, returns the
/// fresh measurement and the file.
pub fn measure_cuda_and_record(results: &Path, ordinal: usize) -> Result<(Roofline, PathBuf)> {
    let fresh = measure_cuda(ordinal)?;
    let p = cuda_path(results, &fresh);
    let best = match std::fs::read_to_string(&p)
        .ok()
        .and_then(|t| serde_json::from_str::<Roofline>(&t).ok())
    {
        Some(old) => old.best_of(fresh.clone()),
        None => fresh.clone(),
    };
    std::fs::create_dir_all(p.parent().expect("roofline path has a parent"))
        .map_err(HarnessError::io("creating results/roofline"))?;
    crate::atomic::write(&p, serde_json::to_string_pretty(&best)? + "\n")?;
    Ok((fresh, p))
}

/// Measures this machine now and folds the result into its stored best-seen file; returns
/// the fresh measurement, the limit a run started now is compared with.
pub fn measure_and_record(results: &Path) -> Result<Roofline> {
    let fresh = measure();
    let best = match stored(results) {
        Some(old) => old.best_of(fresh.clone()),
        None => fresh.clone(),
    };
    store(results, &best)?;
    Ok(fresh)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roof(read: f64, fma: f64, at: &str) -> Roofline {
        Roofline {
            machine: "m".into(),
            cpu_model: "c".into(),
            threads: 2,
            read_gbps: read,
            fma_gflops: fma,
            fma_isa: format!("isa-{at}"),
            int8_gmacs: fma,
            int8_isa: format!("int8-{at}"),
            read_measured_at: at.into(),
            fma_measured_at: at.into(),
            method: "x".into(),
        }
    }

    #[test]
    fn best_of_keeps_each_peak_with_its_time() {
        let best = roof(30.0, 200.0, "t1").best_of(roof(35.0, 150.0, "t2"));
        assert_eq!(best.read_gbps, 35.0);
        assert_eq!(best.fma_gflops, 200.0);
        assert_eq!(best.fma_isa, "isa-t1");
        assert_eq!(
            (
                best.read_measured_at.as_str(),
                best.fma_measured_at.as_str()
            ),
            ("t2", "t1")
        );
        let same = roof(30.0, 200.0, "t1").best_of(roof(20.0, 100.0, "t2"));
        assert_eq!((same.read_gbps, same.fma_gflops), (30.0, 200.0));
        assert_eq!(same.clone().best_of(same.clone()), same);
    }
}
