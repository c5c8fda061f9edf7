//! `harness check --family moe --device cuda`: on `check.rs`'s cases, `cuda_grouped` (the
//! experts as grouped tensor-core GEMMs, per f16/bf16 dtype) against the f64 experts of the
//! same decisions with x, the weights and the hidden activation h rounded as the variant
//! rounds them (h is stored in the dtype between its two GEMMs); then the routing
//! kernels `cuda_router`, `cuda_capacity`, `cuda_dispatch` and `cuda_combine` stage by stage
//! on the token-choice cases whose policy the capacity kernel implements — router
//! probabilities against f64, then each later stage exactly against the CPU stage fed the
//! same inputs.

use crate::checking::Ctx;
use crate::error::Result;
use kernel_common::inputs::{derive_seed, normal_buffer_par};
use kernel_common::{tolerance, Buffer, DType, ErrorStats};
use kernel_moe::cases::{cases, Case};
use kernel_moe::cuda::{
    capacity_cuda, combine_cuda, dispatch_cuda, route_cuda, slots_per_expert, DeviceRouting,
};
use kernel_moe::reference::experts_reference_stored;
use kernel_moe::{
    experts_forward, route, route_reference, routing::select, Capacity, ExpertVariant, MoeConfig,
    MoeWeights, WeightNorm,
};

/// An exact comparison as error statistics: 0 when equal, ∞ otherwise.
fn exact(ok: bool, count: usize) -> ErrorStats {
    let e = if ok { 0.0 } else { f64::INFINITY };
    ErrorStats {
        max_abs: e,
        rel_l2: e,
        nmse: e,
        non_finite: 0,
        count,
    }
}

/// One case of the check with its inputs.
struct Inputs<'a> {
    i: usize,
    case: &'a Case,
    seed: u64,
    w: MoeWeights,
    x: Vec<f32>,
}

/// `cuda_grouped` per dtype, then the routing kernels, on the moe check's cases.
pub fn check_moe_cuda(ctx: &mut Ctx) -> Result<()> {
    for (i, case) in cases(ctx.opts.cases, ctx.opts.seed).iter().enumerate() {
        let seed = derive_seed(ctx.opts.seed ^ 0x30E, i as u64);
        let (w, x) = case.inputs(seed);
        let inputs = Inputs {
            i,
            case,
            seed,
            w,
            x,
        };
        check_grouped(ctx, &inputs)?;
        check_stages(ctx, &inputs)?;
    }
    Ok(())
}

/// `cuda_grouped` on the CPU router's decisions, for every dtype asked (f32 is refused).
fn check_grouped(ctx: &mut Ctx, inputs: &Inputs) -> Result<()> {
    let Inputs {
        i,
        case,
        seed,
        w,
        x,
    } = inputs;
    let (i, seed, c) = (*i, *seed, &case.cfg);
    let routing = route(c, x, &w.router, &w.bias)?;
    let all: Vec<usize> = (0..c.tokens).collect();
    for &dtype in &ctx.opts.dtypes.clone() {
        let xr = Buffer::from_f32(dtype, x).to_f32();
        let want = experts_reference_stored(c, &w.rounded(dtype), &xr, &routing, &all, dtype);
        let mut out = vec![f32::NAN; x.len()];
        let variant = ExpertVariant::CudaGrouped(dtype);
        let outcome = experts_forward(c, w, x, &routing, variant, &mut out)
            .map(|_| ErrorStats::compare(&out, &want))
            .map_err(|e| e.to_string());
        let tol = tolerance(dtype).scaled_to(&want);
        ctx.record_with(
            "moe",
            i,
            "cuda_grouped",
            dtype,
            tol,
            case.label(),
            seed,
            outcome,
        )?;
    }
    Ok(())
}

