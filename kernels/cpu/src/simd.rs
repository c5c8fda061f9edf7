//! Vectorisable f32 primitives — dot, axpy, scale, max, exp — written over fixed-width lane
//! arrays so LLVM emits packed FMAs when they are inlined into a function compiled with
//! `#[target_feature(enable = "avx2,fma")]`. Kernels pick that version at run time when
//! `Isa::active()` allows AVX2 (no build flag, so the binary still runs on any x86-64 or ARM
//! CPU). The row-blocked products of decode attention live in `rows` with explicit intrinsics.

/// Lanes per accumulator block: two AVX2 registers of 8 f32.
pub const LANES: usize = 16;

/// Asks the CPU to bring every cache line of `x` into L2 (a hint; no effect elsewhere
/// than x86-64). Used to fetch the next paged block while the current one is computed on.
#[inline(always)]
pub fn prefetch<T>(x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let bytes = std::mem::size_of_val(x);
        let base = x.as_ptr() as *const i8;
        let mut off = 0;
        while off < bytes {
            // SAFETY: prefetch never faults; the address is inside `x`.
            unsafe { _mm_prefetch(base.add(off), _MM_HINT_T1) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// Σ a[i]·b[i] over the common length.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail = x.mul_add(*y, tail);
    }
    hsum(&acc) + tail
}

/// Σ a[i]·b[i] with separate multiply and add: vectorises with the baseline ISA (SSE2 on
/// x86-64) in code compiled without FMA, where `dot`'s `mul_add` becomes a call to the
/// software `fmaf` per element (measured: the portable quant GEMV spent most of its time
/// there).
#[inline(always)]
pub fn dot_plain(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    hsum(&acc) + tail
}

/// Pairwise sum of one lane block.
#[inline(always)]
fn hsum(acc: &[f32; LANES]) -> f32 {
    let mut h = [0.0f32; LANES / 2];
    for l in 0..LANES / 2 {
        h[l] = acc[l] + acc[l + LANES / 2];
    }
    let mut s = 0.0;
    for x in h {
        s += x;
    }
    s
}

/// y[i] += alpha · x[i].
#[inline(always)]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    for (yi, xi) in y[..n].iter_mut().zip(&x[..n]) {
        *yi = xi.mul_add(alpha, *yi);
    }
}

/// y[i] += alpha·x[i] with separate multiply and add: vectorises with the baseline ISA in code
/// compiled without FMA (see `dot_plain`; the naive MoE experts ran at 1.5 GFLOP/s on
/// `axpy`'s software `fmaf` calls).
#[inline(always)]
pub fn axpy_plain(alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    for (yi, xi) in y[..n].iter_mut().zip(&x[..n]) {
        *yi += xi * alpha;
    }
}

/// y[i] *= alpha.
#[inline(always)]
pub fn scale(alpha: f32, y: &mut [f32]) {
    for yi in y.iter_mut() {
        *yi *= alpha;
    }
}

/// Largest element (−∞ for an empty slice); NaN inputs are ignored by `f32::max`.
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let c = x.chunks_exact(LANES);
    let r = c.remainder();
    for blk in c {
        for l in 0..LANES {
            acc[l] = acc[l].max(blk[l]);
        }
    }
    let mut m = f32::NEG_INFINITY;
    for v in acc.iter().chain(r) {
        m = m.max(*v);
    }
    m
}

/// e^x for one value, branch-free so a loop over it vectorises: Cody–Waite range reduction
/// x = n·ln2 + r, a degree-6 polynomial for e^r on |r| ≤ ln2/2, then 2^n by exponent bits.
/// Relative error ≤ 2 ulp on [−87, 88]; returns exactly 0 below −87.33 (so e^−∞ = 0).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = x.clamp(-87.336_54, 88.376_26);
    let n = (xc * LOG2E + 0.5).floor();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, xc));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 5e-1);
    let er = (p * r).mul_add(r, r) + 1.0;
    // n is a whole number in [−126, 128]: adding 1.5·2²³ puts it in the low mantissa bits
    // exactly, so this is `n as i32` without Rust's saturating cast, whose NaN and range
    // checks (compares and conditional moves per value) kept every loop over this function
    // scalar — SwiGLU's gate ran at 2.5 ns a value.
    const MAGIC: f32 = 12_582_912.0;
    let n_int = ((n + MAGIC).to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let two_n = f32::from_bits((n_int.wrapping_add(127) as u32) << 23);
    let y = er * two_n;
    if x < -87.336_54 {
        0.0
    } else {
        y
    }
}

