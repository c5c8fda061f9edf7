//! The moe family: routing in the conventions of the systems users upstream to — token choice
//! (GShard/Switch capacity factors with DeepSpeed's `min_capacity`, dropless as in
//! MegaBlocks; token-order, rank-major (GShard/DeepSpeed/Tutel), score and rerouting
//! priorities; Mixtral's, Switch's and DeepSpeed's weights) and expert choice (Zhou et al.) —
//! and the experts grouped per expert (three GEMMs each), per token, or as grouped
//! tensor-core GEMMs on CUDA; the CUDA router, capacity, dispatch and combine kernels are
//! checked stage by stage.

use crate::checking::Ctx;
use crate::error::Result;
use crate::family::{listed, ExpFamily, Family, ReplayFamily, VariantInfo};

/// `harness check --family moe` (CPU).
pub mod check;
/// `harness check --family moe --device cuda`: `cuda_grouped` and the CUDA stages.
pub mod check_cuda;
/// The experiment row's columns.
pub mod cols;
/// `harness exp` for moe specs.
pub mod exp;
/// The experiment grid: layers and the routing conventions at each.
pub mod grid;
/// `harness replay` of moe case files.
pub mod replay;
/// The experiment's tables.
pub mod report;

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
    cuda: &[kernel_moe::cuda::SOURCE, kernel_moe::cuda::experts::SOURCE],
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
    listed("moe", kernel_moe::VARIANTS)
}

/// Grid keys a moe experiment understands.
pub const GRID_KEYS: &[(&str, &str)] = &[
    (
        "capacity",
        "capacity factor > 0 (token choice: slots = ceil(tokens·k·factor/experts); expert choice: floor(tokens·factor/experts)) | dropless",
    ),
    (
        "min_capacity",
        "floor on slots per expert, >= 0 (DeepSpeed's min_capacity; default 1)",
    ),
    (
        "skew",
        "router skew s >= 0: bias -s·ln(rank+1) per expert (0 = none)",
    ),
    ("top_k", "experts per token, 1..=experts (token choice)"),
    ("experts", "number of experts"),
    ("tokens", "tokens per call"),
    ("d_model", "model width"),
    ("d_ff", "expert hidden width (SwiGLU)"),
    (
        "policy",
        "order (token-major) | gshard (rank-major: GShard, DeepSpeed top2gating, Tutel) | score (highest router probability) | reroute (gshard, then overflow to the next-best expert with room); token choice",
    ),
    (
        "norm",
        "renormalize (over the top-k, Mixtral) | raw (Switch) | renormalize_kept (over the choices kept, DeepSpeed); expert choice takes raw and renormalize_kept",
    ),
    (
        "routing",
        "token_choice | expert_choice (each expert takes its top-c tokens, Zhou et al. 2022; no top_k, no policy)",
    ),
];
