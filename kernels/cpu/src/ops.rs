//! The row-wise operations of a Llama layer and of sampling, per ISA tier: RMSNorm (Zhang &
//! Sennrich 2019, as Llama applies it: x / sqrt(mean(x²) + eps) · g), rotary embeddings on
//! precomputed cos/sin tables (RoFormer; half-split pairs as Hugging Face checkpoints, interleaved
//! pairs as GGUF llama files), SwiGLU (silu(gate) · up, Shazeer 2020), and the max / argmax /
//! softmax of a logit row. Each body is written once over lane arrays and compiled three times:
//! inside an `avx512f` and an `avx2,fma` `#[target_feature]` wrapper (where LLVM emits 16- or
//! 8-lane FMAs) and plain (the portable tier); the tier is `Isa::active()` at the call.

use crate::simd::{exp_f32, LANES};
use crate::Isa;

/// Calls `$body(args)` through the wrapper of the active tier.
macro_rules! by_tier {
    ($avx512:ident, $avx2:ident, $body:ident, $($arg:expr),*) => {{
        let isa = Isa::active();
        #[cfg(target_arch = "x86_64")]
        {
            if isa.has_avx512() {
                // SAFETY: the active tier includes AVX-512 F, so this CPU has it.
                return unsafe { $avx512($($arg),*) };
            }
            if isa.has_avx2() {
                // SAFETY: the active tier includes AVX2 and FMA, so this CPU has them.
                return unsafe { $avx2($($arg),*) };
            }
        }
        let _ = isa;
        $body($($arg),*)
    }};
}

/// Declares the two `#[target_feature]` wrappers of an `#[inline(always)]` body.
macro_rules! wrappers {
    ($avx512:ident, $avx2:ident, $body:ident, ($($a:ident: $t:ty),*) -> $r:ty) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn $avx512($($a: $t),*) -> $r {
            $body($($a),*)
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $avx2($($a: $t),*) -> $r {
            $body($($a),*)
        }
    };
}

#[inline(always)]
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let c = x.chunks_exact(LANES);
    let tail: f32 = c.remainder().iter().map(|v| v * v).sum();
    for blk in c {
        for l in 0..LANES {
            acc[l] += blk[l] * blk[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn rmsnorm_body(x: &[f32], g: &[f32], eps: f32, out: &mut [f32]) {
    let d = g.len();
    for (row, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let inv = 1.0 / (sum_squares(row) / d as f32 + eps).sqrt();
        for ((o, v), g) in o.iter_mut().zip(row).zip(g) {
            *o = v * inv * g;
        }
    }
}
wrappers!(rmsnorm_avx512, rmsnorm_avx2, rmsnorm_body, (x: &[f32], g: &[f32], eps: f32, out: &mut [f32]) -> ());

/// out = RMSNorm of each `g.len()`-wide row of x, times the gain g.
pub fn rmsnorm(x: &[f32], g: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        !g.is_empty() && x.len() == out.len() && x.len().is_multiple_of(g.len()),
        "rmsnorm: x ({}) and out ({}) must be whole rows of {}",
        x.len(),
        out.len(),
        g.len()
    );
    let d = g.len();
    if in_parallel(out.len() / d) {
        return crate::team::for_each_chunk_mut(out, PARALLEL_ROWS * d, |t, o| {
            let x = &x[t * PARALLEL_ROWS * d..][..o.len()];
            rmsnorm_rows(x, g, eps, o)
        });
    }
    rmsnorm_rows(x, g, eps, out)
}

fn rmsnorm_rows(x: &[f32], g: &[f32], eps: f32, out: &mut [f32]) {
    by_tier!(rmsnorm_avx512, rmsnorm_avx2, rmsnorm_body, x, g, eps, out)
}

/// Rows per task when a row-wise op runs on the team (a prompt's rows).
const PARALLEL_ROWS: usize = 16;

/// Whether a row-wise op over `rows` rows splits them over the team: only for a prompt-sized
/// batch, and only on a team's leader (whose workers run at its tier; rayon's would not).
fn in_parallel(rows: usize) -> bool {
    rows >= 2 * PARALLEL_ROWS && crate::team::leading()
}

/// The gate activation of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// silu(g) = g·σ(g) (SwiGLU: Llama, Qwen, Mistral, Phi-3).
    Silu,
    /// The tanh GELU, ½g(1 + tanh(√(2/π)(g + 0.044715g³))) (GeGLU: Gemma's
    /// `gelu_pytorch_tanh`), computed as g·σ(2u) — the same value, since 1 + tanh(u) = 2σ(2u),
    /// without the cancellation of 1 + tanh(u) near u = −∞ and with one `exp_f32`, so it
    /// vectorises like silu (libm's `tanhf` was 13% of a Gemma-3 prefill).
    GeluTanh,
}

#[inline(always)]
fn gated_body(gate_up: &[f32], f: usize, out: &mut [f32], gate: Gate) {
    const C2: f32 = 2.0 * 0.797_884_6; // 2·√(2/π)
    for (row, o) in gate_up.chunks_exact(2 * f).zip(out.chunks_exact_mut(f)) {
        let (g, u) = row.split_at(f);
        match gate {
            Gate::Silu => {
                for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                    *o = g / (1.0 + exp_f32(-g)) * u;
                }
            }
            Gate::GeluTanh => {
                for ((o, &g), u) in o.iter_mut().zip(g).zip(u) {
                    let t = C2 * (g + 0.044_715 * g * g * g);
                    *o = g / (1.0 + exp_f32(-t)) * u;
                }
            }
        }
    }
}
wrappers!(gated_avx512, gated_avx2, gated_body, (gate_up: &[f32], f: usize, out: &mut [f32], gate: Gate) -> ());