/// x[i] ← e^(x[i] − shift), returning Σ of the results (the softmax denominator update).
/// Element i is added into lane i mod LANES, the tail's too, so values appended after the
/// last one that are −∞ (e^−∞ = 0) leave the sum's bits unchanged: a score row masked past a
/// query's last key sums as the same row cut there (what lets one multi-token paged decode
/// call give each row its own decode step's bits).
#[inline(always)]
pub fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = x.chunks_exact_mut(LANES);
    for blk in &mut chunks {
        for l in 0..LANES {
            blk[l] = exp_f32(blk[l] - shift);
            acc[l] += blk[l];
        }
    }
    for (l, v) in chunks.into_remainder().iter_mut().enumerate() {
        *v = exp_f32(*v - shift);
        acc[l] += *v;
    }
    hsum(&acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_axpy_scale_max_match_scalar() {
        for n in [0usize, 1, 15, 16, 17, 54, 97, 128] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-5);
            let mut y = b.clone();
            axpy(0.5, &a, &mut y);
            for i in 0..n {
                assert_eq!(y[i], a[i].mul_add(0.5, b[i]));
            }
            scale(2.0, &mut y);
            let m = max(&a);
            let want_max = a.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(m, want_max);
        }
    }

    #[test]
    fn exp_is_accurate_and_zero_at_minus_infinity() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = exp_f32(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.013;
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(0.0), 1.0);
        let mut v = vec![0.0f32, f32::NEG_INFINITY, 1.0];
        let s = exp_shifted_sum(&mut v, 1.0);
        assert!((s - (1.0 + (-1.0f32).exp())).abs() < 1e-6);
        assert_eq!(v[1], 0.0);
    }

    #[test]
    fn exp_shifted_sum_ignores_trailing_minus_infinities_to_the_bit() {
        // Every length, every number of −∞ appended (0 included): the same bits as the row
        // cut before them. A scalar tail summed apart from the lanes failed this.
        for n in 1..=40usize {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.71).sin() * 3.0).collect();
            let want = exp_shifted_sum(&mut x.clone(), 0.4);
            for extra in 1..=2 * LANES {
                let mut padded = x.clone();
                padded.resize(n + extra, f32::NEG_INFINITY);
                let got = exp_shifted_sum(&mut padded, 0.4);
                assert_eq!(got.to_bits(), want.to_bits(), "n {n} + {extra} masked");
            }
        }
    }

    #[test]
    fn exp_gives_the_bits_of_its_saturating_cast_form() {
        // The magic-number conversion of n must give every value the bits the earlier
        // `n as i32` form gave (so no result anywhere moved): a dense sweep past both clamps,
        // the clamps themselves, ±0, ±Inf and NaN.
        fn with_cast(x: f32) -> f32 {
            let xc = x.clamp(-87.336_54, 88.376_26);
            let n = (xc * std::f32::consts::LOG2_E + 0.5).floor();
            let r = n.mul_add(2.121_944_4e-4, n.mul_add(-0.693_359_4, xc));
            let mut p = 1.987_569_1e-4f32;
            for c in [
                1.398_199_9e-3,
                8.333_452e-3,
                4.166_579_6e-2,
                1.666_666_5e-1,
                5e-1,
            ] {
                p = p.mul_add(r, c);
            }
            let y =
                ((p * r).mul_add(r, r) + 1.0) * f32::from_bits((((n as i32) + 127) as u32) << 23);
            if x < -87.336_54 {
                0.0
            } else {
                y
            }
        }
        let mut xs: Vec<f32> = (-200_000..=200_000).map(|i| i as f32 * 5e-4).collect();
        xs.extend([
            -87.336_54,
            88.376_26,
            88.03,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        for x in xs {
            assert_eq!(exp_f32(x).to_bits(), with_cast(x).to_bits(), "e^{x}");
        }
        assert!(exp_f32(f32::NAN).is_nan() && with_cast(f32::NAN).is_nan());
    }
}
