//! `harness check --family moe`: `kernel_moe::cases` — random layers (1..=4096 tokens, 2..64 experts, k 1..4, odd
//! widths, every capacity factor regime and `min_capacity` floor, token choice under every
//! priority policy and weight rule, expert choice, router skew) and the edge cases (every
//! token on one expert — dropped, rerouted, or left to expert choice —, capacity 1, more
//! experts than tokens, k = experts): the f32 router's probabilities against the f64
//! router's (`router` rows), then each expert variant on NaN-poisoned output against the f64
//! reference of the same routing.

use crate::checking::Ctx;
use crate::error::Result;
use kernel_common::inputs::derive_seed;
use kernel_common::{tolerance, DType, ErrorStats};
use kernel_moe::cases::cases;
use kernel_moe::reference::experts_reference;
use kernel_moe::{experts_forward, route, route_reference};

/// Runs the moe cases; rows go through `ctx` like every family's.
pub fn check_cpu(ctx: &mut Ctx) -> Result<()> {
    // The CPU rows of the moe table, as their check specs (the CUDA stage kernels are
    // `check_cuda`'s).
    let variants =
        crate::registry::case_free_variants("moe", &[kernel_moe::VARIANTS], ctx.opts.device)?;
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
        for (name, v) in &variants {
            let (name, v) = (name.as_str(), *v);
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