/// out = silu(gate) · up for rows of [gate | up] (each 2f wide; out rows f wide).
pub fn swiglu(gate_up: &[f32], f: usize, out: &mut [f32]) {
    gated(gate_up, f, out, Gate::Silu)
}

/// out = act(gate) · up for rows of [gate | up] (each 2f wide; out rows f wide), a prompt's
/// rows split over the team.
pub fn gated(gate_up: &[f32], f: usize, out: &mut [f32], gate: Gate) {
    assert!(
        f > 0 && gate_up.len() == 2 * out.len() && out.len().is_multiple_of(f),
        "gated MLP: {} gate/up values for {} outputs of width {f}",
        gate_up.len(),
        out.len()
    );
    if in_parallel(out.len() / f) {
        return crate::team::for_each_chunk_mut(out, PARALLEL_ROWS * f, |t, o| {
            let gu = &gate_up[2 * t * PARALLEL_ROWS * f..][..2 * o.len()];
            gated_rows(gu, f, o, gate)
        });
    }
    gated_rows(gate_up, f, out, gate)
}

fn gated_rows(gate_up: &[f32], f: usize, out: &mut [f32], gate: Gate) {
    by_tier!(gated_avx512, gated_avx2, gated_body, gate_up, f, out, gate)
}

/// How rotary embeddings pair the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopePairs {
    /// (x[i], x[i + d/2]): Hugging Face checkpoints (`rotate_half`).
    HalfSplit,
    /// (x[2i], x[2i+1]): GGUF llama files.
    Interleaved,
}

/// cos and sin of position · inv_freq[i] for each position: `positions.len()` rows of
/// `inv_freq.len()` values each, computed once per forward pass and shared by every head and
/// layer (they were recomputed per head before: 12 heads × 30 layers per SmolLM2 token).
pub fn rope_table(inv_freq: &[f32], positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let mut cos = Vec::with_capacity(positions.len() * inv_freq.len());
    let mut sin = Vec::with_capacity(positions.len() * inv_freq.len());
    for &p in positions {
        for f in inv_freq {
            let (s, c) = (p as f32 * f).sin_cos();
            cos.push(c);
            sin.push(s);
        }
    }
    (cos, sin)
}

#[inline(always)]
fn rope_body(x: &mut [f32], heads: usize, cos: &[f32], sin: &[f32], pairs: RopePairs) {
    let half = cos.len();
    let d = 2 * half;
    for h in x.chunks_exact_mut(d).take(heads) {
        match pairs {
            RopePairs::HalfSplit => {
                let (a, b) = h.split_at_mut(half);
                for i in 0..half {
                    let (x0, x1) = (a[i], b[i]);
                    a[i] = x0 * cos[i] - x1 * sin[i];
                    b[i] = x0 * sin[i] + x1 * cos[i];
                }
            }
            RopePairs::Interleaved => {
                for i in 0..half {
                    let (x0, x1) = (h[2 * i], h[2 * i + 1]);
                    h[2 * i] = x0 * cos[i] - x1 * sin[i];
                    h[2 * i + 1] = x0 * sin[i] + x1 * cos[i];
                }
            }
        }
    }
}
wrappers!(rope_avx512, rope_avx2, rope_body, (x: &mut [f32], heads: usize, cos: &[f32], sin: &[f32], pairs: RopePairs) -> ());

