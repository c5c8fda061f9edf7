//! Seeded serving workloads: prompt and output lengths drawn from log-normal distributions
//! (the shape of the ShareGPT traces vLLM was evaluated on — Kwon et al. report mean input 161
//! and output 338 tokens; the means here are parameters), clipped to a context, an optional
//! system prompt shared by every request, and Poisson arrivals (exponential gaps) at a rate.
//! Prompts are random tokens, or windows of a real text's tokens at seeded offsets
//! (`draw_from`), so a drafter that looks up the prompt meets what real requests give it.

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

    /// The requests, seeded, with random-token prompts.
    pub fn draw(&self) -> Vec<Drawn> {
        self.draw_from(None)
    }

    /// The requests, seeded; with `corpus` (a tokenised text), each prompt after the system
    /// prompt is the corpus's tokens from a seeded offset (at most the whole corpus), else
    /// random tokens.
    pub fn draw_from(&self, corpus: Option<&[u32]>) -> Vec<Drawn> {
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
                match corpus.filter(|c| !c.is_empty()) {
                    Some(c) => {
                        let own = own.min(c.len());
                        let at = r.gen_range(0..=c.len() - own);
                        prompt.extend_from_slice(&c[at..at + own]);
                    }
                    None => prompt.extend((0..own).map(|_| r.gen_range(0..self.vocab as u32))),
                }
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
        self.requests_from(None)
    }

    /// `requests` with prompts cut from `corpus` when given (`draw_from`).
    pub fn requests_from(&self, corpus: Option<&[u32]>) -> Vec<Request> {
        self.draw_from(corpus)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn workload() -> Workload {
        Workload {
            requests: 40,
            prompt_mean: 24.0,
            output_mean: 8.0,
            sigma: 0.8,
            max_new: 32,
            system_prompt: 3,
            max_prompt: 96,
            rate: 2.0,
            vocab: 1000,
            seed: 5,
        }
    }

    #[test]
    fn prompts_from_a_corpus_are_its_windows_after_the_system_prompt() {
        let w = workload();
        let corpus: Vec<u32> = (0..500u32).map(|i| (i * 37 + 11) % 1000).collect();
        let drawn = w.draw_from(Some(&corpus));
        assert_eq!(drawn, w.draw_from(Some(&corpus)), "seeded");
        let random = w.draw();
        assert_eq!(drawn.len(), random.len());
        let mut starts = std::collections::BTreeSet::new();
        for (d, r) in drawn.iter().zip(&random) {
            // The same system prompt as the random workload's.
            assert_eq!(d.prompt[..3], r.prompt[..3]);
            let own = &d.prompt[3..];
            assert!(!own.is_empty() && own.len() <= w.max_prompt);
            let at = corpus
                .windows(own.len())
                .position(|win| win == own)
                .expect("a prompt is a window of the corpus");
            starts.insert(at);
        }
        assert!(starts.len() > 20, "offsets vary: {starts:?}");
        // A corpus shorter than a prompt gives the whole corpus.
        let short = [7u32, 8, 9];
        for d in w.draw_from(Some(&short)) {
            assert!(d.prompt[3..].len() <= 3);
            assert!(short
                .windows(d.prompt.len() - 3)
                .any(|x| x == &d.prompt[3..]));
        }
        // An empty corpus falls back to random tokens.
        assert_eq!(w.draw_from(Some(&[])), random);
    }
}
