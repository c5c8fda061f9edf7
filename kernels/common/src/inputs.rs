//! Seeded random inputs: every check and experiment draws its tensors from a seed it records,
//! so any row can be reproduced exactly. Values are standard normal (never zeros).

use crate::dtype::{Buffer, DType};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rand_distr::StandardNormal;

/// A deterministic generator for `seed`.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `len` standard-normal f32 values times `scale`.
pub fn normal_f32(rng: &mut StdRng, len: usize, scale: f32) -> Vec<f32> {
    (0..len)
        .map(|_| rng.sample::<f32, _>(StandardNormal) * scale)
        .collect()
}

/// A buffer of `len` standard-normal values rounded to `dtype`.
pub fn normal_buffer(rng: &mut StdRng, dtype: DType, len: usize) -> Buffer {
    Buffer::from_f32(dtype, &normal_f32(rng, len, 1.0))
}

/// Elements per independently seeded chunk of `normal_buffer_par`.
const PAR_CHUNK: usize = 1 << 16;

/// Like `normal_buffer` but generated in parallel: chunk c of 65536 values comes from
/// `derive_seed(seed, c)`, so the result depends on the seed alone, not on the thread count.
pub fn normal_buffer_par(seed: u64, dtype: DType, len: usize) -> Buffer {
    use rayon::prelude::*;
    let mut values = vec![0.0f32; len];
    values
        .par_chunks_mut(PAR_CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut r = rng(derive_seed(seed, c as u64));
            for x in chunk.iter_mut() {
                *x = r.sample::<f32, _>(StandardNormal);
            }
        });
    Buffer::from_f32(dtype, &values)
}

/// The index a uniform `u` in [0, Σ weights) falls on when the weights are laid end to end
/// in index order (one categorical draw); rounding that leaves `u` past the end picks the last
/// index with weight.
pub fn pick(weights: &[f32], mut u: f64) -> usize {
    for (i, &w) in weights.iter().enumerate() {
        if u < w as f64 {
            return i;
        }
        u -= w as f64;
    }
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0)
}

/// Mixes a base seed with a case index into an independent seed (SplitMix64 finaliser).
pub fn derive_seed(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_walks_the_cumulative_weights() {
        let w = [0.25f32, 0.0, 0.5, 0.25];
        assert_eq!(pick(&w, 0.0), 0);
        assert_eq!(pick(&w, 0.2499), 0);
        assert_eq!(pick(&w, 0.25), 2, "a zero weight is never picked");
        assert_eq!(pick(&w, 0.9), 3);
        assert_eq!(pick(&w, 1.5), 3, "past the end: the last index with weight");
        assert_eq!(pick(&[0.5, 0.5, 0.0], 1.0), 1);
    }

    #[test]
    fn same_seed_same_values_and_no_zeros() {
        let a = normal_f32(&mut rng(7), 1000, 1.0);
        let b = normal_f32(&mut rng(7), 1000, 1.0);
        assert_eq!(a, b);
        assert!(a.iter().all(|x| *x != 0.0 && x.is_finite()));
        assert_ne!(a, normal_f32(&mut rng(8), 1000, 1.0));
        assert_ne!(derive_seed(1, 2), derive_seed(1, 3));
        let p = normal_buffer_par(3, DType::F32, 200_000).to_f32();
        assert_eq!(p, normal_buffer_par(3, DType::F32, 200_000).to_f32());
        assert!(p.iter().all(|x| *x != 0.0));
        assert_ne!(p[..100], p[PAR_CHUNK..PAR_CHUNK + 100]);
    }
}
