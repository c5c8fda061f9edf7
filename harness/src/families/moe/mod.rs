//! The moe family: top-k gating with capacity (GShard/Switch capacity factors, dropless as in
//! MegaBlocks), Mixtral's renormalised or Switch's raw weights, score- or order-based drops,
//! and the experts grouped per expert (three GEMMs each) or per token; the CUDA router,
//! capacity, dispatch and combine kernels are checked stage by stage.

use crate::checking::Ctx;
use crate::error::Result;
use crate::family::{listed, ExpFamily, Family, ReplayFamily, VariantInfo};

/// `harness check --family moe` (CPU).
pub mod check;
/// `harness check --family moe --device cuda`: the CUDA stages.
pub mod check_cuda;
/// `harness exp` for moe specs, and its tables.
pub mod exp;
/// `harness replay` of moe case files.
pub mod replay;

pub const FAMILY: Family = Family {
    name: "moe",
    about: "mixture-of-experts routing with capacity, and the experts",
    variants,
    check: Some(check),
    exp: Some(ExpFamily {
        grid_keys: GRID_KEYS,
        variant: |v| crate::registry::moe_variant(v).map(|_| ()),
        run: exp::run,
        render: exp::render,
        peers: false,
    }),
    replay: Some(ReplayFamily {
        needs: "x [T, D], router [D, E], w_gate and w_up [E, D, F], w_down [E, F, D] (f32), optionally router_bias [E] and out",
        prepare: replay::prepare,
    }),
};

/// The CPU router and expert variants, or under `--device cuda` the CUDA stages.
fn check(ctx: &mut Ctx) -> Result<()> {
    if matches!(ctx.opts.device, kernel_common::Device::Cuda(_)) {
        check_cuda::check_moe_cuda(ctx)
    } else {
        check::check_cpu(ctx)
    }
}

fn variants() -> Vec<VariantInfo> {
    listed("moe", moe_kernels::VARIANTS)
}

/// Grid keys a moe experiment understands.
pub const GRID_KEYS: &[(&str, &str)] = &[
    (
        "capacity",
        "capacity factor > 0 (slots = ceil(tokens·k·factor/experts)) | dropless",
    ),
    (
        "skew",
        "router skew s >= 0: bias -s·ln(rank+1) per expert (0 = none)",
    ),
    ("top_k", "experts per token, 1..=experts"),
    ("experts", "number of experts"),
    ("tokens", "tokens per call"),
    ("d_model", "model width"),
    ("d_ff", "expert hidden width (SwiGLU)"),
    (
        "policy",
        "score (keep the highest router scores) | order (keep the first tokens)",
    ),
    ("norm", "renormalize (Mixtral) | raw (Switch)"),
];
