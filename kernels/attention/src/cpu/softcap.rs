//! Attention logit soft-capping (Gemma-2, Team Gemma 2024: s' = cap · tanh(s / cap), applied
//! to the scaled scores before the mask and the softmax) on f32 score rows, with a
//! branch-free tanh that vectorises inside the callers' `#[target_feature]` functions.
//! Shared by every CPU attention variant (contiguous, paged, tree).

use kernel_cpu::simd::exp_f32;

/// Below this |x| tanh is its odd Taylor polynomial to x¹³ (relative error < 1e-10); above,
/// (1 − e^(−2|x|)) / (1 + e^(−2|x|)), whose cancellation costs at most ~3 ulp there.
const TAYLOR_BELOW: f32 = 0.3;

/// tanh(x) in f32, branch-free (both forms computed, one selected) so a loop over it
/// vectorises; ±∞ → ±1, NaN → NaN. Relative error within a few ulp of the exact value.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let x2 = a * a;
    // tanh x = x − x³/3 + 2x⁵/15 − 17x⁷/315 + 62x⁹/2835 − 1382x¹¹/155925 + 21844x¹³/6081075.
    let mut p = 21_844.0 / 6_081_075.0f32;
    p = p.mul_add(x2, -1_382.0 / 155_925.0);
    p = p.mul_add(x2, 62.0 / 2_835.0);
    p = p.mul_add(x2, -17.0 / 315.0);
    p = p.mul_add(x2, 2.0 / 15.0);
    p = p.mul_add(x2, -1.0 / 3.0);
    let small = (p * x2).mul_add(a, a);
    let e = exp_f32(-2.0 * a);
    let large = (1.0 - e) / (1.0 + e);
    let t = if a < TAYLOR_BELOW { small } else { large };
    t.copysign(x)
}

/// cap · tanh(s / cap) for one score.
#[inline(always)]
pub fn cap_score(cap: f32, s: f32) -> f32 {
    cap * tanh_f32(s / cap)
}

/// s ← cap · tanh(s / cap) for every score of `s`.
#[inline(always)]
pub fn cap_scores(cap: f32, s: &mut [f32]) {
    let inv = 1.0 / cap;
    for x in s.iter_mut() {
        *x = cap * tanh_f32(*x * inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tanh_is_accurate_everywhere() {
        let mut worst = 0.0f64;
        let mut x = -12.0f32;
        while x < 12.0 {
            let want = (x as f64).tanh();
            let got = tanh_f32(x) as f64;
            let err = (got - want).abs() / want.abs().max(f64::MIN_POSITIVE);
            worst = worst.max(if want == 0.0 { got.abs() } else { err });
            x += 1.0e-3 * (1.0 + x.abs());
        }
        for x in [1e-30f32, 1e-7, 0.299_999, 0.3, 0.300_001, 40.0, 1e30] {
            for x in [x, -x] {
                let want = (x as f64).tanh();
                worst = worst.max((tanh_f32(x) as f64 - want).abs() / want.abs());
            }
        }
        assert!(worst < 6e-7, "worst relative error {worst}");
        assert_eq!(tanh_f32(0.0), 0.0);
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert!(tanh_f32(f32::NAN).is_nan());
    }

    #[test]
    fn capping_bounds_scores_and_keeps_small_ones() {
        let mut s = vec![-1e6f32, -50.0, -0.01, 0.0, 0.01, 3.0, 1e6];
        cap_scores(5.0, &mut s);
        assert!(s.iter().all(|x| x.abs() <= 5.0));
        assert!((s[2] + 0.01).abs() < 1e-7 && (s[4] - 0.01).abs() < 1e-7);
        assert_eq!(s[3], 0.0);
        assert!((s[5] as f64 - 5.0 * (0.6f64).tanh()).abs() < 1e-6);
        assert_eq!(s[0], -5.0);
        assert_eq!(cap_score(5.0, 3.0), s[5]);
    }
}