/// Rotates `heads` heads of width 2·cos.len() at the start of `x` by one position's cos/sin
/// row (from `rope_table`).
pub fn rope(x: &mut [f32], heads: usize, cos: &[f32], sin: &[f32], pairs: RopePairs) {
    assert!(
        cos.len() == sin.len() && x.len() >= heads * 2 * cos.len(),
        "rope: {heads} heads of width {} do not fit {} values",
        2 * cos.len(),
        x.len()
    );
    by_tier!(rope_avx512, rope_avx2, rope_body, x, heads, cos, sin, pairs)
}

#[inline(always)]
fn argmax_body(x: &[f32]) -> usize {
    // Per-lane best value and index, then the lanes compared: the largest value, the lowest
    // index on ties (NaN never wins: `>` is false for it).
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut at = [usize::MAX; LANES];
    let c = x.chunks_exact(LANES);
    let rest = c.remainder();
    for (k, blk) in c.enumerate() {
        for l in 0..LANES {
            if blk[l] > best[l] {
                best[l] = blk[l];
                at[l] = k * LANES + l;
            }
        }
    }
    let base = x.len() - rest.len();
    let (mut bv, mut bi) = (f32::NEG_INFINITY, usize::MAX);
    for (l, v) in best.iter().enumerate() {
        if *v > bv || (*v == bv && at[l] < bi) {
            (bv, bi) = (*v, at[l]);
        }
    }
    for (j, v) in rest.iter().enumerate() {
        if *v > bv {
            (bv, bi) = (*v, base + j);
        }
    }
    bi
}
wrappers!(argmax_avx512, argmax_avx2, argmax_body, (x: &[f32]) -> usize);

/// The index of the largest value (the lowest index on ties; NaN is never chosen), or `None`
/// when no value is larger than −∞ and the row is not all −∞.
pub fn argmax(x: &[f32]) -> Option<usize> {
    if x.is_empty() {
        return None;
    }
    let i = by_tier_value(x);
    if i == usize::MAX {
        // Every value is −∞ or NaN: the first −∞, if any.
        return x.iter().position(|v| *v == f32::NEG_INFINITY);
    }
    Some(i)
}

fn by_tier_value(x: &[f32]) -> usize {
    by_tier!(argmax_avx512, argmax_avx2, argmax_body, x)
}

#[inline(always)]
fn softmax_body(x: &mut [f32]) {
    let m = crate::simd::max(x);
    let s = crate::simd::exp_shifted_sum(x, m);
    crate::simd::scale(1.0 / s, x);
}
wrappers!(softmax_avx512, softmax_avx2, softmax_body, (x: &mut [f32]) -> ());

