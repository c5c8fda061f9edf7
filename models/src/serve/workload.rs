//! Seeded serving workloads: prompt and output lengths drawn from log-normal distributions
//! (the shape of the ShareGPT traces vLLM was evaluated on — Kwon et al. report mean input 161
//! and output 338 tokens; the means here are parameters), clipped to a context, an optional
//! system prompt shared by every request, and Poisson arrivals (exponential gaps) at a rate.

use crate::serve::sampler::SamplerConfig;
use crate::serve::scheduler::Request;
use kernel_common::inputs::rng;
use rand::Rng;
use rand_distr::{Distribution, Exp, LogNormal};

/// What requests look like.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    pub requests: usize,
    /// Mean prompt tokens after the system prompt (log-normal, σ = `sigma`).
    pub prompt_mean: f64,
    /// Mean output tokens (log-normal), clipped to `max_new`.
    pub output_mean: f64,
    pub sigma: f64,
    /// Most output tokens a request asks for (what a contiguous allocator reserves).
    pub max_new: usize,
    /// Tokens of a system prompt every request starts with.
    pub system_prompt: usize,
    /// Longest prompt (the rest is cut).
    pub max_prompt: usize,
    /// Requests per second (Poisson); 0 = all at time 0.
    pub rate: f64,
    pub vocab: usize,
    pub seed: u64,
}

/// One drawn request: its prompt tokens and how many tokens it will generate.
#[derive(Debug, Clone, PartialEq)]
pub struct Drawn {
    pub prompt: Vec<u32>,
    /// Output length (generation is forced to this length: `--ignore-eos` semantics).
    pub output: usize,
    pub arrival: f64,
}

fn lognormal(mean: f64, sigma: f64) -> LogNormal<f64> {
    // mean = exp(μ + σ²/2)
    LogNormal::new(mean.max(1.0).ln() - sigma * sigma / 2.0, sigma).expect("σ ≥ 0 is checked")
}

impl Workload {
    /// Checks the parameters; one line per problem.
    pub fn validate(&self) -> Result<(), String> {
        if self.requests == 0 || self.max_new == 0 || self.max_prompt == 0 || self.vocab < 2 {
            return Err("requests, max_new, max_prompt must be ≥ 1 and the vocabulary ≥ 2".into());
        }
        if !(self.sigma >= 0.0 && self.sigma.is_finite()) {
            return Err(format!("sigma must be finite and ≥ 0, got {}", self.sigma));
        }
        if !(self.rate >= 0.0 && self.rate.is_finite()) {
            return Err(format!("rate must be finite and ≥ 0, got {}", self.rate));
        }
        if !(self.prompt_mean >= 1.0 && self.output_mean >= 1.0) {
            return Err("prompt and output means must be ≥ 1".into());
        }
        Ok(())
    }

    /// The requests, seeded.
    pub fn draw(&self) -> Vec<Drawn> {
        let mut r = rng(self.seed);
        let (p, o) = (
            lognormal(self.prompt_mean, self.sigma),
            lognormal(self.output_mean, self.sigma),
        );
        let gaps = (self.rate > 0.0).then(|| Exp::new(self.rate).expect("rate > 0"));
        // The system prompt is one fixed token sequence.
        let system: Vec<u32> = (0..self.system_prompt)
            .map(|i| (i as u64 * 7919 % self.vocab as u64) as u32)
            .collect();
        let mut t = 0.0;
        (0..self.requests)
            .map(|_| {
                if let Some(g) = &gaps {
                    t += g.sample(&mut r);
                }
                let own = (p.sample(&mut r).round() as usize).clamp(1, self.max_prompt);
                let mut prompt = system.clone();
                prompt.extend((0..own).map(|_| r.gen_range(0..self.vocab as u32)));
                Drawn {
                    prompt,
                    output: (o.sample(&mut r).round() as usize).clamp(1, self.max_new),
                    arrival: t,
                }
            })
            .collect()
    }

    /// The drawn requests as scheduler requests (greedy, no end-of-sequence: each generates
    /// exactly its drawn output length).
    pub fn requests(&self) -> Vec<Request> {
        self.draw()
            .into_iter()
            .enumerate()
            .map(|(i, d)| Request {
                id: i as u64,
                prompt: d.prompt,
                max_new: d.output,
                arrival: d.arrival,
                sampler: SamplerConfig {
                    temperature: 0.0,
                    top_k: 0,
                    top_p: 1.0,
                    seed: i as u64,
                },
                eos: None,
            })
            .collect()
    }
}
