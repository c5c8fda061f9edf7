//! The cost-aware depth policy: a verification pass of k tokens costs `steps(k)` decode steps
//! (measured on the target before generation, the `verify_cost` experiment's quantity), a
//! drafted level costs what the drafter took so far, and a depth-d draft with per-level
//! acceptance α yields 1 + α + α² + … + α^d tokens (the target's own token plus the accepted
//! prefix of the path). Each round takes the depth with the most expected tokens per step —
//! speculation pays only while the expected tokens per pass exceed the pass's cost — instead
//! of a fixed acceptance threshold (C21's 70%), which ignores what a pass of that size costs
//! on this machine (a GPU pass of 5 tokens costs about one step; a 2-core CPU's ~1.5–2.5).

use crate::model::forward::SeqChunk;
use crate::model::kv::KvPools;
use crate::model::llama::{Llama, Result};
use kernel_common::KernelError;
use kernel_speculative::TreeShape;
use std::time::Instant;

/// Measured pass costs: `steps[k − 1]` = a k-token step (every token's logits) over the
/// 1-token step, `step_s` the 1-token step in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct PassCost {
    pub steps: Vec<f64>,
    pub step_s: f64,
}

impl PassCost {
    /// Costs given directly (`steps[0]` must be 1).
    pub fn new(steps: Vec<f64>, step_s: f64) -> Result<PassCost> {
        if steps.first() != Some(&1.0) || steps.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(KernelError::InvalidShape(format!(
                "pass costs must start at 1 and be positive: {steps:?}"
            )));
        }
        Ok(PassCost { steps, step_s })
    }

    /// Times k-token steps of `target` for k = 1..=`max_tokens` (median of `reps` each)
    /// after a `context`-token prompt, on a scratch cache: the same positions rewritten each
    /// time, as `verify_cost` does.
    pub fn measure(
        target: &Llama,
        max_tokens: usize,
        context: usize,
        reps: usize,
    ) -> Result<PassCost> {
        let (max_tokens, reps) = (max_tokens.max(1), reps.max(1));
        let vocab = target.cfg.vocab as u32;
        let ids: Vec<u32> = (0..(context + max_tokens) as u32)
            .map(|i| (i * 7919 + 13) % vocab)
            .collect();
        let mut seq = ScratchStep::new(target, ids, context)?;
        let mut medians = vec![];
        for k in 1..=max_tokens {
            let mut t: Vec<f64> = (0..reps + 1)
                .map(|_| seq.step(k).map(|(s, _)| s))
                .collect::<Result<_>>()?;
            t.remove(0); // the first of each size warms its buffers
            t.sort_by(f64::total_cmp);
            medians.push(t[t.len() / 2]);
        }
        let one = medians[0];
        PassCost::new(medians.iter().map(|m| m / one).collect(), one)
    }

    /// A pass of `tokens` tokens in steps (past the measured sizes, extended by the last
    /// measured slope).
    pub fn steps_for(&self, tokens: usize) -> f64 {
        let n = self.steps.len();
        if tokens <= n {
            return self.steps[tokens.max(1) - 1];
        }
        let slope = if n >= 2 {
            self.steps[n - 1] - self.steps[n - 2]
        } else {
            1.0
        };
        self.steps[n - 1] + slope.max(0.0) * (tokens - n) as f64
    }

    /// The depth in 1..=`max_depth` with the most expected tokens per step for a draft of
    /// `shape` when each drafted level is accepted with probability `alpha` and costs
    /// `draft_steps` steps to draft.
    pub fn best_depth(
        &self,
        shape: &TreeShape,
        max_depth: usize,
        alpha: f64,
        draft_steps: f64,
    ) -> usize {
        let alpha = alpha.clamp(0.0, 1.0);
        let mut best = (1, f64::NEG_INFINITY);
        let (mut expected, mut power) = (1.0, 1.0);
        for d in 1..=max_depth.max(1) {
            power *= alpha;
            expected += power;
            let cost = self.steps_for(1 + nodes_within(shape, d)) + draft_steps * d as f64;
            let rate = expected / cost;
            if rate > best.1 + 1e-12 {
                best = (d, rate);
            }
        }
        best.0
    }
}

/// One sequence on a scratch paged cache after a prompt, stepped k tokens at a time at the
/// same positions (rewritten each time, every token's logits): the step `PassCost::measure`
/// and the `verify_cost` experiment time.
pub struct ScratchStep<'a> {
    target: &'a Llama,
    kv: KvPools,
    table: Vec<u32>,
    /// The prompt (`context` tokens), then the tokens a step takes.
    ids: Vec<u32>,
    context: usize,
}

