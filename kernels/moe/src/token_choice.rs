//! Token-choice routing: each token takes its k most probable experts (ties to the lower
//! expert index, as `torch.topk` on distinct values and the CUDA router), then each expert
//! keeps at most its capacity under the priority policy (`Priority`, whose documentation
//! names the system each follows):
//! - `order`: an expert's queue in token order (a token reaches an expert at most once, so
//!   token-major and (token, rank) order are the same queue);
//! - `gshard`: in (rank, token) order — slot positions as DeepSpeed's `top2gating` computes
//!   them, `cumsum(mask_r) − 1 + Σ_{r' < r} sum(mask_r')`, kept while position < capacity;
//! - `score`: by router probability, highest first, ties to the lower token;
//! - `reroute`: `gshard`, then rounds of second chances (Switch Transformer's "No Token Left
//!   Behind"): each round, every assignment without a slot, in (rank, token) order, tries
//!   the next expert down its token's preference list (by probability, ties to the lower
//!   index) that none of the token's kept assignments holds; it moves there if that expert
//!   has a free slot. Rounds continue until nothing moves; an assignment that has walked
//!   its whole list stays dropped (every expert it tried was full, and loads only grow).

use crate::config::{MoeConfig, Priority};
use crate::decision::{higher_first, Assignment, Routing};

/// Experts of one token, most probable first (NaN first), ties to the lower index.
fn preference(p: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| higher_first(p[a], p[b]).then(a.cmp(&b)));
    order
}

/// Top-k assignments and capacity under `policy` (weights are set by the caller).
pub(crate) fn select_tokens(
    cfg: &MoeConfig,
    probs: Vec<f64>,
    k: usize,
    policy: Priority,
) -> Routing {
    let e = cfg.experts;
    let preferences: Vec<Vec<usize>> = probs.chunks(e).map(preference).collect();
    let mut assignments = Vec::with_capacity(cfg.tokens * k);
    for (token, order) in preferences.iter().enumerate() {
        for (rank, &expert) in order[..k].iter().enumerate() {
            assignments.push(Assignment {
                token,
                rank,
                chosen: expert,
                expert,
                prob: probs[token * e + expert],
                weight: 0.0,
                kept: true,
                rerouted: false,
            });
        }
    }
    let capacity = cfg.capacity_slots();
    if let Some(cap) = capacity {
        let mut queues: Vec<Vec<usize>> = vec![vec![]; e];
        // (token, rank) order: `order`'s queues; the other policies re-sort them.
        for (i, a) in assignments.iter().enumerate() {
            queues[a.expert].push(i);
        }
        for queue in &mut queues {
            let by = |i: &usize| {
                let a = &assignments[*i];
                (a.rank, a.token)
            };
            match policy {
                Priority::TokenOrder => {}
                Priority::RankMajor | Priority::Reroute => queue.sort_by_key(by),
                Priority::Score => queue.sort_by(|&i, &j| {
                    let (x, y) = (&assignments[i], &assignments[j]);
                    higher_first(x.prob, y.prob).then(x.token.cmp(&y.token))
                }),
            }
            for &i in queue.iter().skip(cap) {
                assignments[i].kept = false;
            }
        }
        if policy == Priority::Reroute {
            let load: Vec<usize> = queues.iter().map(|q| q.len().min(cap)).collect();
            reroute(&mut assignments, &preferences, &probs, k, cap, load);
        }
    }
    Routing {
        probs,
        starts: (0..=cfg.tokens).map(|t| t * k).collect(),
        assignments,
        capacity,
    }
}

