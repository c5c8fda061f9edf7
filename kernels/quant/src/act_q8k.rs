//! The Q8_K activation of the K-quant packed products (`packed_q4k`): llama.cpp's
//! `quantize_row_q8_K_ref` per 256 values (d = max / −127, codes round(x / d)) with the sum
//! of each 32 codes (Q4_K's minimums multiply them) and of each 16 (Q6_K's code offset).

use crate::kquants::q8_k;
use crate::packed_layout::SUPER;

/// An activation row quantised to Q8_K: per super-block of 256 an f32 scale, 256 codes, the
/// sum of each 32 codes (i16: |Σ| ≤ 32 · 127) and of each 16 (ggml's `bsums`).
#[derive(Debug, Clone, PartialEq)]
pub struct Q8KActivation {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub bsum: Vec<i16>,
    pub bsum16: Vec<i16>,
}

/// `x` (a multiple of 256 long) quantised as `quantize_row_q8_K_ref`; a super-block holding a
/// NaN or ±Inf gets a NaN scale, so every output it feeds is NaN (ggml's max skips a NaN and
/// would quantise the rest as if it were absent).
pub fn quantize(x: &[f32]) -> Q8KActivation {
    quantize_at(x, kernel_cpu::Isa::active())
}

/// `quantize` with its loops compiled for tier `isa` (resolved by the caller on its own
/// thread): the same exact operations on every tier, so the same codes, in 16- or 8-lane
/// vectors instead of SSE2's 4 (a 256-row Q4_K product at batch 4 spent ~30% of its time
/// quantising with SSE2 loops).
pub(crate) fn quantize_at(x: &[f32], isa: kernel_cpu::Isa) -> Q8KActivation {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.has_avx512() {
            // SAFETY: the tier includes AVX-512 F and BW, so this CPU has them.
            return unsafe { quantize_avx512(x) };
        }
        if isa.has_avx2() {
            // SAFETY: the tier includes AVX2, so this CPU has it.
            return unsafe { quantize_avx2(x) };
        }
    }
    let _ = isa;
    quantize_rows(x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_avx512(x: &[f32]) -> Q8KActivation {
    quantize_rows(x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2(x: &[f32]) -> Q8KActivation {
    quantize_rows(x)
}

/// Every super-block of `x` through `q8_k::quantize_activation` (inlined into each tier's
/// wrapper, so its loops take the wrapper's features).
#[inline(always)]
fn quantize_rows(x: &[f32]) -> Q8KActivation {
    let n = x.len() / SUPER;
    let mut act = Q8KActivation {
        q: Vec::with_capacity(n * SUPER),
        d: Vec::with_capacity(n),
        bsum: Vec::with_capacity(n * 8),
        bsum16: Vec::with_capacity(n * 16),
    };
    for block in x.chunks_exact(SUPER) {
        let (d, q, sums) = q8_k::quantize_activation(block);
        act.d.push(d);
        act.q.extend_from_slice(&q);
        act.bsum
            .extend((0..8).map(|j| sums[2 * j].wrapping_add(sums[2 * j + 1])));
        act.bsum16.extend_from_slice(&sums);
    }
    act
}

/// What the K-quant packed products multiply instead of x: d·q per value.
pub fn activation_as_seen(x: &[f32]) -> Vec<f32> {
    let act = quantize(x);
    act.q
        .iter()
        .enumerate()
        .map(|(i, &c)| c as f32 * act.d[i / SUPER])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kquants::nearest_int;

    /// `quantize_row_q8_K_ref` as ggml writes it: one scan keeping the first value of the
    /// largest magnitude, codes min(127, nearest(x · −127 / max)), sums of 16; a NaN scale
    /// where the block holds a NaN or ±Inf.
    fn scalar(x: &[f32]) -> (f32, Vec<i8>, Vec<i16>) {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            return (0.0, vec![0; 256], vec![0; 16]);
        }
        let iscale = -127.0 / max;
        let q: Vec<i8> = x
            .iter()
            .map(|&v| nearest_int(iscale * v).min(127) as i8)
            .collect();
        let sums = q
            .chunks(16)
            .map(|c| c.iter().map(|&v| v as i16).sum())
            .collect();
        let d = if x.iter().all(|v| v.is_finite()) {
            1.0 / iscale
        } else {
            f32::NAN
        };
        (d, q, sums)
    }

    #[test]
    fn every_tier_quantises_like_the_scalar_scan() {
        use rand::Rng;
        let mut rng = kernel_common::inputs::rng(17);
        let mut next = || rng.gen::<u64>();
        let mut blocks: Vec<Vec<f32>> = Vec::new();
        let scales = [1e-6f32, 1e-4, 1e-2, 0.5, 1.0, 3.0, 1e2, 1e4, 1e6];
        for b in 0..400 {
            let scale = scales[b % scales.len()];
            let mut x: Vec<f32> = (0..256)
                .map(|_| ((next() % 20001) as f32 - 10000.0) / 10000.0 * scale)
                .collect();
            match b % 8 {
                // The largest magnitude twice with opposite signs: the first one's sign wins.
                0 => {
                    let (i, j) = ((next() % 256) as usize, (next() % 256) as usize);
                    x[i] = 3.0 * scale;
                    x[j] = -3.0 * scale;
                }
                1 => x.fill(0.0),
                2 => x[(next() % 256) as usize] = f32::NAN,
                3 => x[(next() % 256) as usize] = f32::NEG_INFINITY,
                // Exact ties of nearest-even: max 127 makes the codes the values themselves.
                4 => {
                    for (i, v) in x.iter_mut().enumerate() {
                        *v = (i % 64) as f32 - 31.5;
                    }
                    x[200] = -127.0;
                }
                5 => x[255] = -5.0 * scale,
                6 => x.iter_mut().for_each(|v| *v *= 1e-38),
                _ => {}
            }
            blocks.push(x);
        }
        let x: Vec<f32> = blocks.concat();
        for isa in kernel_cpu::isa::runnable() {
            let got = quantize_at(&x, isa);
            for (b, block) in blocks.iter().enumerate() {
                let (d, q, sums) = scalar(block);
                let what = format!("{isa} block {b}");
                assert_eq!(got.d[b].to_bits(), d.to_bits(), "{what}: scale");
                assert_eq!(&got.q[256 * b..256 * (b + 1)], &q[..], "{what}: codes");
                assert_eq!(&got.bsum16[16 * b..16 * (b + 1)], &sums[..], "{what}: sums");
            }
        }
    }
}
