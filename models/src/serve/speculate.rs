//! Speculative decoding inside the continuous-batching engine (as vLLM runs it: the draft
//! tokens of every decoding sequence join the same batched forward pass as the other
//! requests' decode and prefill tokens). Each decoding sequence drafts a chain of up to
//! `max_draft` tokens from its own `ChainDrafter` over its prompt and output so far (the
//! model-free drafters of `speculative::chain`: n-gram prompt lookup, the suffix tree); the step runs its last token and
//! the chain at consecutive positions with every token's logits (a chain needs no tree mask:
//! the causal mask is its path), and verification keeps the longest acceptable prefix plus
//! one token of the target's own. A chain's accepted tokens already sit at their final
//! positions, so nothing is moved: the rejected tail is dropped from the block table
//! (`BlockManager::truncate`) and later tokens overwrite its slots.
//!
//! Verification is lossless: greedy keeps a draft token while it equals the target's argmax
//! (the output is plain greedy decoding's), sampling accepts a deterministic proposal d with
//! probability p(d) and on rejection draws from p with d removed, renormalised (Leviathan et
//! al. 2023 with a point-mass draft distribution), so the output keeps the target's
//! distribution.

use crate::model::llama::{argmax, Result};
use crate::serve::sampler::Sampler;
use kernel_common::inputs::pick;
use rand::Rng;

/// A source of draft chains for one sequence.
pub trait ChainDrafter: Send {
    /// Up to `k` tokens to follow `committed` (every token so far; fewer, or none, when it
    /// has nothing to propose).
    fn chain(&mut self, committed: &[u32], k: usize) -> Result<Vec<u32>>;
    /// The sequence ended with `committed` (every token; a drafter that learns across
    /// sequences, such as SuffixDecoding's global tree, takes its output now).
    fn finish(&mut self, _committed: &[u32]) -> Result<()> {
        Ok(())
    }
}

/// Speculation in the engine: a drafter per decoding sequence and the longest chain a step
/// drafts.
pub struct EngineSpeculation {
    pub max_draft: usize,
    /// Names the drafter in results (`ngram:3:k=4`).
    pub label: String,
    /// A fresh drafter for a sequence.
    pub new_drafter: Box<dyn Fn() -> Box<dyn ChainDrafter> + Send + Sync>,
}

/// What speculation did over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineSpecStats {
    /// Decode slots that carried a draft.
    pub rounds: usize,
    /// Draft tokens run.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
}

impl EngineSpecStats {
    /// Accepted / drafted.
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// The tokens a step emits for a chain: `rows[i]` holds the logits after the root and the
/// first i draft tokens (`draft.len() + 1` rows). Greedy: the draft tokens equal to the
/// argmax, then the argmax where they differ (or after the last). Sampling: each draft
/// token accepted with probability p(token); the first rejected is replaced by a draw from
/// p without it; after a fully accepted chain, a draw from the last row.
pub(crate) fn verify_chain(sampler: &mut Sampler, rows: &[&[f32]], draft: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(draft.len() + 1);
    for (row, &d) in rows.iter().zip(draft) {
        if sampler.cfg.temperature == 0.0 {
            let t = argmax(row);
            out.push(t);
            if t != d {
                return out;
            }
            continue;
        }
        let mut p = sampler.probs(row);
        let u: f64 = sampler.rng().gen();
        let pd = p[d as usize] as f64;
        if u < pd {
            out.push(d);
            continue;
        }
        p[d as usize] = 0.0;
        let rest = (1.0 - pd).max(f64::MIN_POSITIVE);
        let u: f64 = sampler.rng().gen();
        out.push(pick(&p, u * rest) as u32);
        return out;
    }
    out.push(sampler.sample(rows[draft.len()]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::sampler::SamplerConfig;

    #[test]
    fn greedy_verification_keeps_the_matching_prefix_and_the_targets_token() {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        })
        .unwrap();
        let row = |t: usize| {
            let mut r = vec![0.0f32; 6];
            r[t] = 1.0;
            r
        };
        let rows = [row(2), row(4), row(1), row(5)];
        let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
        assert_eq!(verify_chain(&mut s, &refs, &[2, 4, 1]), vec![2, 4, 1, 5]);
        assert_eq!(verify_chain(&mut s, &refs, &[2, 3, 1]), vec![2, 4]);
        assert_eq!(verify_chain(&mut s, &refs, &[0, 4, 1]), vec![2]);
        assert_eq!(verify_chain(&mut s, &refs[..1], &[]), vec![2]);
    }

    #[test]
    fn a_sampled_rejection_never_emits_the_rejected_token() {
        // Row 0 gives the draft token 0 probability ~0.5: over many seeds both outcomes
        // happen, and a rejection always emits another token.
        let (mut acc, mut rej) = (0, 0);
        for seed in 0..400 {
            let mut s = Sampler::new(SamplerConfig {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed,
            })
            .unwrap();
            let rows = [[0.0f32, -9.0, 0.0], [0.0, 0.0, 0.0]];
            let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
            let out = verify_chain(&mut s, &refs, &[0]);
            if out[0] == 0 {
                acc += 1;
                assert_eq!(out.len(), 2);
            } else {
                rej += 1;
                assert_eq!(out, vec![2], "rejected: only token 2 is left (1 is ~0)");
            }
        }
        assert!(acc > 100 && rej > 100, "{acc} accepted, {rej} rejected");
    }
}
