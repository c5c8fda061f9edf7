//! Expert-choice routing (Zhou et al. 2022, "Mixture-of-Experts with Expert Choice
//! Routing"; T5X/Flaxformer's `ExpertsChooseMaskedRouter`): the same token-to-expert softmax
//! as token choice, but each expert takes the c tokens with the highest probability for it
//! (ties to the lower token index), c = ⌊T·cf/E⌋ (`MoeConfig::capacity_slots`). Nothing is
//! dropped by construction and every expert is exactly full; a token may be taken by no
//! expert (it passes through on the residual stream) or by several. The combine weight is
//! the probability itself (`raw`, the paper's G) or renormalised over the experts that took
//! the token (`renormalize_kept`).

use crate::config::MoeConfig;
use crate::decision::{higher_first, Assignment, Routing};

/// Each expert's top-c tokens, filed per token (weights are set by the caller).
pub(crate) fn select_experts(cfg: &MoeConfig, probs: Vec<f64>) -> Routing {
    let (t, e) = (cfg.tokens, cfg.experts);
    let c = cfg
        .capacity_slots()
        .expect("expert choice always has a capacity");
    let mut taken: Vec<Vec<usize>> = vec![vec![]; t];
    let mut by_score: Vec<usize> = (0..t).collect();
    for expert in 0..e {
        let p = |tok: usize| probs[tok * e + expert];
        by_score.sort_by(|&a, &b| higher_first(p(a), p(b)).then(a.cmp(&b)));
        for &token in &by_score[..c] {
            taken[token].push(expert);
        }
    }
    let mut assignments = Vec::with_capacity(e * c);
    let mut starts = Vec::with_capacity(t + 1);
    for (token, experts) in taken.iter_mut().enumerate() {
        starts.push(assignments.len());
        let p = &probs[token * e..(token + 1) * e];
        experts.sort_by(|&a, &b| higher_first(p[a], p[b]).then(a.cmp(&b)));
        for (rank, &expert) in experts.iter().enumerate() {
            assignments.push(Assignment {
                token,
                rank,
                chosen: expert,
                expert,
                prob: p[expert],
                weight: 0.0,
                kept: true,
                rerouted: false,
            });
        }
    }
    starts.push(assignments.len());
    Routing {
        probs,
        assignments,
        starts,
        capacity: Some(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Capacity, Choice, WeightNorm};
    use crate::routing::select;

    #[test]
    fn each_expert_takes_its_best_tokens() {
        // Three tokens, two experts, cf 1.4: c = ⌊3·1.4/2⌋ = 2 tokens per expert.
        let probs = vec![0.9, 0.1, 0.8, 0.2, 0.45, 0.55];
        let cfg = MoeConfig {
            tokens: 3,
            d_model: 1,
            d_ff: 1,
            experts: 2,
            choice: Choice::Experts,
            norm: WeightNorm::Raw,
            capacity: Capacity::Factor(1.4),
            min_capacity: 1,
        };
        let r = select(&cfg, probs.clone());
        assert_eq!(r.capacity, Some(2));
        // Expert 0 takes tokens 0 (0.9) and 1 (0.8); expert 1 takes 2 (0.55) and 1 (0.2).
        let got: Vec<(usize, usize, usize)> = r
            .assignments
            .iter()
            .map(|a| (a.token, a.rank, a.expert))
            .collect();
        assert_eq!(got, vec![(0, 0, 0), (1, 0, 0), (1, 1, 1), (2, 0, 1)]);
        assert_eq!(r.starts, vec![0, 1, 3, 4]);
        assert!(r.assignments.iter().all(|a| a.kept && a.weight == a.prob));
        let kept = select(
            &MoeConfig {
                norm: WeightNorm::RenormalizeKept,
                ..cfg
            },
            probs,
        );
        let w: Vec<f64> = kept.assignments.iter().map(|a| a.weight).collect();
        assert_eq!(w, vec![1.0, 0.8, 0.2, 1.0]);
    }
}
