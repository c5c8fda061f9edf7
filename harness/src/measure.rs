//! Timing as DESIGN.md prescribes: one untimed warm-up, then repetitions (each preceded by a
//! pass over a buffer twice the L3 so no input is served from cache), reported as median,
//! p10, p90 and the count. Stops early after a time budget, never before 3 repetitions.

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

#[cfg(test)]
mod tests {
    use super::*;

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