/// The second-chance rounds of `reroute` (see the module documentation).
fn reroute(
    assignments: &mut [Assignment],
    preferences: &[Vec<usize>],
    probs: &[f64],
    k: usize,
    cap: usize,
    mut load: Vec<usize>,
) {
    let e = load.len();
    // The dropped assignments in (rank, token) order, each with its next place to look.
    let mut waiting: Vec<(usize, usize)> = (0..assignments.len())
        .filter(|&i| !assignments[i].kept)
        .map(|i| (i, k))
        .collect();
    waiting.sort_by_key(|&(i, _)| (assignments[i].rank, assignments[i].token));
    while !waiting.is_empty() {
        let mut still = vec![];
        for (i, mut next) in waiting {
            let t = assignments[i].token;
            let held = |x: usize, a: &[Assignment]| {
                a[t * k..(t + 1) * k]
                    .iter()
                    .any(|s| s.kept && s.expert == x)
            };
            while next < e && held(preferences[t][next], assignments) {
                next += 1;
            }
            if next == e {
                continue;
            }
            let candidate = preferences[t][next];
            if load[candidate] < cap {
                load[candidate] += 1;
                let a = &mut assignments[i];
                a.expert = candidate;
                a.prob = probs[t * e + candidate];
                a.kept = true;
                a.rerouted = true;
            } else {
                still.push((i, next + 1));
            }
        }
        waiting = still;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Capacity, WeightNorm};

    fn layer(tokens: usize, experts: usize, k: usize, policy: Priority, cf: f64) -> MoeConfig {
        MoeConfig::token_choice(
            tokens,
            1,
            1,
            experts,
            k,
            policy,
            WeightNorm::Raw,
            Capacity::Factor(cf),
        )
    }

    fn kept(r: &Routing) -> Vec<(usize, usize, usize)> {
        r.assignments
            .iter()
            .filter(|a| a.kept)
            .map(|a| (a.token, a.rank, a.expert))
            .collect()
    }

    /// Four tokens over three experts, all preferring expert 0, then 1, then 2 (token 3
    /// prefers 1 first), so expert 0 is over-full.
    fn skewed() -> Vec<f64> {
        vec![
            0.5, 0.3, 0.2, //
            0.6, 0.3, 0.1, //
            0.7, 0.2, 0.1, //
            0.3, 0.6, 0.1,
        ]
    }

    #[test]
    fn each_policy_keeps_its_own_queue() {
        // k = 2, capacity ⌈4·2·0.75/3⌉ = 2 per expert. Expert 0 is wanted by tokens 0, 1, 2 at
        // rank 0 and token 3 at rank 1; expert 1 by tokens 0, 1, 2 at rank 1, token 3 at rank 0.
        let order = select_tokens(
            &layer(4, 3, 2, Priority::TokenOrder, 0.75),
            skewed(),
            2,
            Priority::TokenOrder,
        );
        assert_eq!(order.capacity, Some(2));
        // Token-major: tokens 0 and 1 take both slots of experts 0 and 1.
        assert_eq!(
            kept(&order),
            vec![(0, 0, 0), (0, 1, 1), (1, 0, 0), (1, 1, 1)]
        );
        let gshard = select_tokens(
            &layer(4, 3, 2, Priority::RankMajor, 0.75),
            skewed(),
            2,
            Priority::RankMajor,
        );
        // Rank-major: expert 1's first choice (token 3) comes before any second choice.
        assert_eq!(
            kept(&gshard),
            vec![(0, 0, 0), (0, 1, 1), (1, 0, 0), (3, 0, 1)]
        );
        let score = select_tokens(
            &layer(4, 3, 2, Priority::Score, 0.75),
            skewed(),
            2,
            Priority::Score,
        );
        // Expert 0: 0.7 (t2), 0.6 (t1); expert 1: 0.6 (t3), then 0.3 ties t0/t1 → t0.
        assert_eq!(
            kept(&score),
            vec![(0, 1, 1), (1, 0, 0), (2, 0, 0), (3, 0, 1)]
        );
    }

    #[test]
    fn reroute_moves_overflow_to_the_next_expert_with_room() {
        let c = layer(4, 3, 2, Priority::Reroute, 0.75);
        let r = select_tokens(&c, skewed(), 2, Priority::Reroute);
        // After gshard: dropped t2 rank 0 (expert 0), t1 rank 1 (expert 1), t2 rank 1
        // (expert 1), t3 rank 1 (expert 0). Expert 2 has two free slots. In (rank, token)
        // order: t2 r0 tries expert 2 (its first choice outside its top-2): taken. t1 r1
        // tries expert 2: taken. t2 r1: its list is exhausted (0, 1 full; 2 held by its own
        // rerouted rank 0). t3 r1: expert 2 full.
        let moved: Vec<(usize, usize, usize)> = r
            .assignments
            .iter()
            .filter(|a| a.rerouted)
            .map(|a| (a.token, a.rank, a.expert))
            .collect();
        assert_eq!(moved, vec![(1, 1, 2), (2, 0, 2)]);
        assert!(r
            .assignments
            .iter()
            .filter(|a| a.rerouted)
            .all(|a| a.kept && a.chosen != a.expert));
        let dropped = r.assignments.iter().filter(|a| !a.kept).count();
        assert_eq!(dropped, 2);
        // The rerouted assignment carries its new expert's probability.
        let a = r
            .assignments
            .iter()
            .find(|a| a.token == 2 && a.rank == 0)
            .unwrap();
        assert_eq!(a.prob, 0.1);
        // Every expert full; no token holds one expert twice.
        let mut load = [0; 3];
        for a in r.assignments.iter().filter(|a| a.kept) {
            load[a.expert] += 1;
        }
        assert_eq!(load, [2, 2, 2]);
        for t in 0..4 {
            let own: Vec<usize> = r
                .of_token(t)
                .iter()
                .filter(|a| a.kept)
                .map(|a| a.expert)
                .collect();
            let mut d = own.clone();
            d.dedup();
            assert_eq!(d.len(), own.len());
        }
    }

    #[test]
    fn reroute_equals_gshard_when_nothing_overflows() {
        let c = layer(4, 3, 2, Priority::Reroute, 3.0);
        let r = select_tokens(&c, skewed(), 2, Priority::Reroute);
        let g = select_tokens(&c, skewed(), 2, Priority::RankMajor);
        assert_eq!(r, g);
    }
}
