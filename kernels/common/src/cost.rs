//! Minimum-traffic cost accounting: the bytes a variant must move and the FLOPs it must do,
//! from which the harness derives GB/s, GFLOP/s and the % of the roofline (Williams et al.).

use std::ops::Add;

/// Bytes moved to/from memory and floating-point operations of one kernel call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    /// Bytes that must cross the memory interface at minimum for this algorithm.
    pub bytes: u64,
    /// Useful floating-point operations (one FMA = 2).
    pub flops: u64,
}

impl Cost {
    /// Time the roofline allows: the slower of moving the bytes and doing the FLOPs.
    pub fn roofline_seconds(&self, bandwidth_bytes_per_s: f64, flops_per_s: f64) -> f64 {
        let t_mem = self.bytes as f64 / bandwidth_bytes_per_s;
        let t_fma = self.flops as f64 / flops_per_s;
        t_mem.max(t_fma)
    }

    /// Arithmetic intensity in FLOPs per byte.
    pub fn intensity(&self) -> f64 {
        self.flops as f64 / (self.bytes.max(1)) as f64
    }

    /// Whether the roofline puts this call on the memory side of the ridge point.
    pub fn memory_bound(&self, bandwidth_bytes_per_s: f64, flops_per_s: f64) -> bool {
        self.intensity() < flops_per_s / bandwidth_bytes_per_s
    }
}

impl Add for Cost {
    type Output = Cost;
    fn add(self, rhs: Cost) -> Cost {
        Cost {
            bytes: self.bytes + rhs.bytes,
            flops: self.flops + rhs.flops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roofline_picks_the_slower_side() {
        let c = Cost {
            bytes: 1_000,
            flops: 10_000,
        };
        // 1000 B at 100 B/s = 10 s; 10000 F at 10000 F/s = 1 s.
        assert_eq!(c.roofline_seconds(100.0, 10_000.0), 10.0);
        assert!(c.memory_bound(100.0, 10_000.0));
        assert!(!c.memory_bound(10_000.0, 100.0));
        assert_eq!(c.intensity(), 10.0);
    }
}