/// x ← softmax(x) in place (max-shifted; −∞ entries become 0). The row must hold a finite
/// value.
pub fn softmax(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    by_tier!(softmax_avx512, softmax_avx2, softmax_body, x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::{runnable, with_isa};

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 250.0 - 4.0)
            .collect()
    }

    #[test]
    fn every_tier_matches_f64_loops() {
        for isa in runnable() {
            with_isa(isa, || {
                for d in [1usize, 7, 16, 33, 576] {
                    let x = data(3 * d, d as u32);
                    let g = data(d, 7);
                    let mut out = vec![f32::NAN; x.len()];
                    rmsnorm(&x, &g, 1e-5, &mut out);
                    for (r, row) in x.chunks(d).enumerate() {
                        let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / d as f64;
                        let inv = 1.0 / (ms + 1e-5).sqrt();
                        for i in 0..d {
                            let want = row[i] as f64 * inv * g[i] as f64;
                            let got = out[r * d + i] as f64;
                            assert!(
                                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                "{isa} rms d={d}"
                            );
                        }
                    }
                    let gu = data(2 * 2 * d, 3);
                    let mut s = vec![f32::NAN; 2 * d];
                    swiglu(&gu, d, &mut s);
                    for r in 0..2 {
                        for i in 0..d {
                            let (gv, uv) = (gu[r * 2 * d + i] as f64, gu[r * 2 * d + d + i] as f64);
                            let want = gv / (1.0 + (-gv).exp()) * uv;
                            assert!(
                                (s[r * d + i] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                "{isa} swiglu"
                            );
                        }
                    }
                    let mut p = data(d + 5, 11);
                    let want_arg = (0..p.len())
                        .max_by(|&a, &b| p[a].total_cmp(&p[b]).then(b.cmp(&a)))
                        .unwrap();
                    assert_eq!(argmax(&p), Some(want_arg), "{isa} argmax");
                    let m = p.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
                    let z: f64 = p.iter().map(|v| (*v as f64 - m).exp()).sum();
                    let want: Vec<f64> = p.iter().map(|v| (*v as f64 - m).exp() / z).collect();
                    softmax(&mut p);
                    for (a, b) in p.iter().zip(&want) {
                        assert!((*a as f64 - b).abs() < 1e-6, "{isa} softmax");
                    }
                }
                // RoPE against the rotation written out.
                let inv: Vec<f32> = (0..32)
                    .map(|i| 1.0 / 10000f32.powf(i as f32 / 32.0))
                    .collect();
                let (c, s) = rope_table(&inv, &[0, 5, 999]);
                for pairs in [RopePairs::HalfSplit, RopePairs::Interleaved] {
                    let x0 = data(3 * 64, 5);
                    let mut x = x0.clone();
                    rope(&mut x, 3, &c[64..96], &s[64..96], pairs);
                    for h in 0..3 {
                        for (i, f) in inv.iter().enumerate() {
                            let (ia, ib) = match pairs {
                                RopePairs::HalfSplit => (i, i + 32),
                                RopePairs::Interleaved => (2 * i, 2 * i + 1),
                            };
                            let th = 999.0f64 * *f as f64;
                            let (a, b) = (x0[h * 64 + ia] as f64, x0[h * 64 + ib] as f64);
                            assert!(
                                (x[h * 64 + ia] as f64 - (a * th.cos() - b * th.sin())).abs()
                                    < 2e-3
                            );
                            assert!(
                                (x[h * 64 + ib] as f64 - (a * th.sin() + b * th.cos())).abs()
                                    < 2e-3
                            );
                        }
                    }
                }
            })
            .unwrap();
        }
    }

    #[test]
    fn prompt_rows_on_a_team_equal_the_serial_rows_bit_for_bit() {
        // 77 rows: more than the parallel threshold, not a multiple of the task's rows.
        let (rows, d) = (77usize, 96usize);
        for isa in runnable() {
            with_isa(isa, || {
                let x = data(rows * d, 3);
                let g = data(d, 9);
                let gu = data(rows * 2 * d, 5);
                let serial = |f: &dyn Fn(&mut Vec<f32>, &mut Vec<f32>)| {
                    let (mut a, mut b) = (vec![f32::NAN; rows * d], vec![f32::NAN; rows * d]);
                    f(&mut a, &mut b);
                    (a, b)
                };
                let run = |a: &mut Vec<f32>, b: &mut Vec<f32>| {
                    rmsnorm(&x, &g, 1e-6, a);
                    swiglu(&gu, d, b);
                };
                let want = serial(&run);
                let got = crate::team::with_team(|| serial(&run));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.0), bits(&want.0), "{isa} rmsnorm");
                assert_eq!(bits(&got.1), bits(&want.1), "{isa} swiglu");
            })
            .unwrap();
        }
    }

    #[test]
    fn argmax_ties_nan_and_infinities() {
        for isa in runnable() {
            with_isa(isa, || {
                let mut x = vec![1.0f32; 40];
                x[3] = 2.0;
                x[37] = 2.0;
                assert_eq!(argmax(&x), Some(3));
                x[5] = f32::NAN;
                assert_eq!(argmax(&x), Some(3));
                assert_eq!(argmax(&[f32::NEG_INFINITY; 19]), Some(0));
                assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), Some(1));
                assert_eq!(argmax(&[]), None);
                assert_eq!(argmax(&[f32::NAN; 3]), None);
            })
            .unwrap();
        }
    }
}
