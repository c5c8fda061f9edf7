//! The moe family's one case list, shared by `harness check --family moe` (CPU and CUDA) and
//! the conformance suite: random layers (1..=4096 tokens, 2..64 experts, k 1..4, odd widths,
//! every capacity factor regime and `min_capacity` floor, token choice under every priority
//! policy and weight rule, expert choice, router skew) and the edge cases (every token on one
//! expert — dropped, rerouted, or left to expert choice —, capacity 1, more experts than
//! tokens, k = experts).

use crate::{Capacity, Choice, MoeConfig, MoeWeights, Priority, WeightNorm};
use kernel_common::inputs::{normal_f32, rng};
use rand::Rng;

/// A case: the layer, its router skew, and an optional bias override (one hot expert).
pub struct Case {
    pub cfg: MoeConfig,
    pub skew: f64,
    pub hot_expert: Option<usize>,
}

impl Case {
    /// The layer's weights (the hot-expert override applied) and its input.
    pub fn inputs(&self, seed: u64) -> (MoeWeights, Vec<f32>) {
        let c = &self.cfg;
        let mut w = MoeWeights::random(c, self.skew, seed);
        if let Some(hot) = self.hot_expert {
            w.bias.iter_mut().for_each(|b| *b = 0.0);
            w.bias[hot] = 80.0;
        }
        let x = normal_f32(&mut rng(seed ^ 1), c.tokens * c.d_model, 1.0);
        (w, x)
    }

    /// Label for tables.
    pub fn label(&self) -> String {
        format!("{} s{:.2}", self.cfg.label(), self.skew)
    }
}

/// A random layer: token choice (80%) under a random policy and weight rule, or expert
/// choice; a random capacity regime and, one time in four, a `min_capacity` floor of 0..=8.
fn random_layer(r: &mut impl Rng) -> MoeConfig {
    let experts = r.gen_range(2..=64);
    // Tokens log-uniform over 1..=4096; widths shrink as tokens grow so the f64 reference
    // stays quick.
    let tokens = 1usize << r.gen_range(0..=12);
    let tokens = r.gen_range(tokens..=(2 * tokens).min(4096));
    let wide = tokens <= 512;
    let expert_choice = r.gen_bool(0.2);
    let choice = if expert_choice {
        Choice::Experts
    } else {
        Choice::Tokens {
            top_k: r.gen_range(1..=4usize).min(experts),
            policy: Priority::ALL[r.gen_range(0..Priority::ALL.len())],
        }
    };
    let norm = if expert_choice {
        [WeightNorm::Raw, WeightNorm::RenormalizeKept][r.gen_range(0..2)]
    } else {
        WeightNorm::ALL[r.gen_range(0..WeightNorm::ALL.len())]
    };
    let mut cfg = MoeConfig {
        tokens,
        d_model: r.gen_range(1..=if wide { 96 } else { 24 }),
        d_ff: r.gen_range(1..=if wide { 160 } else { 40 }),
        experts,
        choice,
        norm,
        capacity: if r.gen_bool(0.2) {
            Capacity::Dropless
        } else {
            Capacity::Factor(r.gen_range(0.1..2.5))
        },
        min_capacity: if r.gen_bool(0.25) {
            r.gen_range(0..=8)
        } else {
            1
        },
    };
    // Expert choice truncates: keep at least one slot.
    if cfg.capacity_slots() == Some(0) {
        cfg.min_capacity = 1;
    }
    cfg
}

pub fn cases(n: usize, seed: u64) -> Vec<Case> {
    let mut r = rng(seed ^ 0x30E);
    let mut out: Vec<Case> = (0..n)
        .map(|_| Case {
            cfg: random_layer(&mut r),
            skew: r.gen_range(0.0..2.0),
            hot_expert: None,
        })
        .collect();
    let base = MoeConfig::token_choice(
        97,
        54,
        77,
        8,
        2,
        Priority::Score,
        WeightNorm::Renormalize,
        Capacity::Factor(1.2),
    );
    let tokens = |top_k, policy| Choice::Tokens { top_k, policy };
    let case = |cfg, skew, hot_expert| Case {
        cfg,
        skew,
        hot_expert,
    };
    out.extend([
        case(
            MoeConfig {
                choice: tokens(1, Priority::Score),
                ..base
            },
            0.0,
            Some(5),
        ),
        // Every token's first choice on one expert (30 slots for 97): reroute moves the rest
        // to their next experts; DeepSpeed's weights give a lone survivor weight 1.
        case(
            MoeConfig {
                choice: tokens(2, Priority::Reroute),
                norm: WeightNorm::RenormalizeKept,
                ..base
            },
            0.0,
            Some(5),
        ),
        case(
            MoeConfig {
                choice: tokens(2, Priority::RankMajor),
                norm: WeightNorm::RenormalizeKept,
                min_capacity: 16,
                ..base
            },
            0.0,
            Some(5),
        ),
        // Expert choice with one hot expert: every expert still takes its c tokens.
        case(
            MoeConfig {
                choice: Choice::Experts,
                norm: WeightNorm::Raw,
                ..base
            },
            0.0,
            Some(5),
        ),
        case(
            MoeConfig {
                capacity: Capacity::Factor(0.01),
                ..base
            },
            0.5,
            None,
        ),
        case(
            MoeConfig {
                tokens: 3,
                experts: 64,
                ..base
            },
            1.0,
            None,
        ),
        case(
            MoeConfig {
                choice: tokens(8, Priority::Score),
                capacity: Capacity::Dropless,
                ..base
            },
            1.5,
            None,
        ),
    ]);
    out
}
