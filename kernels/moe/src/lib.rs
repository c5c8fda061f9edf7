//! Mixture-of-experts layers (Switch Transformer, GShard, Mixtral, DeepSpeed-MoE, Tutel, expert
//! choice): a router with token-choice top-k under capacity — the priority policies
//! `order`, `gshard`, `score` and `reroute`, the weight rules `renormalize`, `raw` and
//! `renormalize_kept`, DeepSpeed's `min_capacity` — or expert choice (each expert its top-c
//! tokens); dispatch of tokens to SwiGLU experts and a weighted combine, on the CPU and as
//! one grouped tensor-core GEMM launch for all experts on CUDA; routing statistics (load per
//! expert, drops, reroutes, unserved tokens, imbalance, the busiest 20%'s share, Switch's
//! balance loss) and a skew knob for the router — for claims C13–C15.
//!
//! A token whose activation holds a NaN or ±Inf is still routed (its probabilities are all
//! NaN; selection ranks by `decision::higher_first`, NaN before every probability and ties to
//! the lower index, so it takes experts 0..k−1, never panics and names experts in range — the
//! CUDA router and capacity kernels rank the same way) and its output is non-finite;
//! with a capacity it may take slots, but every other token's output stays the reference's
//! for the same decisions.

/// CUDA router top-k, capacity, dispatch and combine (`moe.cu`), and the grouped expert FFN.
pub mod cuda;

/// The family's one case list: random layers and the edge cases.
pub mod cases;
/// The layer descriptor: sizes, who chooses, priority policy, weight rule, capacity.
pub mod config;
/// The router's decisions (assignments per token, slots per expert).
pub mod decision;
/// Expert-choice selection (Zhou et al. 2022).
mod expert_choice;
/// Expert computation given the routing: naive per token, grouped per expert.
pub mod forward;
/// The f64 reference of the expert side.
pub mod reference;
/// The router (f32 and f64), the decisions and combine weights.
pub mod routing;
/// Routing statistics.
pub mod stats;
/// Token-choice selection: top-k, capacity under each priority policy, rerouting.
mod token_choice;
/// Random weights and the Zipf-like router skew.
pub mod weights;

pub use config::{Capacity, Choice, MoeConfig, Priority, WeightNorm};
pub use forward::{experts_forward, ExpertVariant};
pub use routing::{route, route_reference, select, Assignment, Routing};
pub use stats::RoutingStats;
pub use weights::MoeWeights;

use kernel_common::variant_table::{bare, unchecked};
use kernel_common::{error::Result, DType, KernelError, Variant, VariantSpec};

/// The moe crate's variant table, its one registry (`--variant NAME`): the expert products,
/// and the CUDA stage kernels that `check --family moe --device cuda` runs one by one (they
/// are not expert products, so they build to an error and list no check specs here).
pub const VARIANTS: &[Variant<ExpertVariant>] = &[
    Variant::cpu(
        "grouped",
        "dispatch tokens per expert, three GEMMs per expert over its tokens (threads over expert chunks), weighted combine",
        |s| {
            s.only(&[])?;
            Ok(ExpertVariant::Grouped)
        },
        |_, _| bare(["grouped"]),
    ),
    Variant::cpu(
        "naive",
        "per token, per kept assignment: three matrix-vector products (threads over tokens)",
        |s| {
            s.only(&[])?;
            Ok(ExpertVariant::Naive)
        },
        |_, _| bare(["naive"]),
    ),
    Variant::cuda(
        "cuda_grouped",
        "the experts on CUDA: grouped tensor-core GEMMs (m16n8k16, f32 accumulation) over each expert's dispatched tokens, one launch per stage for all experts; dtype=bf16 (default) | f16 storage; any routing (decided by the CPU router)",
        cuda_grouped,
        unchecked,
    ),
    Variant::cuda(
        "cuda_router",
        "CUDA router: logits, softmax, top-k and weights per token (check rows cuda_router, cuda_topk, cuda_weights); with the three below, run stage by stage by check --family moe --device cuda",
        stage,
        unchecked,
    ),
    Variant::cuda(
        "cuda_capacity",
        "CUDA capacity: each assignment's slot in its expert's queue, or dropped (-1) past the capacity",
        stage,
        unchecked,
    ),
    Variant::cuda(
        "cuda_dispatch",
        "CUDA dispatch: token rows into their experts' slots [experts, slots, d_model]",
        stage,
        unchecked,
    ),
    Variant::cuda(
        "cuda_combine",
        "CUDA combine: out[t] = sum over kept assignments of weight x the expert's output row",
        stage,
        unchecked,
    ),
];

/// The variant for `spec`, or None when no row of `VARIANTS` has its name.
pub fn variant_from_spec(spec: &VariantSpec) -> Result<Option<ExpertVariant>> {
    kernel_common::build_from(&[VARIANTS], spec)
}

fn cuda_grouped(spec: &VariantSpec) -> Result<ExpertVariant> {
    spec.only(&["dtype"])?;
    let dtype = match spec.params.get("dtype") {
        None => DType::BF16,
        Some(name) => DType::parse(name)?,
    };
    cuda::experts::check_storage(dtype)?;
    Ok(ExpertVariant::CudaGrouped(dtype))
}

/// The CUDA stage kernels are run stage by stage by the check, not as expert products.
fn stage(spec: &VariantSpec) -> Result<ExpertVariant> {
    Err(KernelError::Unsupported(format!(
        "{} is a CUDA stage kernel that check --family moe --device cuda runs on its own, not an expert product (grouped, naive, cuda_grouped)",
        spec.name
    )))
}

/// Parses a capacity: `dropless` or a factor > 0 (`1.25`).
pub fn parse_capacity(text: &str) -> Result<Capacity> {
    if text == "dropless" {
        return Ok(Capacity::Dropless);
    }
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(Capacity::Factor(f)),
        _ => Err(KernelError::Unsupported(format!(
            "capacity '{text}' is not dropless or a factor > 0"
        ))),
    }
}

/// The whole layer: route (f32 router), then the experts; returns the routing used.
pub fn moe_forward(
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    variant: ExpertVariant,
    out: &mut [f32],
) -> Result<Routing> {
    w.check(cfg)?;
    let routing = route(cfg, x, &w.router, &w.bias)?;
    experts_forward(cfg, w, x, &routing, variant, out)?;
    Ok(routing)
}