/// The router, capacity, dispatch and combine kernels stage by stage.
fn check_stages(ctx: &mut Ctx, inputs: &Inputs) -> Result<()> {
    let Inputs {
        i,
        case,
        seed,
        w,
        x,
    } = inputs;
    let (i, seed, c) = (*i, *seed, &case.cfg);
    let label = case.label();
    let record = |ctx: &mut Ctx, name: &str, dtype, tol, outcome| {
        ctx.record_with("moe", i, name, dtype, tol, label.clone(), seed, outcome)
    };
    let routed = match route_cuda(c, x, &w.router, &w.bias) {
        Ok(r) => r,
        Err(e) => {
            let why = Err(e.to_string());
            return record(ctx, "cuda_router", DType::F32, tolerance(DType::F32), why);
        }
    };
    let want = route_reference(c, x, &w.router, &w.bias)?;
    let probs = ErrorStats::compare(&routed.probs, &want.probs);
    record(
        ctx,
        "cuda_router",
        DType::F32,
        tolerance(DType::F32),
        Ok(probs),
    )?;
    // Decisions from the kernel's own probabilities: the CPU selection on the same values
    // must choose the same experts (the router's choices, before any reroute), weights and
    // kept assignments. The kernel's weights are those before capacity: the CPU's without a
    // capacity limit (renormalize_kept renormalises on the host, over the kept choices).
    let decided = select(c, routed.probs.iter().map(|&p| p as f64).collect());
    let before_capacity = MoeConfig {
        norm: match c.norm {
            WeightNorm::Raw => WeightNorm::Raw,
            _ => WeightNorm::Renormalize,
        },
        capacity: Capacity::Dropless,
        ..*c
    };
    let weighted = select(
        &before_capacity,
        routed.probs.iter().map(|&p| p as f64).collect(),
    );
    let same_experts = decided
        .assignments
        .iter()
        .zip(&routed.experts)
        .all(|(a, &e)| a.chosen as i32 == e);
    let n = routed.experts.len();
    record(
        ctx,
        "cuda_topk",
        DType::F32,
        tolerance(DType::F32),
        Ok(exact(same_experts, n)),
    )?;
    let weights: Vec<f64> = weighted.assignments.iter().map(|a| a.weight).collect();
    let wstats = ErrorStats::compare(&routed.weights, &weights);
    record(
        ctx,
        "cuda_weights",
        DType::F32,
        tolerance(DType::F32),
        Ok(wstats),
    )?;
    let positions = capacity_cuda(c, &routed.experts, &routed.gate_probs);
    let positions = match positions {
        Ok(p) => p,
        Err(e) => {
            return record(
                ctx,
                "cuda_capacity",
                DType::F32,
                tolerance(DType::F32),
                Err(e.to_string()),
            );
        }
    };
    let ok = same_experts && capacity_agrees(c, &routed, &positions, &decided.assignments);
    record(
        ctx,
        "cuda_capacity",
        DType::F32,
        tolerance(DType::F32),
        Ok(exact(ok, n)),
    )?;
    for &dtype in &ctx.opts.dtypes.clone() {
        let xb = Buffer::from_f32(dtype, x);
        let outcome = dispatch_cuda(c, &xb, &routed.experts, &positions)
            .map(|slots| {
                Ok(exact(
                    dispatch_agrees(c, &xb, &routed, &positions, &slots),
                    n,
                ))
            })
            .unwrap_or_else(|e| Err(e.to_string()));
        record(ctx, "cuda_dispatch", dtype, tolerance(dtype), outcome)?;
        let slots = slots_per_expert(c);
        let y = normal_buffer_par(seed ^ 2, dtype, c.experts * slots * c.d_model);
        let want = combine_reference(c, &y, &routed, &positions);
        let tol = tolerance(dtype).scaled_to(&want);
        let outcome = combine_cuda(c, &y, &routed.experts, &positions, &routed.weights)
            .map(|out| ErrorStats::compare(&out.to_f32(), &want))
            .map_err(|e| e.to_string());
        record(ctx, "cuda_combine", dtype, tol, outcome)?;
    }
    Ok(())
}

/// Kept by the kernel exactly when kept by the CPU, and each expert's kept positions are
/// 0..kept (a permutation).
fn capacity_agrees(
    c: &MoeConfig,
    routed: &DeviceRouting,
    positions: &[i32],
    cpu: &[kernel_moe::routing::Assignment],
) -> bool {
    let mut seen = vec![vec![]; c.experts];
    for ((a, &p), &e) in cpu.iter().zip(positions).zip(&routed.experts) {
        if a.kept != (p >= 0) {
            return false;
        }
        if p >= 0 {
            seen[e as usize].push(p as usize);
        }
    }
    seen.iter_mut().all(|v| {
        v.sort_unstable();
        v.iter().enumerate().all(|(i, &p)| i == p)
    })
}

/// Every kept assignment's slot holds its token's row bit for bit; every other slot is NaN.
fn dispatch_agrees(
    c: &MoeConfig,
    x: &Buffer,
    routed: &DeviceRouting,
    positions: &[i32],
    out: &Buffer,
) -> bool {
    let (d, slots, k) = (
        c.d_model,
        slots_per_expert(c),
        routed.experts.len() / c.tokens,
    );
    let (x, out) = (x.to_f32(), out.to_f32());
    let mut filled = vec![false; c.experts * slots];
    for (a, (&e, &p)) in routed.experts.iter().zip(positions).enumerate() {
        if p < 0 {
            continue;
        }
        let slot = e as usize * slots + p as usize;
        filled[slot] = true;
        let t = a / k;
        let same = out[slot * d..(slot + 1) * d]
            .iter()
            .zip(&x[t * d..(t + 1) * d])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        if !same {
            return false;
        }
    }
    filled
        .iter()
        .enumerate()
        .all(|(s, &f)| f || out[s * d..(s + 1) * d].iter().all(|v| v.is_nan()))
}

/// f64 combine of `y` with the kernel's decisions and weights.
fn combine_reference(
    c: &MoeConfig,
    y: &Buffer,
    routed: &DeviceRouting,
    positions: &[i32],
) -> Vec<f64> {
    let (d, slots, k) = (
        c.d_model,
        slots_per_expert(c),
        routed.experts.len() / c.tokens,
    );
    let y = y.to_f32();
    let mut out = vec![0.0f64; c.tokens * d];
    for (a, (&e, &p)) in routed.experts.iter().zip(positions).enumerate() {
        if p < 0 {
            continue;
        }
        let (t, wgt) = (a / k, routed.weights[a] as f64);
        let row = (e as usize * slots + p as usize) * d;
        for (o, v) in out[t * d..(t + 1) * d].iter_mut().zip(&y[row..row + d]) {
            *o += wgt * *v as f64;
        }
    }
    out
}
