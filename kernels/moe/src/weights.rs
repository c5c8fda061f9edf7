//! Random MoE weights for checks and experiments: router W_gate [d_model × experts] and each
//! expert's SwiGLU projections W_gate, W_up [d_model × d_ff] and W_down [d_ff × d_model]
//! (row-major, N(0, 1/fan_in)), plus the skew knob: a router bias b_e = −s·ln(rank_e + 1) over
//! a seeded random ranking of the experts, so routing probabilities fall off like a Zipf law
//! with exponent s (s = 0: no bias), the imbalance real checkpoints show, with random weights.

use kernel_common::inputs::{derive_seed, normal_buffer_par, rng};
use kernel_common::DType;
use rand::seq::SliceRandom;

use crate::config::MoeConfig;

/// All weights of one MoE layer.
#[derive(Debug, Clone)]
pub struct MoeWeights {
    pub router: Vec<f32>,
    pub bias: Vec<f32>,
    /// experts × d_model × d_ff
    pub w_gate: Vec<f32>,
    /// experts × d_model × d_ff
    pub w_up: Vec<f32>,
    /// experts × d_ff × d_model
    pub w_down: Vec<f32>,
}

fn normal(seed: u64, len: usize, sd: f32) -> Vec<f32> {
    let mut v = normal_buffer_par(seed, DType::F32, len).to_f32();
    v.iter_mut().for_each(|x| *x *= sd);
    v
}

/// The Zipf-like router bias for `experts` with exponent `skew`, ranks shuffled by `seed`.
pub fn skew_bias(experts: usize, skew: f64, seed: u64) -> Vec<f32> {
    let mut ranks: Vec<usize> = (0..experts).collect();
    ranks.shuffle(&mut rng(seed));
    ranks
        .iter()
        .map(|&r| (-skew * ((r + 1) as f64).ln()) as f32)
        .collect()
}

impl MoeWeights {
    /// Seeded weights for `cfg` with router skew `skew`.
    pub fn random(cfg: &MoeConfig, skew: f64, seed: u64) -> MoeWeights {
        let (d, f, e) = (cfg.d_model, cfg.d_ff, cfg.experts);
        let sd = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        MoeWeights {
            router: normal(derive_seed(seed, 1), d * e, sd(d)),
            bias: skew_bias(e, skew, derive_seed(seed, 2)),
            w_gate: normal(derive_seed(seed, 3), e * d * f, sd(d)),
            w_up: normal(derive_seed(seed, 4), e * d * f, sd(d)),
            w_down: normal(derive_seed(seed, 5), e * f * d, sd(f)),
        }
    }

    /// The expert weights rounded to `dtype` (router and bias unchanged): what `cuda_grouped`
    /// multiplies, and so what its f64 reference must see.
    pub fn rounded(&self, dtype: DType) -> MoeWeights {
        let round = |v: &[f32]| kernel_common::Buffer::from_f32(dtype, v).to_f32();
        MoeWeights {
            w_gate: round(&self.w_gate),
            w_up: round(&self.w_up),
            w_down: round(&self.w_down),
            ..self.clone()
        }
    }

    /// Checks the sizes against `cfg`.
    pub fn check(&self, cfg: &MoeConfig) -> kernel_common::error::Result<()> {
        let (d, f, e) = (cfg.d_model, cfg.d_ff, cfg.experts);
        for (name, got, want) in [
            (
                "router W_gate (d_model × experts)",
                self.router.len(),
                d * e,
            ),
            ("router bias (experts)", self.bias.len(), e),
            (
                "expert W_gate (experts × d_model × d_ff)",
                self.w_gate.len(),
                e * d * f,
            ),
            (
                "expert W_up (experts × d_model × d_ff)",
                self.w_up.len(),
                e * d * f,
            ),
            (
                "expert W_down (experts × d_ff × d_model)",
                self.w_down.len(),
                e * f * d,
            ),
        ] {
            if got != want {
                return Err(kernel_common::KernelError::BadBuffer(format!(
                    "{name} has {got} values, expected {want}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_zero_is_no_bias_and_skew_ranks_experts() {
        assert!(skew_bias(8, 0.0, 1).iter().all(|b| *b == 0.0));
        let b = skew_bias(8, 1.0, 1);
        let mut sorted = b.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(sorted[0], 0.0);
        assert!((sorted[7] + (8f32).ln()).abs() < 1e-6);
    }
}
