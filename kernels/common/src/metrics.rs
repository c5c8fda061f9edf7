//! Error metrics of a variant's output against the f64 reference — max |err|, relative L2
//! ‖out−ref‖/‖ref‖ and NMSE mse(out,ref)/mse(ref,0) — and the per-dtype tolerance table, the
//! one place tolerances live (llama.cpp test-backend-ops uses NMSE the same way).

use crate::dtype::DType;

/// How far one output is from the reference.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ErrorStats {
    /// Largest absolute difference (NaN when any output is NaN).
    pub max_abs: f64,
    /// ‖out − ref‖₂ / ‖ref‖₂.
    pub rel_l2: f64,
    /// mse(out, ref) / mse(ref, 0), i.e. rel_l2².
    pub nmse: f64,
    /// Outputs that are NaN or infinite while the reference is finite.
    pub non_finite: usize,
    /// Elements compared.
    pub count: usize,
}

impl ErrorStats {
    /// Compares `out` with `reference` element by element.
    pub fn compare(out: &[f32], reference: &[f64]) -> ErrorStats {
        assert_eq!(out.len(), reference.len(), "compare needs equal lengths");
        let mut stats = ErrorStats {
            count: out.len(),
            ..ErrorStats::default()
        };
        let (mut err2, mut ref2) = (0.0f64, 0.0f64);
        for (&o, &r) in out.iter().zip(reference) {
            let o = o as f64;
            if !o.is_finite() {
                stats.non_finite += 1;
                continue;
            }
            let d = (o - r).abs();
            stats.max_abs = stats.max_abs.max(d);
            err2 += d * d;
            ref2 += r * r;
        }
        if stats.non_finite > 0 {
            stats.max_abs = f64::NAN;
            stats.rel_l2 = f64::NAN;
            stats.nmse = f64::NAN;
            return stats;
        }
        stats.rel_l2 = if ref2 > 0.0 {
            (err2 / ref2).sqrt()
        } else {
            err2.sqrt()
        };
        stats.nmse = stats.rel_l2 * stats.rel_l2;
        stats
    }

    /// Whether these errors are within `tol`. NaN never passes.
    pub fn passes(&self, tol: &Tolerance) -> bool {
        self.non_finite == 0
            && self.rel_l2.is_finite()
            && self.rel_l2 <= tol.rel_l2
            && self.max_abs <= tol.max_abs
    }
}

/// Acceptance bounds for one storage dtype.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Bound on relative L2 error.
    pub rel_l2: f64,
    /// Bound on max |err| (inputs are unit normals, so outputs are O(1)).
    pub max_abs: f64,
}

impl Tolerance {
    /// The bound for a reference whose largest magnitude may exceed 1 (weights with outlier
    /// channels): max |err| scales with max(1, max |ref|), rel L2 is unchanged.
    pub fn scaled_to(self, reference: &[f64]) -> Tolerance {
        let peak = reference.iter().fold(1.0f64, |m, r| m.max(r.abs()));
        Tolerance {
            rel_l2: self.rel_l2,
            max_abs: self.max_abs * peak,
        }
    }

    /// The bound for an output whose size follows its reference's, smaller than 1 included:
    /// attention, where each output is a weighted mean of value rows and a long context
    /// shrinks it (an absolute max |err| would let a wrong element through). max |err| scales
    /// with max |ref| (floored at 1e-3, so an all-but-zero output is not held to zero).
    pub fn at_peak(self, reference: &[f64]) -> Tolerance {
        let peak = reference.iter().fold(1e-3f64, |m, r| m.max(r.abs()));
        Tolerance {
            rel_l2: self.rel_l2,
            max_abs: self.max_abs * peak,
        }
    }
}

/// The tolerance table: f32 storage and accumulation; f16/bf16 storage with f32 accumulation.
/// The reference sees exactly the rounded inputs the variant sees, so what remains is
/// accumulation order and the rounding of the output to its storage type: at most half an
/// ulp, 2^-11 (f16) or 2^-8 (bf16) of a value, RMS about a third of that.
///
/// Set from `harness check --family attention` (every variant, 23 cases, seed 42, 2-vCPU Xeon,
/// 2026-12-03), whose largest errors were: f32 rel L2 5.1e-7, max |err| 1.4e-6; f16 2.2e-4 and
/// 9.7e-4; bf16 1.7e-3 and 7.8e-3 (outputs of peak ~3). The rel L2 bounds are ~3× those,
/// and the max |err| bounds 4–5× the half-ulp of an output of magnitude 1: for outputs whose
/// size is not about 1, scale them by the reference's peak (`scaled_to`, `at_peak`).
pub fn tolerance(dtype: DType) -> Tolerance {
    match dtype {
        DType::F32 => Tolerance {
            rel_l2: 1e-5,
            max_abs: 1e-4,
        },
        DType::F16 => Tolerance {
            rel_l2: 6e-4,
            max_abs: 2e-3,
        },
        DType::BF16 => Tolerance {
            rel_l2: 5e-3,
            max_abs: 2e-2,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_output_has_zero_error() {
        let s = ErrorStats::compare(&[1.0, -2.0], &[1.0, -2.0]);
        assert_eq!(s.max_abs, 0.0);
        assert_eq!(s.rel_l2, 0.0);
        assert!(s.passes(&tolerance(DType::F32)));
    }

    #[test]
    fn a_small_output_is_held_to_its_own_size() {
        // A long context's output of ~0.02: one element 0.01 off is half its size.
        let want = [0.02f64, -0.015, 0.01];
        let got = [0.02f32, -0.015, 0.02];
        let s = ErrorStats::compare(&got, &want);
        assert!(
            s.max_abs <= tolerance(DType::BF16).max_abs,
            "absolute passes"
        );
        assert!(!s.passes(&tolerance(DType::BF16).at_peak(&want)));
        // One bf16 rounding (2^-9 relative) of each passes.
        let rounded: Vec<f32> = want
            .iter()
            .map(|&v| (v * (1.0 + 1.0 / 512.0)) as f32)
            .collect();
        let s = ErrorStats::compare(&rounded, &want);
        assert!(s.passes(&tolerance(DType::BF16).at_peak(&want)), "{s:?}");
    }

    #[test]
    fn nan_never_passes() {
        let s = ErrorStats::compare(&[1.0, f32::NAN], &[1.0, 2.0]);
        assert_eq!(s.non_finite, 1);
        assert!(!s.passes(&tolerance(DType::BF16)));
    }

    #[test]
    fn scaled_tolerance_follows_the_peak() {
        let t = tolerance(DType::F32);
        assert_eq!(t.scaled_to(&[0.5, -0.2]), t);
        assert_eq!(t.scaled_to(&[10.0, -300.0]).max_abs, t.max_abs * 300.0);
    }

    #[test]
    fn metrics_match_definitions() {
        let s = ErrorStats::compare(&[1.0, 2.0, 2.0], &[1.0, 2.0, 3.0]);
        assert_eq!(s.max_abs, 1.0);
        assert!((s.rel_l2 - (1.0f64 / 14.0).sqrt()).abs() < 1e-12);
        assert!((s.nmse - 1.0 / 14.0).abs() < 1e-12);
        assert!(!s.passes(&tolerance(DType::F32)));
    }
}
