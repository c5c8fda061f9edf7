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
}

/// The tolerance table: f32 storage and accumulation; f16/bf16 storage with f32 accumulation.
/// The reference sees exactly the rounded inputs the variant sees, so what remains is
/// accumulation order and the rounding of the output to its storage type.
pub fn tolerance(dtype: DType) -> Tolerance {
    match dtype {
        DType::F32 => Tolerance {
            rel_l2: 1e-5,
            max_abs: 1e-4,
        },
        DType::F16 => Tolerance {
            rel_l2: 1e-3,
            max_abs: 1e-2,
        },
        DType::BF16 => Tolerance {
            rel_l2: 1e-2,
            max_abs: 6e-2,
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
