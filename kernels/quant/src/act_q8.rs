//! The int8 activation of llama.cpp's CPU path for quantised weights (its `quantize_row_q8_0`
//! / `q8_1`): the activation is quantised per 32 values to int8 with an f32 scale
//! (d = max|x| / 127, q = round(x / d), as Q8_0), its codes permuted into the order the weight
//! codes are met in, with d·Σq per chunk for Q4_1's minimum. The integer dot products against
//! it are per ISA: `avx512::q8act` (VNNI `vpdpbusd`), `avx2::q8act` (`vpmaddubsw` +
//! `vpmaddwd`, llama.cpp's AVX2 path) and `portable::rows_dot_q8` (integer loops).
//!
//! A chunk holding a NaN or ±Inf gets a NaN scale, so the outputs it feeds are NaN (as the
//! f32 products give), never a finite value computed as if the bad value were 0.
//!
//! The product is exact for the quantised activation: the result equals the f64 product of the
//! dequantised weights with `activation_as_seen(x)` within f32 rounding, and its distance from
//! the product with x itself is the activation quantisation error, reported separately.

use crate::act_q8_simd::chunk_scale;
use crate::plan::BlockPlan;

/// Whether `plan`'s format fits: 4-bit or 8-bit codes in groups of whole 32-value chunks
/// (Q4_1's minimum included).
pub fn supports(plan: &BlockPlan) -> bool {
    matches!(plan.bits, 4 | 8) && plan.values.is_multiple_of(32)
}

/// An activation quantised per 32 values: codes in the order the weights' codes come in.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Activation {
    /// int8 codes, permuted within each 32-value chunk like `BlockPlan::permute_activation`.
    pub q: Vec<i8>,
    /// Scale of each 32-value chunk.
    pub d: Vec<f32>,
    /// d · Σq of each 32-value chunk: the chunk's sum as the kernel sees it.
    pub sum: Vec<f32>,
    /// Σq of each 32-value chunk (exact; the packed kernels take a code offset off with it).
    pub qsum: Vec<i32>,
}

/// Quantises `x` (a multiple of 32 long) for `plan`, with the active ISA's vector loops (the
/// codes are the same on every tier: the scale is the exact max, the rounding half away from
/// zero like `f32::round`).
pub fn quantize_activation(plan: &BlockPlan, x: &[f32]) -> Q8Activation {
    quantize_activation_at(plan, x, kernel_cpu::Isa::active())
}

/// `quantize_activation` with the vector loops of tier `isa` (resolved by the caller on its own
/// thread, so a worker thread that quantises part of a batch uses the caller's tier).
pub(crate) fn quantize_activation_at(
    plan: &BlockPlan,
    x: &[f32],
    isa: kernel_cpu::Isa,
) -> Q8Activation {
    let mut act = Q8Activation::empty();
    quantize_activation_into(plan, x, isa, &mut act);
    act
}

impl Q8Activation {
    /// An activation of no values (a buffer for `quantize_activation_into`).
    pub fn empty() -> Q8Activation {
        Q8Activation {
            q: vec![],
            d: vec![],
            sum: vec![],
            qsum: vec![],
        }
    }
}