impl<'a> ScratchStep<'a> {
    /// Runs the first `context` of `ids` as the prompt; steps take from the rest.
    pub fn new(target: &'a Llama, ids: Vec<u32>, context: usize) -> Result<ScratchStep<'a>> {
        if context == 0 || context >= ids.len() {
            return Err(KernelError::InvalidShape(format!(
                "a scratch step needs a prompt and tokens after it: {context} of {} ids",
                ids.len()
            )));
        }
        let bs = 16;
        let blocks = ids.len().div_ceil(bs);
        let mut kv = KvPools::new(target, blocks, bs)?;
        let table: Vec<u32> = (0..blocks as u32).collect();
        let prompt = SeqChunk {
            tokens: &ids[..context],
            start: 0,
            table: &table,
            all_logits: false,
            verify: false,
            tree: None,
        };
        target.forward(&mut kv, &[prompt])?;
        Ok(ScratchStep {
            target,
            kv,
            table,
            ids,
            context,
        })
    }

    /// One step of the `k` tokens after the prompt: its seconds and its logits (k × vocab).
    pub fn step(&mut self, k: usize) -> Result<(f64, Vec<f32>)> {
        let end = self.context + k;
        if k == 0 || end > self.ids.len() {
            return Err(KernelError::InvalidShape(format!(
                "a step of {k} tokens after {} exceeds the {} ids",
                self.context,
                self.ids.len()
            )));
        }
        let chunk = SeqChunk {
            tokens: &self.ids[self.context..end],
            start: self.context,
            table: &self.table,
            all_logits: true,
            verify: true,
            tree: None,
        };
        let t0 = Instant::now();
        let mut logits = self.target.forward(&mut self.kv, &[chunk])?;
        let secs = t0.elapsed().as_secs_f64();
        Ok((secs, logits.swap_remove(0)))
    }
}

/// Draft nodes of `shape` down to depth `d` (the driver's plan: a chain one a level, a
/// static shape its branching, a dynamic tree two children for up to four nodes a level
/// within its budget).
pub fn nodes_within(shape: &TreeShape, d: usize) -> usize {
    match shape {
        TreeShape::Chain(k) => d.min(*k),
        TreeShape::Static(b) => {
            let (mut level, mut total) = (1usize, 0usize);
            for &x in b.iter().take(d) {
                level = level.saturating_mul(x);
                total = total.saturating_add(level);
            }
            total
        }
        TreeShape::Dynamic(n) => (*n).min(2 + 8 * d.saturating_sub(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_depth_follows_acceptance_and_pass_cost() {
        let shape = TreeShape::Chain(8);
        // A GPU-like curve (every pass up to 9 tokens ~ one step): draft deep even at
        // middling acceptance.
        let flat = PassCost::new(
            vec![1.0, 1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07],
            1e-3,
        )
        .unwrap();
        assert_eq!(flat.best_depth(&shape, 8, 0.7, 0.0), 8);
        // A CPU-like curve (each token ~0.35 steps more): shallow at low acceptance, deeper
        // when the drafts are good.
        let steep: Vec<f64> = (0..9).map(|k| 1.0 + 0.35 * k as f64).collect();
        let steep = PassCost::new(steep, 1e-3).unwrap();
        let (low, high) = (
            steep.best_depth(&shape, 8, 0.3, 0.0),
            steep.best_depth(&shape, 8, 0.95, 0.0),
        );
        assert!(low < high, "{low} {high}");
        assert_eq!(low, 1);
        // A costly drafter pushes the depth down.
        assert!(steep.best_depth(&shape, 8, 0.95, 0.5) < high);
        // Extrapolation past the measured sizes follows the last slope.
        assert!((steep.steps_for(12) - (1.0 + 0.35 * 11.0)).abs() < 1e-12);
        assert!(PassCost::new(vec![0.5], 1.0).is_err());
    }

    #[test]
    fn nodes_within_follows_the_driver_plan() {
        assert_eq!(nodes_within(&TreeShape::Chain(4), 2), 2);
        assert_eq!(nodes_within(&TreeShape::Chain(4), 9), 4);
        assert_eq!(nodes_within(&TreeShape::Static(vec![3, 2, 1]), 2), 3 + 6);
        assert_eq!(nodes_within(&TreeShape::Dynamic(12), 1), 2);
        assert_eq!(nodes_within(&TreeShape::Dynamic(12), 3), 12);
    }
}
