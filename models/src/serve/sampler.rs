//! Token sampling from logits, seeded and deterministic: greedy (temperature 0, the lowest id
//! on ties), or temperature-scaled softmax restricted to the top-k logits and then to the
//! smallest set of tokens whose probability reaches top-p (nucleus sampling, Holtzman et al.),
//! renormalised, one uniform draw from a seeded generator per token.

use crate::model::llama::argmax;
use kernel_common::{
    error::Result,
    inputs::{pick, rng},
    KernelError,
};
use rand::{rngs::StdRng, Rng};

/// How tokens are chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the k largest logits (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1 = all).
    pub top_p: f32,
    pub seed: u64,
}

/// A seeded sampler.
pub struct Sampler {
    pub cfg: SamplerConfig,
    rng: StdRng,
}

impl Sampler {
    /// Checks the parameters.
    pub fn new(cfg: SamplerConfig) -> Result<Sampler> {
        if !(cfg.temperature.is_finite() && cfg.temperature >= 0.0) {
            return Err(KernelError::Unsupported(format!(
                "temperature must be finite and >= 0, got {}",
                cfg.temperature
            )));
        }
        if !(cfg.top_p > 0.0 && cfg.top_p <= 1.0) {
            return Err(KernelError::Unsupported(format!(
                "top-p must be in (0, 1], got {}",
                cfg.top_p
            )));
        }
        Ok(Sampler {
            cfg,
            rng: rng(cfg.seed),
        })
    }

    /// The distribution `sample` draws from (temperature, top-k, top-p applied), over the
    /// whole vocabulary; for temperature 0 a point mass on the argmax.
    pub fn probs(&self, logits: &[f32]) -> Vec<f32> {
        let mut p = vec![0.0f32; logits.len()];
        if self.cfg.temperature == 0.0 {
            p[argmax(logits) as usize] = 1.0;
            return p;
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if self.cfg.top_k > 0 {
            order.truncate(self.cfg.top_k);
        }
        let t = self.cfg.temperature as f64;
        let top = logits[order[0]] as f64;
        let w: Vec<f64> = order
            .iter()
            .map(|&i| ((logits[i] as f64 - top) / t).exp())
            .collect();
        let total: f64 = w.iter().sum();
        let mut keep = w.len();
        if self.cfg.top_p < 1.0 {
            let mut cum = 0.0;
            for (n, x) in w.iter().enumerate() {
                cum += x / total;
                if cum >= self.cfg.top_p as f64 {
                    keep = n + 1;
                    break;
                }
            }
        }
        let mass: f64 = w[..keep].iter().sum();
        for (&i, x) in order.iter().zip(&w).take(keep) {
            p[i] = (x / mass) as f32;
        }
        p
    }

    /// The generator, for a verifier that draws with this sampler's seed.
    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }

    /// The next token: the argmax at temperature 0, else one uniform draw against the
    /// cumulative `probs` in token order.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.cfg.temperature == 0.0 {
            return argmax(logits);
        }
        let p = self.probs(logits);
        pick(&p, self.rng.gen::<f64>()) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(temperature: f32, top_k: usize, top_p: f32) -> SamplerConfig {
        SamplerConfig {
            temperature,
            top_k,
            top_p,
            seed: 7,
        }
    }

    fn freq(c: SamplerConfig, logits: &[f32], n: usize) -> Vec<f64> {
        let mut s = Sampler::new(c).unwrap();
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..n {
            counts[s.sample(logits) as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    #[test]
    fn greedy_and_distributions() {
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let mut g = Sampler::new(cfg(0.0, 0, 1.0)).unwrap();
        assert_eq!(
            g.sample(&[1.0, 3.0, 3.0, 2.0]),
            1,
            "ties go to the lower id"
        );
        let f = freq(cfg(1.0, 0, 1.0), &logits, 40_000);
        for (got, want) in f.iter().zip([0.5, 0.3, 0.2]) {
            assert!((got - want).abs() < 0.01, "{f:?}");
        }
        // top-k 2 renormalises over the first two: 0.625 / 0.375.
        let f = freq(cfg(1.0, 2, 1.0), &logits, 40_000);
        assert_eq!(f[2], 0.0);
        assert!((f[0] - 0.625).abs() < 0.01, "{f:?}");
        // top-p 0.6 needs {0.5, 0.3} (0.5 alone is short of 0.6).
        let f = freq(cfg(1.0, 0, 0.6), &logits, 40_000);
        assert_eq!(f[2], 0.0);
        assert!((f[1] - 0.375).abs() < 0.01, "{f:?}");
        // A low temperature sharpens towards the argmax.
        let f = freq(cfg(0.1, 0, 1.0), &logits, 10_000);
        assert!(f[0] > 0.99, "{f:?}");
        // The same seed draws the same tokens.
        let draw = |seed| {
            let mut s = Sampler::new(SamplerConfig {
                seed,
                ..cfg(1.0, 0, 1.0)
            })
            .unwrap();
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(Sampler::new(cfg(-1.0, 0, 1.0)).is_err());
        assert!(Sampler::new(cfg(f32::NAN, 0, 1.0)).is_err());
        assert!(Sampler::new(cfg(1.0, 0, 0.0)).is_err());
        assert!(Sampler::new(cfg(1.0, 0, 1.5)).is_err());
    }
}
