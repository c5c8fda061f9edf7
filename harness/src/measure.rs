//! Timing as DESIGN.md prescribes: one untimed warm-up, then repetitions (each preceded by a
//! pass over a buffer twice the L3 so no input is served from cache), reported as median,
//! p10, p90 and the count. Stops early after a time budget, never before 3 repetitions.
//! (CUDA variants time themselves with CUDA events, `kernel_cuda::CudaRuntime::time`: one
//! warm-up, the device's L2 flushed before each repetition — cold, the default — or not, the
//! hot column; `hot_timing` runs the latter.) A CUDA row's effective bandwidth above the
//! run's measured device copy bandwidth is an error, not a result (`implausible_bandwidth`,
//! applied by `Row::hold_to_copy_bandwidth`).

use kernel_common::error::Result;
use std::time::Instant;

/// Bytes of the cache-flush buffer (2 × a 32 MiB L3).
pub const FLUSH_BYTES: usize = 64 << 20;

/// A buffer whose traversal evicts the caches.
pub struct CacheFlusher {
    buf: Vec<u64>,
}

impl CacheFlusher {
    /// Allocates and touches the buffer.
    pub fn new() -> CacheFlusher {
        CacheFlusher {
            buf: (0..FLUSH_BYTES as u64 / 8).collect(),
        }
    }

    /// Reads every line of the buffer (reads only: dirty lines would be written back during
    /// the timed call and steal its bandwidth).
    pub fn flush(&mut self) {
        let mut x = 0u64;
        for v in self.buf.iter().step_by(8) {
            x = x.wrapping_add(*v);
        }
        std::hint::black_box(x);
    }
}

impl Default for CacheFlusher {
    fn default() -> Self {
        Self::new()
    }
}

/// Seconds of each timed repetition.
#[derive(Debug, Clone, Default)]
pub struct Timing {
    pub samples: Vec<f64>,
}

impl Timing {
    /// The p-th percentile (0..=100), linear between order statistics.
    pub fn percentile(&self, p: f64) -> f64 {
        let mut s = self.samples.clone();
        s.sort_by(f64::total_cmp);
        if s.is_empty() {
            return f64::NAN;
        }
        let pos = p / 100.0 * (s.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
    }

    /// Median seconds.
    pub fn median(&self) -> f64 {
        self.percentile(50.0)
    }
}

/// Times `reps` calls of `f`, flushing caches before each; stops once `budget_s` seconds of
/// timed calls have passed and at least 3 ran.
pub fn time_reps(
    reps: usize,
    budget_s: f64,
    flusher: &mut CacheFlusher,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    let mut t = Timing::default();
    let mut spent = 0.0;
    for i in 0..reps.max(1) {
        if i >= 3 && spent > budget_s {
            break;
        }
        flusher.flush();
        let start = Instant::now();
        f()?;
        let dt = start.elapsed().as_secs_f64();
        spent += dt;
        t.samples.push(dt);
    }
    Ok(t)
}

/// The same device timing hot: `time` (a family's `time_on_device`, `time(reps)`, ...) run
/// under `kernel_cuda::Flush::Hot`, so its repetitions find what the warm-up left in L2.
/// Its median in ms, for a row's `hot_median_ms`.
pub fn hot_timing(time: impl FnOnce() -> Result<Vec<f64>>) -> Result<f64> {
    let samples = kernel_cuda::Flush::Hot.scoped(time)?;
    Ok(Timing { samples }.median() * 1e3)
}

/// Whether rows of `device` (`cpu`, `cuda:0`) are held to the device's copy bandwidth.
pub fn on_cuda(device: &str) -> bool {
    device.starts_with("cuda")
}

/// Why a CUDA row's measured `gbps` cannot be right: it is above `copy_gbps`, the device's
/// copy bandwidth (bytes read plus written per second) measured at the start of the run, so
/// the bytes did not all come from device memory (an input left in L2, a cost model that
/// counts bytes never read) or the events missed work. None when plausible, or when no copy
/// bandwidth was measured (`copy_gbps` 0 or not finite) or `gbps` is not a number.
pub fn implausible_bandwidth(gbps: f64, copy_gbps: f64) -> Option<String> {
    (copy_gbps.is_finite() && copy_gbps > 0.0 && gbps.is_finite() && gbps > copy_gbps).then(|| {
        format!(
            "implausible: {gbps:.0} GB/s is above the device's copy bandwidth ({copy_gbps:.0} GB/s, \
             measured at the start of the run); the timing is not a result (inputs served from \
             L2? bytes counted that are never read?)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_above_the_device_copy_is_implausible() {
        assert_eq!(implausible_bandwidth(4000.0, 4300.0), None);
        assert_eq!(implausible_bandwidth(4300.0, 4300.0), None);
        let why = implausible_bandwidth(9000.0, 4300.0).unwrap();
        assert!(
            why.contains("9000 GB/s") && why.contains("4300 GB/s"),
            "{why}"
        );
        // No copy bandwidth measured (`harness plan`'s empty roofline), or no rate.
        assert_eq!(implausible_bandwidth(9000.0, 0.0), None);
        assert_eq!(implausible_bandwidth(f64::NAN, 4300.0), None);
        assert_eq!(implausible_bandwidth(f64::INFINITY, 4300.0), None);
        assert!(on_cuda("cuda:0") && on_cuda("cuda") && !on_cuda("cpu"));
    }

    #[test]
    fn a_hot_timing_runs_in_the_hot_mode_and_gives_its_median_in_ms() {
        use kernel_cuda::Flush;
        let ms = hot_timing(|| {
            assert_eq!(Flush::current(), Flush::Hot);
            Ok(vec![0.003, 0.001, 0.002])
        })
        .unwrap();
        assert!((ms - 2.0).abs() < 1e-12, "{ms}");
        assert_eq!(Flush::current(), Flush::Cold);
        let failed = hot_timing(|| Err(kernel_common::KernelError::DeviceFailure("x".into())));
        assert!(failed.is_err());
    }

    #[test]
    fn percentiles_interpolate() {
        let t = Timing {
            samples: vec![4.0, 1.0, 3.0, 2.0, 5.0],
        };
        assert_eq!(t.median(), 3.0);
        assert_eq!(t.percentile(0.0), 1.0);
        assert_eq!(t.percentile(100.0), 5.0);
        assert!((t.percentile(10.0) - 1.4).abs() < 1e-12);
    }

    #[test]
    fn budget_stops_after_three() {
        let mut fl = CacheFlusher { buf: vec![0; 64] };
        let mut n = 0;
        let t = time_reps(10, 0.0, &mut fl, || {
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(t.samples.len(), 3);
        assert_eq!(n, 3);
    }
}
