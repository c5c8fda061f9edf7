//! `harness check --family moe`: random layers (1..=4096 tokens, 2..64 experts, k 1..4, odd
//! widths, every capacity factor regime, both drop policies and weight rules, router skew) and
//! the edge cases (every token on one expert, capacity 1, more experts than tokens,
//! k = experts): the f32 router's probabilities against the f64 router's (`router` rows), then
//! each expert variant on NaN-poisoned output against the f64 reference of the same routing.

use crate::checking::Ctx;
use crate::error::Result;
use kernel_common::inputs::{derive_seed, normal_f32, rng};
use kernel_common::{tolerance, DType, ErrorStats};
use moe_kernels::reference::experts_reference;
use moe_kernels::{
    experts_forward, route, route_reference, Capacity, DropPolicy, ExpertVariant, MoeConfig,
    MoeWeights, WeightNorm,
};
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

pub fn cases(n: usize, seed: u64) -> Vec<Case> {
    let mut r = rng(seed ^ 0x30E);
    let mut out = vec![];
    for _ in 0..n {
        let experts = r.gen_range(2..=64);
        // Tokens log-uniform over 1..=4096; widths shrink as tokens grow so the f64 reference
        // stays quick.
        let tokens = 1usize << r.gen_range(0..=12);
        let tokens = r.gen_range(tokens..=(2 * tokens).min(4096));
        let wide = tokens <= 512;
        let cfg = MoeConfig {
            tokens,
            d_model: r.gen_range(1..=if wide { 96 } else { 24 }),
            d_ff: r.gen_range(1..=if wide { 160 } else { 40 }),
            experts,
            top_k: r.gen_range(1..=4usize).min(experts),
            norm: if r.gen_bool(0.5) {
                WeightNorm::Renormalize
            } else {
                WeightNorm::Raw
            },
            capacity: if r.gen_bool(0.2) {
                Capacity::Dropless
            } else {
                Capacity::Factor(r.gen_range(0.1..2.5))
            },
            policy: if r.gen_bool(0.5) {
                DropPolicy::Score
            } else {
                DropPolicy::TokenOrder
            },
        };
        out.push(Case {
            cfg,
            skew: r.gen_range(0.0..2.0),
            hot_expert: None,
        });
    }
    let base = MoeConfig {
        tokens: 97,
        d_model: 54,
        d_ff: 77,
        experts: 8,
        top_k: 2,
        norm: WeightNorm::Renormalize,
        capacity: Capacity::Factor(1.2),
        policy: DropPolicy::Score,
    };
    out.extend([
        Case {
            cfg: MoeConfig { top_k: 1, ..base },
            skew: 0.0,
            hot_expert: Some(5),
        },
        Case {
            cfg: MoeConfig {
                capacity: Capacity::Factor(0.01),
                ..base
            },
            skew: 0.5,
            hot_expert: None,
        },
        Case {
            cfg: MoeConfig {
                tokens: 3,
                experts: 64,
                ..base
            },
            skew: 1.0,
            hot_expert: None,
        },
        Case {
            cfg: MoeConfig {
                top_k: 8,
                capacity: Capacity::Dropless,
                ..base
            },
            skew: 1.5,
            hot_expert: None,
        },
    ]);
    out
}

/// Runs the moe cases; rows go through `ctx` like every family's.
pub fn check_cpu(ctx: &mut Ctx) -> Result<()> {
    for (i, case) in cases(ctx.opts.cases, ctx.opts.seed).iter().enumerate() {
        let c = &case.cfg;
        let seed = derive_seed(ctx.opts.seed ^ 0x30E, i as u64);
        let (w, x) = case.inputs(seed);
        let label = case.label();
        let routing = route(c, &x, &w.router, &w.bias)?;
        let exact = route_reference(c, &x, &w.router, &w.bias)?;
        let probs: Vec<f32> = routing.probs.iter().map(|&p| p as f32).collect();
        ctx.record_with(
            "moe",
            i,
            "router",
            DType::F32,
            tolerance(DType::F32),
            label.clone(),
            seed,
            Ok(ErrorStats::compare(&probs, &exact.probs)),
        )?;
        let all: Vec<usize> = (0..c.tokens).collect();
        let want = experts_reference(c, &w, &x, &routing, &all);
        let tol = tolerance(DType::F32).scaled_to(&want);
        for (name, v) in [
            ("grouped", ExpertVariant::Grouped),
            ("naive", ExpertVariant::Naive),
        ] {
            let mut out = vec![f32::NAN; c.tokens * c.d_model];
            let outcome = experts_forward(c, &w, &x, &routing, v, &mut out)
                .map(|_| ErrorStats::compare(&out, &want))
                .map_err(|e| e.to_string());
            ctx.record_with(
                "moe",
                i,
                name,
                DType::F32,
                tol,
                label.clone(),
                seed,
                outcome,
            )?;
        }
    }
    Ok(())
}
