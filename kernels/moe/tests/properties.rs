//! Property tests of the MoE family: capacity is never exceeded and kept + dropped = the
//! assignments; an expert drops only when full; `gshard` keeps every first choice an expert
//! can hold before any second choice; `reroute` drops only when every expert its token does
//! not hold is full; renormalised weights sum to 1 (over the top-k, or over the kept choices);
//! expert choice fills every expert exactly; dropless equals the dense weighted mixture
//! computed directly; with drop-by-score, permuting the tokens permutes the output; both
//! expert variants match the f64 reference on NaN-poisoned outputs under every convention; the
//! f32 router makes the f64 router's decisions; and the edge cases (every token on one
//! expert, capacity 1, more experts than tokens, k = experts).

use kernel_common::inputs::{normal_f32, rng};
use kernel_common::{tolerance, DType, ErrorStats};
use kernel_moe::reference::experts_reference;
use kernel_moe::{
    experts_forward, route, route_reference, Capacity, Choice, ExpertVariant, MoeConfig,
    MoeWeights, Priority, Routing, WeightNorm,
};
use proptest::prelude::*;

#[allow(clippy::too_many_arguments)]
fn cfg(
    tokens: usize,
    d_model: usize,
    d_ff: usize,
    experts: usize,
    top_k: usize,
    norm: WeightNorm,
    capacity: Capacity,
    policy: Priority,
) -> MoeConfig {
    MoeConfig::token_choice(
        tokens, d_model, d_ff, experts, top_k, policy, norm, capacity,
    )
}

/// Both variants against the f64 reference for the same routing.
fn check_variants(c: &MoeConfig, w: &MoeWeights, x: &[f32], routing: &Routing) {
    let all: Vec<usize> = (0..c.tokens).collect();
    let want = experts_reference(c, w, x, routing, &all);
    for v in [ExpertVariant::Grouped, ExpertVariant::Naive] {
        let mut out = vec![f32::NAN; c.tokens * c.d_model];
        experts_forward(c, w, x, routing, v, &mut out).unwrap();
        let s = ErrorStats::compare(&out, &want);
        assert!(
            s.passes(&tolerance(DType::F32).scaled_to(&want)),
            "{} {v:?}: {s:?}",
            c.label()
        );
    }
}

