//! Goodness of fit for the statistical tests (lossless speculative sampling): Pearson's
//! chi-square statistic of observed counts against expected probabilities, with cells whose
//! expected count is under 5 pooled into one (the usual condition for the chi-square
//! approximation), and its p-value, the upper regularised incomplete gamma function
//! Q(dof/2, x/2) — a series below a + 1, Lentz's continued fraction above, ln Γ by Lanczos
//! (Numerical Recipes, 3rd ed., §6.1–6.2).

/// A chi-square test's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChiSquare {
    pub statistic: f64,
    pub dof: usize,
    /// P(X ≥ statistic) for X ~ χ²(dof).
    pub p_value: f64,
    /// Cells after pooling the small ones.
    pub cells: usize,
}

/// Pearson's test of `counts` against the probabilities `probs` (which sum to 1).
pub fn chi_square(counts: &[u64], probs: &[f64]) -> ChiSquare {
    assert_eq!(counts.len(), probs.len(), "one probability per cell");
    let n: u64 = counts.iter().sum();
    let (mut statistic, mut cells) = (0.0, 0usize);
    let (mut pooled_count, mut pooled_expected) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        let e = n as f64 * p;
        if e < 5.0 {
            pooled_count += c as f64;
            pooled_expected += e;
        } else {
            statistic += (c as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pooled_expected > 0.0 {
        statistic += (pooled_count - pooled_expected).powi(2) / pooled_expected;
        cells += 1;
    } else if pooled_count > 0.0 {
        // Counts where nothing was expected: no fit at all.
        statistic = f64::INFINITY;
    }
    let dof = cells.saturating_sub(1).max(1);
    ChiSquare {
        statistic,
        dof,
        p_value: upper_gamma(dof as f64 / 2.0, statistic / 2.0),
        cells,
    }
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; relative error below 1e-14).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let t = x + 7.5;
    let s = C[1..]
        .iter()
        .enumerate()
        .fold(C[0], |s, (i, c)| s + c / (x + 1.0 + i as f64));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + s.ln()
}

/// Q(a, x) = Γ(a, x) / Γ(a).
fn upper_gamma(a: f64, x: f64) -> f64 {
    if x.is_infinite() {
        return 0.0;
    }
    if x <= 0.0 {
        return 1.0;
    }
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        // P(a, x) by its series; Q = 1 − P.
        let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        (1.0 - sum * front).max(0.0)
    } else {
        // Q(a, x) by its continued fraction (modified Lentz).
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        front * h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p_values_match_tabulated_quantiles() {
        // (dof, x, P(X ≥ x)): the tables' quantiles, to 15 digits.
        for (dof, x, p) in [
            (1.0, 3.841_458_820_694_124, 0.05),
            (5.0, 20.515_005_652_432_876, 0.001),
            (10.0, 18.307_038_053_275_146, 0.05),
            (63.0, 82.528_726_541_472_31, 0.05),
            (63.0, 103.442_377_319_922_36, 0.001),
        ] {
            let got = upper_gamma(dof / 2.0, x / 2.0);
            assert!((got - p).abs() < 1e-9 * p, "dof {dof} x {x}: {got}");
        }
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-13);
    }

    #[test]
    fn a_fair_count_fits_and_a_skewed_one_does_not() {
        let p = [0.25; 4];
        assert!(chi_square(&[250, 251, 249, 250], &p).p_value > 0.99);
        let skewed = chi_square(&[400, 200, 200, 200], &p);
        assert!(skewed.p_value < 1e-10 && skewed.dof == 3, "{skewed:?}");
        // Small cells pool: 3 cells of expected 1 become one.
        let pooled = chi_square(&[50, 47, 1, 1, 1], &[0.485, 0.485, 0.01, 0.01, 0.01]);
        assert_eq!(pooled.cells, 3);
    }
}