/// `quantize_activation_at` into `act`'s buffers, which grow only when `x` is longer than
/// what they held (a decode step quantises ~200 activations: four allocations each were 4% of
/// a SmolLM2 8-token step).
pub(crate) fn quantize_activation_into(
    plan: &BlockPlan,
    x: &[f32],
    isa: kernel_cpu::Isa,
    act: &mut Q8Activation,
) {
    let chunks = x.len() / 32;
    act.q.resize(chunks * 32, 0);
    act.d.resize(chunks, 0.0);
    act.sum.resize(chunks, 0.0);
    act.qsum.resize(chunks, 0);
    // 4-bit LSB-first codes arrive as 16 low nibbles then 16 high nibbles per 32 values:
    // position i of a chunk holds value (i mod 16)·2 + i / 16.
    let interleaved = plan.bits == 4 && plan.interleaved;
    #[cfg(target_arch = "x86_64")]
    {
        if isa.has_avx512() {
            // SAFETY: the active tier includes AVX-512 F, so this CPU has it.
            return unsafe { quantize_avx512(x, interleaved, act) };
        }
        if isa.has_avx2() {
            // SAFETY: the active tier includes AVX2 and FMA, so this CPU has them.
            return unsafe { quantize_avx2(x, interleaved, act) };
        }
        // The portable tier: SSE2 is part of every x86-64.
        quantize_chunks(x, interleaved, act, crate::act_q8_simd::chunk_sse2)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        quantize_body(x, interleaved, act);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn quantize_avx512(x: &[f32], interleaved: bool, act: &mut Q8Activation) {
    // SAFETY: this function's features are the chunk quantiser's.
    quantize_chunks(x, interleaved, act, |v| unsafe {
        crate::act_q8_simd::chunk_avx512(v)
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(x: &[f32], interleaved: bool, act: &mut Q8Activation) {
    // SAFETY: as above.
    quantize_chunks(x, interleaved, act, |v| unsafe {
        crate::act_q8_simd::chunk_avx2(v)
    })
}

/// Every chunk of `x` through a vector chunk quantiser (`act_q8_simd`), gathered into the
/// code order first when the weights' codes come interleaved.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn quantize_chunks(
    x: &[f32],
    interleaved: bool,
    act: &mut Q8Activation,
    chunk_q: impl Fn(&[f32; 32]) -> crate::act_q8_simd::Chunk,
) {
    for (c, chunk) in x.chunks_exact(32).enumerate() {
        let q = chunk_q(&in_code_order(chunk, interleaved));
        act.q[c * 32..(c + 1) * 32].copy_from_slice(&q.q);
        act.d[c] = q.scale;
        act.sum[c] = q.scale * q.total as f32;
        act.qsum[c] = q.total;
    }
}

/// A 32-value chunk in the order the weights' codes come in (4-bit LSB-first codes: 16 low
/// nibbles then 16 high ones).
#[inline(always)]
fn in_code_order(chunk: &[f32], interleaved: bool) -> [f32; 32] {
    let mut v = [0.0f32; 32];
    if interleaved {
        for (i, o) in v.iter_mut().enumerate() {
            *o = chunk[crate::plan::interleaved_source(i, 2)];
        }
    } else {
        v.copy_from_slice(chunk);
    }
    v
}

/// Plain loops over fixed 32-value chunks: the definition, and the portable tier off x86-64.
fn quantize_body(x: &[f32], interleaved: bool, act: &mut Q8Activation) {
    for (c, chunk) in x.chunks_exact(32).enumerate() {
        let v = in_code_order(chunk, interleaved);
        // max |x| in 16 lanes (a `>` select, not `f32::max`, whose NaN rule kept the loop
        // scalar); the same value as the scalar fold for finite inputs.
        let mut lanes = [0.0f32; 16];
        for (k, a) in v.iter().enumerate() {
            let a = a.abs();
            let m = &mut lanes[k % 16];
            *m = if a > *m { a } else { *m };
        }
        let mut amax = 0.0f32;
        for m in lanes {
            amax = if m > amax { m } else { amax };
        }
        // A NaN or ±Inf in the chunk makes its scale NaN, so every product that reads the
        // chunk is NaN: the `>` max skips a NaN and the cast sends it to code 0, which would
        // otherwise drop it silently.
        let finite = v.iter().fold(true, |f, a| f & a.is_finite());
        let (scale, inv) = chunk_scale(amax, finite);
        let mut q = [0i32; 32];
        for (o, a) in q.iter_mut().zip(v) {
            *o = (a * inv).round() as i32;
        }
        let out = &mut act.q[c * 32..(c + 1) * 32];
        let mut total = 0i32;
        for (o, v) in out.iter_mut().zip(q) {
            *o = v as i8;
            total += v;
        }
        act.d[c] = scale;
        act.sum[c] = scale * total as f32;
        act.qsum[c] = total;
    }
}

/// `x` (a multiple of 32 long) quantised as `quantize_activation` does, codes in natural
/// order (what the codec formats' products read, `codec_kernels::act`).
pub fn quantize_natural(x: &[f32]) -> Q8Activation {
    let chunks = x.len() / 32;
    let mut act = Q8Activation {
        q: vec![0; chunks * 32],
        d: vec![0.0; chunks],
        sum: vec![0.0; chunks],
        qsum: vec![0; chunks],
    };
    quantize_body(x, false, &mut act);
    act
}

/// What the kernel multiplies instead of x: d·q per value, in natural order.
pub fn activation_as_seen(x: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for chunk in x.chunks(32) {
        let amax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let finite = chunk.iter().all(|v| v.is_finite());
        let (scale, inv) = chunk_scale(amax, finite);
        out.extend(
            chunk
                .iter()
                .map(|&v| ((v * inv).round() as i8) as f32 * scale),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WeightFormat;

    /// The scalar definition: max|x| / 127, `f32::round`; a chunk whose inverse scale would
    /// overflow is scale 0, codes 0 (written out here, not through `chunk_scale`).
    fn plain(x: &[f32], order: impl Fn(usize) -> usize) -> Q8Activation {
        let mut a = Q8Activation {
            q: vec![],
            d: vec![],
            sum: vec![],
            qsum: vec![],
        };
        for chunk in x.chunks(32) {
            let amax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let (scale, inv) = (amax / 127.0, 1.0 / (amax / 127.0));
            let (scale, inv) = if scale > 0.0 && inv.is_finite() {
                (scale, inv)
            } else {
                (0.0, 0.0)
            };
            let q: Vec<i8> = (0..32)
                .map(|i| (chunk[order(i)] * inv).round() as i8)
                .collect();
            let total: i32 = q.iter().map(|&c| c as i32).sum();
            a.q.extend(q);
            a.d.push(scale);
            a.sum.push(scale * total as f32);
            a.qsum.push(total);
        }
        a
    }

    #[test]
    fn every_tier_quantises_like_the_scalar_definition() {
        // Halves (x·inv exactly k + 0.5), zeros, negative zero, huge and tiny values.
        let mut x: Vec<f32> = (0..32 * 9)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37)
            .collect();
        x[..32].fill(0.0);
        x[32] = 127.0;
        for i in 1..32 {
            x[32 + i] = (i as f32 - 16.0) + 0.5;
        }
        x[64] = -0.0;
        x[65] = 3e38;
        x[96..128].fill(1e-30);
        // Below 3.7e-37 the inverse scale overflows: scale 0, codes 0.
        for i in 0..32 {
            x[128 + i] = (i as f32 - 15.5) * 1e-39;
        }
        for f in ["q4_1", "sym4g32", "q8_0"] {
            let plan = BlockPlan::for_format(WeightFormat::parse(f).unwrap()).unwrap();
            let want = if plan.bits == 4 && plan.interleaved {
                plain(&x, |i| (i % 16) * 2 + i / 16)
            } else {
                plain(&x, |i| i)
            };
            for isa in kernel_cpu::isa::runnable() {
                let got =
                    kernel_cpu::isa::with_isa(isa, || quantize_activation(&plan, &x)).unwrap();
                assert_eq!(got, want, "{f} at {isa}");
            }
            assert_eq!(want.d[4], 0.0, "{f}: the near-zero chunk's scale");
            assert!(want.q[128..160].iter().all(|&c| c == 0), "{f}: its codes");
            assert_eq!(want.qsum[4], 0, "{f}: its code sum");
        }
        let seen = activation_as_seen(&x);
        assert!(seen[128..160].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn every_tier_quantises_random_chunks_like_the_scalar_definition() {
        // 4096 chunks of random values at magnitudes from 1e-30 to 1e30, with a NaN, an Inf
        // and exact halves planted in some (a scale of 1 makes a value k + 0.5 a tie).
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut x = vec![0.0f32; 32 * 4096];
        for (c, chunk) in x.chunks_exact_mut(32).enumerate() {
            let mag = 10f32.powi((next() % 61) as i32 - 30);
            for v in chunk.iter_mut() {
                *v = ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * mag;
            }
            match c % 7 {
                0 => chunk[(next() % 32) as usize] = f32::NAN,
                1 => chunk[(next() % 32) as usize] = f32::NEG_INFINITY,
                2 => {
                    chunk[0] = 127.0;
                    for v in &mut chunk[1..] {
                        *v = ((next() % 254) as f32 - 127.0) + 0.5;
                    }
                }
                _ => {}
            }
        }
        for f in ["q4_0", "q8_0"] {
            let plan = BlockPlan::for_format(WeightFormat::parse(f).unwrap()).unwrap();
            let reference = kernel_cpu::isa::with_isa(kernel_cpu::Isa::Portable, || {
                quantize_activation(&plan, &x)
            })
            .unwrap();
            for isa in kernel_cpu::isa::runnable() {
                let got =
                    kernel_cpu::isa::with_isa(isa, || quantize_activation(&plan, &x)).unwrap();
                // NaN scales compare unequal: compare their bits.
                let bits = |a: &Q8Activation| {
                    (
                        a.q.clone(),
                        a.d.iter().map(|d| d.to_bits()).collect::<Vec<_>>(),
                        a.sum.iter().map(|d| d.to_bits()).collect::<Vec<_>>(),
                        a.qsum.clone(),
                    )
                };
                assert!(bits(&got) == bits(&reference), "{f} at {isa}");
            }
        }
    }
}