fn capacity_strategy() -> impl Strategy<Value = Capacity> {
    prop_oneof![
        Just(Capacity::Dropless),
        (0.05f64..3.0).prop_map(Capacity::Factor),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn routing_invariants_and_variants_match_the_reference(
        tokens in 1usize..200, d_model in 1usize..40, d_ff in 1usize..50,
        experts in 2usize..65, k_raw in 1usize..5, norm_i in 0usize..3,
        capacity in capacity_strategy(), policy_i in 0usize..4, skew in 0.0f64..2.0,
        min_capacity in 0usize..6, seed in any::<u64>(),
    ) {
        let k = k_raw.min(experts);
        let norm = WeightNorm::ALL[norm_i];
        let policy = Priority::ALL[policy_i];
        let c = MoeConfig { min_capacity, ..cfg(tokens, d_model, d_ff, experts, k, norm, capacity, policy) };
        let w = MoeWeights::random(&c, skew, seed);
        let x = normal_f32(&mut rng(seed ^ 7), tokens * d_model, 1.0);
        let r = route(&c, &x, &w.router, &w.bias).unwrap();
        let stats = r.stats(experts);
        prop_assert_eq!(stats.kept.iter().sum::<usize>() + stats.dropped, tokens * k);
        if policy != Priority::Reroute {
            prop_assert_eq!(stats.rerouted, 0);
        }
        if let Some(cap) = c.capacity_slots() {
            prop_assert!(cap >= min_capacity.max(1));
            prop_assert!(stats.kept.iter().all(|&n| n <= cap), "{:?} cap {}", stats.kept, cap);
            // An expert drops only when full.
            for a in r.assignments.iter().filter(|a| !a.kept) {
                prop_assert_eq!(stats.kept[a.chosen], cap);
            }
            if policy == Priority::RankMajor {
                // A kept choice of rank r to an expert means no choice of lower rank to it
                // was dropped.
                for a in r.assignments.iter().filter(|a| !a.kept) {
                    prop_assert!(!r.assignments.iter().any(|b| b.kept && b.expert == a.expert && b.rank > a.rank));
                }
            }
            if policy == Priority::Reroute {
                for a in r.assignments.iter().filter(|a| !a.kept) {
                    let held: Vec<usize> = r.of_token(a.token).iter().filter(|b| b.kept).map(|b| b.expert).collect();
                    for e in (0..experts).filter(|e| !held.contains(e)) {
                        prop_assert_eq!(stats.kept[e], cap, "a dropped assignment while expert {} has room", e);
                    }
                }
            }
        } else {
            prop_assert_eq!(stats.dropped, 0);
        }
        for t in 0..tokens {
            let chosen = r.of_token(t);
            let mut experts_of: Vec<usize> = chosen.iter().filter(|a| a.kept).map(|a| a.expert).collect();
            experts_of.sort_unstable();
            experts_of.dedup();
            prop_assert_eq!(experts_of.len(), chosen.iter().filter(|a| a.kept).count(), "distinct experts per token");
            let sum = |f: &dyn Fn(&&kernel_moe::Assignment) -> bool| chosen.iter().filter(f).map(|a| a.weight).sum::<f64>();
            match norm {
                WeightNorm::Renormalize => prop_assert!((sum(&|_| true) - 1.0).abs() < 1e-9),
                WeightNorm::RenormalizeKept if chosen.iter().any(|a| a.kept) => {
                    prop_assert!((sum(&|a| a.kept) - 1.0).abs() < 1e-9)
                }
                _ => {}
            }
        }
        check_variants(&c, &w, &x, &r);
    }

    #[test]
    fn expert_choice_fills_every_expert(
        tokens in 1usize..200, d_model in 1usize..30, d_ff in 1usize..30,
        experts in 1usize..40, factor in 0.05f64..4.0, kept_norm in any::<bool>(),
        min_capacity in 0usize..4, skew in 0.0f64..2.0, seed in any::<u64>(),
    ) {
        let norm = if kept_norm { WeightNorm::RenormalizeKept } else { WeightNorm::Raw };
        let c = MoeConfig {
            tokens, d_model, d_ff, experts, choice: Choice::Experts, norm,
            capacity: Capacity::Factor(factor), min_capacity,
        };
        prop_assume!(c.validate().is_ok());
        let slots = c.capacity_slots().unwrap();
        prop_assert_eq!(slots, ((tokens as f64 * factor / experts as f64).floor() as usize).max(min_capacity).min(tokens));
        let w = MoeWeights::random(&c, skew, seed);
        let x = normal_f32(&mut rng(seed ^ 5), tokens * d_model, 1.0);
        let r = route(&c, &x, &w.router, &w.bias).unwrap();
        let s = r.stats(experts);
        prop_assert!(s.kept.iter().all(|&n| n == slots));
        prop_assert_eq!(s.dropped, 0);
        prop_assert_eq!(s.assignments, experts * slots);
        let served = (0..tokens).filter(|&t| !r.of_token(t).is_empty()).count();
        prop_assert_eq!(s.unserved_tokens, tokens - served);
        // Each expert's tokens are its best: none it left out scores higher.
        for e in 0..experts {
            let p = |t: usize| r.probs[t * experts + e];
            let mine: Vec<usize> = r.assignments.iter().filter(|a| a.expert == e).map(|a| a.token).collect();
            let worst_in = mine.iter().map(|&t| p(t)).fold(f64::INFINITY, f64::min);
            prop_assert!((0..tokens).filter(|t| !mine.contains(t)).all(|t| p(t) <= worst_in));
        }
        check_variants(&c, &w, &x, &r);
    }

    #[test]
    fn f32_router_makes_the_f64_decisions(
        tokens in 1usize..300, d_model in 4usize..64, experts in 2usize..64, k_raw in 1usize..3,
        seed in any::<u64>(),
    ) {
        let k = k_raw.min(experts);
        let c = cfg(tokens, d_model, 8, experts, k, WeightNorm::Renormalize, Capacity::Factor(1.0), Priority::Score);
        let w = MoeWeights::random(&c, 0.5, seed);
        let x = normal_f32(&mut rng(seed), tokens * d_model, 1.0);
        let (a, b) = (route(&c, &x, &w.router, &w.bias).unwrap(), route_reference(&c, &x, &w.router, &w.bias).unwrap());
        let max_err = a.probs.iter().zip(&b.probs).map(|(p, q)| (p - q).abs()).fold(0.0, f64::max);
        prop_assert!(max_err < 1e-5, "probabilities differ by {}", max_err);
        // Decisions agree unless the f64 probabilities that decide them are within 1e-5: the
        // k-th and (k+1)-th of a token, or the last kept and first dropped of a full expert.
        let eps = 1e-5;
        let close_rank = b.probs.chunks(experts).any(|p| {
            let mut p = p.to_vec();
            p.sort_by(|x, y| y.total_cmp(x));
            k < experts && p[k - 1] - p[k] < eps
        });
        let cap = c.capacity_slots().expect("a factor");
        let close_cap = (0..experts).any(|e| {
            let mut p: Vec<f64> = b.assignments.iter().filter(|a| a.expert == e).map(|a| a.prob).collect();
            p.sort_by(|x, y| y.total_cmp(x));
            p.len() > cap && p[cap - 1] - p[cap] < eps
        });
        prop_assume!(!close_rank && !close_cap);
        let decisions = |r: &kernel_moe::Routing| {
            let mut v: Vec<(usize, usize, bool)> = r.assignments.iter().map(|a| (a.token, a.expert, a.kept)).collect();
            v.sort();
            v
        };
        prop_assert_eq!(decisions(&a), decisions(&b));
    }
}

#[test]
fn dropless_is_the_dense_weighted_mixture() {
    let c = cfg(
        37,
        13,
        17,
        6,
        2,
        WeightNorm::Renormalize,
        Capacity::Dropless,
        Priority::Score,
    );
    let w = MoeWeights::random(&c, 0.3, 11);
    let x = normal_f32(&mut rng(12), c.tokens * c.d_model, 1.0);
    let r = route_reference(&c, &x, &w.router, &w.bias).unwrap();
    let (d, f, e) = (c.d_model, c.d_ff, c.experts);
    // Directly: gate_e(x) = p_e / Σ_top2 p if e is among the two largest, else 0;
    // y = Σ_e gate_e(x) · FFN_e(x), every expert evaluated.
    let mut want = vec![];
    for t in 0..c.tokens {
        let xt = &x[t * d..(t + 1) * d];
        let logits: Vec<f64> = (0..e)
            .map(|j| {
                (0..d)
                    .map(|i| xt[i] as f64 * w.router[i * e + j] as f64)
                    .sum::<f64>()
                    + w.bias[j] as f64
            })
            .collect();
        let mut idx: Vec<usize> = (0..e).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let (a, b) = (idx[0], idx[1]);
        let pa_over_pb = (logits[a] - logits[b]).exp();
        let mut y = vec![0.0f64; d];
        for ex in 0..e {
            let gate = if ex == a {
                pa_over_pb / (1.0 + pa_over_pb)
            } else if ex == b {
                1.0 / (1.0 + pa_over_pb)
            } else {
                0.0
            };
            for (c_, yc) in y.iter_mut().enumerate() {
                let mut s = 0.0;
                for j in 0..f {
                    let (mut g, mut u) = (0.0f64, 0.0f64);
                    for (i, &xi) in xt.iter().enumerate() {
                        g += xi as f64 * w.w_gate[(ex * d + i) * f + j] as f64;
                        u += xi as f64 * w.w_up[(ex * d + i) * f + j] as f64;
                    }
                    s += g / (1.0 + (-g).exp()) * u * w.w_down[(ex * f + j) * d + c_] as f64;
                }
                *yc += gate * s;
            }
        }
        want.extend(y);
    }
    for v in [ExpertVariant::Grouped, ExpertVariant::Naive] {
        let mut out = vec![f32::NAN; c.tokens * d];
        experts_forward(&c, &w, &x, &r, v, &mut out).unwrap();
        let s = ErrorStats::compare(&out, &want);
        assert!(s.passes(&tolerance(DType::F32)), "{v:?}: {s:?}");
    }
}

#[test]
fn permuting_tokens_permutes_the_output_under_score_drops() {
    let c = cfg(
        90,
        16,
        24,
        8,
        2,
        WeightNorm::Renormalize,
        Capacity::Factor(0.7),
        Priority::Score,
    );
    let w = MoeWeights::random(&c, 1.0, 3);
    let x = normal_f32(&mut rng(4), c.tokens * c.d_model, 1.0);
    let perm: Vec<usize> = (0..c.tokens).map(|i| (i * 37 + 11) % c.tokens).collect();
    let d = c.d_model;
    let xp: Vec<f32> = perm
        .iter()
        .flat_map(|&p| x[p * d..(p + 1) * d].to_vec())
        .collect();
    let (r, rp) = (
        route_reference(&c, &x, &w.router, &w.bias).unwrap(),
        route_reference(&c, &xp, &w.router, &w.bias).unwrap(),
    );
    assert!(
        r.stats(c.experts).dropped > 0,
        "the case must drop something"
    );
    let (mut y, mut yp) = (vec![0.0; c.tokens * d], vec![0.0; c.tokens * d]);
    experts_forward(&c, &w, &x, &r, ExpertVariant::Grouped, &mut y).unwrap();
    experts_forward(&c, &w, &xp, &rp, ExpertVariant::Grouped, &mut yp).unwrap();
    for (i, &p) in perm.iter().enumerate() {
        for j in 0..d {
            assert!(
                (yp[i * d + j] - y[p * d + j]).abs() < 1e-5,
                "token {p} moved to {i}"
            );
        }
    }
    // By token order the same permutation changes which tokens are dropped.
    let c2 = MoeConfig {
        choice: Choice::Tokens {
            top_k: 2,
            policy: Priority::TokenOrder,
        },
        ..c
    };
    let (a, b) = (
        route_reference(&c2, &x, &w.router, &w.bias).unwrap(),
        route_reference(&c2, &xp, &w.router, &w.bias).unwrap(),
    );
    let kept = |r: &Routing, map: &dyn Fn(usize) -> usize| {
        let mut v: Vec<(usize, usize)> = r
            .assignments
            .iter()
            .filter(|a| a.kept)
            .map(|a| (map(a.token), a.expert))
            .collect();
        v.sort();
        v
    };
    assert_ne!(kept(&a, &|t| t), kept(&b, &|t| perm[t]));
}

#[test]
fn edge_cases() {
    let x = |c: &MoeConfig, s| normal_f32(&mut rng(s), c.tokens * c.d_model, 1.0);
    // Every token routed to one expert: a huge bias on expert 3.
    let c = cfg(
        50,
        8,
        12,
        4,
        1,
        WeightNorm::Raw,
        Capacity::Factor(1.0),
        Priority::TokenOrder,
    );
    let mut w = MoeWeights::random(&c, 0.0, 1);
    w.bias = vec![0.0, 0.0, 0.0, 60.0];
    let xs = x(&c, 2);
    let r = route(&c, &xs, &w.router, &w.bias).unwrap();
    let s = r.stats(c.experts);
    assert_eq!(s.routed, vec![0, 0, 0, 50]);
    assert_eq!(s.kept[3], 13); // ceil(50 · 1 · 1.0 / 4)
    assert_eq!(s.top20_share, 1.0);
    assert!((s.imbalance - 4.0).abs() < 1e-12);
    assert!(
        r.assignments
            .iter()
            .filter(|a| a.kept)
            .all(|a| a.token < 13),
        "token order keeps the first"
    );
    check_variants(&c, &w, &xs, &r);
    // Capacity 1.
    let c = cfg(
        20,
        6,
        7,
        5,
        2,
        WeightNorm::Renormalize,
        Capacity::Factor(0.01),
        Priority::Score,
    );
    assert_eq!(c.capacity_slots(), Some(1));
    let w = MoeWeights::random(&c, 0.5, 3);
    let xs = x(&c, 4);
    let r = route(&c, &xs, &w.router, &w.bias).unwrap();
    assert!(r.stats(c.experts).kept.iter().all(|&n| n <= 1));
    check_variants(&c, &w, &xs, &r);
    // More experts than tokens, and k = experts.
    for (tokens, experts, k) in [(3, 64, 2), (9, 5, 5)] {
        let c = cfg(
            tokens,
            5,
            9,
            experts,
            k,
            WeightNorm::Renormalize,
            Capacity::Factor(1.25),
            Priority::Score,
        );
        let w = MoeWeights::random(&c, 1.0, 5);
        let xs = x(&c, 6);
        let r = route(&c, &xs, &w.router, &w.bias).unwrap();
        check_variants(&c, &w, &xs, &r);
    }
    // Dropless with k = experts: every expert for every token.
    let c = cfg(
        9,
        5,
        9,
        5,
        5,
        WeightNorm::Renormalize,
        Capacity::Dropless,
        Priority::Score,
    );
    let w = MoeWeights::random(&c, 1.0, 5);
    let r = route(&c, &x(&c, 6), &w.router, &w.bias).unwrap();
    assert_eq!(r.stats(5).kept, vec![9; 5]);
}

#[test]
fn bad_inputs_are_errors() {
    let c = cfg(
        4,
        3,
        5,
        4,
        2,
        WeightNorm::Raw,
        Capacity::Factor(1.0),
        Priority::Score,
    );
    let w = MoeWeights::random(&c, 0.0, 1);
    let x = vec![0.5f32; 12];
    assert!(route(&c, &x[..11], &w.router, &w.bias)
        .unwrap_err()
        .to_string()
        .contains("x ("));
    assert!(route(&c, &x, &w.router[1..], &w.bias).is_err());
    let r = route(&c, &x, &w.router, &w.bias).unwrap();
    let mut out = vec![0.0; 11];
    assert!(experts_forward(&c, &w, &x, &r, ExpertVariant::Grouped, &mut out).is_err());
    let other = MoeConfig { d_ff: 6, ..c };
    let mut out = vec![0.0; 12];
    let e = experts_forward(&other, &w, &x, &r, ExpertVariant::Naive, &mut out).unwrap_err();
    assert!(e.to_string().contains("W_gate"), "{e}");
    assert!(kernel_moe::parse_capacity("0").is_err());
    assert!(kernel_moe::parse_capacity("-1").is_err());
    assert!(kernel_moe::parse_capacity("dropless").is_ok());
}
