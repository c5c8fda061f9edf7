//! CUDA MoE routing and data movement: router (logits, softmax, top-k, weights), capacity
//! positions, dispatch of token rows into expert slots and the weighted combine, compiled
//! from `moe.cu`. Each call uploads, runs and downloads: the check compares every stage with
//! the CPU on the same inputs. The expert FFN itself is `experts` (`cuda_grouped`).

/// The expert FFN as grouped tensor-core GEMMs (`experts.cu`, `cuda_grouped`).
pub mod experts;

use crate::config::{MoeConfig, Priority, WeightNorm};
use kernel_common::error::Result;
use kernel_common::{Buffer, KernelError};
use kernel_cuda::buffer::{f32_bytes, f32_from_bytes, i32_bytes, i32_from_bytes};
use kernel_cuda::cuda_launch;
use kernel_cuda::cudarc::driver::CudaSlice;
use kernel_cuda::{
    blocks_for, dtype_suffix, int_arg, CudaRuntime, DeviceBuffer, KernelSource, Launch,
};

/// `moe.cu` with its entry points.
pub const SOURCE: KernelSource = kernel_cuda::cuda_source!(
    "moe",
    "moe.cu",
    &[
        "moe_route_f32",
        "moe_capacity_f32",
        "moe_dispatch_f32",
        "moe_combine_f32",
        "moe_dispatch_f16",
        "moe_combine_f16",
        "moe_dispatch_bf16",
        "moe_combine_bf16",
    ]
);

/// Most experts the router kernel takes (`MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 256;
/// Most experts per token (one lane writes each weight).
pub const MAX_TOP_K: usize = 32;
/// Tokens per router block (one warp each).
const ROUTE_WARPS: usize = 4;
/// Assignments per capacity block.
const CAPACITY_THREADS: usize = 256;

/// Experts per token of a token-choice layer, or why the CUDA routing kernels refuse it.
fn token_choice_k(cfg: &MoeConfig) -> Result<usize> {
    cfg.validate()?;
    cfg.top_k().ok_or_else(|| {
        KernelError::Unsupported(
            "the CUDA router and capacity kernels are token choice; expert choice routes on \
             the host (cuda_grouped runs its experts)"
                .into(),
        )
    })
}

/// The router's launch, or why the config does not fit the kernel.
pub fn plan_route(cfg: &MoeConfig) -> Result<Launch> {
    let k = token_choice_k(cfg)?;
    if cfg.experts > MAX_EXPERTS || k > MAX_TOP_K {
        return Err(KernelError::Unsupported(format!(
            "the CUDA router takes ≤ {MAX_EXPERTS} experts and top_k ≤ {MAX_TOP_K}, got {} and {k}",
            cfg.experts
        )));
    }
    Launch::new(
        (blocks_for(cfg.tokens, ROUTE_WARPS), 1, 1),
        32 * ROUTE_WARPS,
        0,
    )
}

/// Slots per expert on the device: the capacity, or (dropless) every token.
pub fn slots_per_expert(cfg: &MoeConfig) -> usize {
    cfg.capacity_slots().unwrap_or(cfg.tokens)
}

/// What the router kernel returns.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceRouting {
    /// Softmax probabilities `[tokens, experts]`.
    pub probs: Vec<f32>,
    /// Chosen experts `[tokens, top_k]`, best first.
    pub experts: Vec<i32>,
    /// Their probabilities.
    pub gate_probs: Vec<f32>,
    /// Combine weights.
    pub weights: Vec<f32>,
}

/// The router on the device: x `[tokens, d_model]`, gate `[d_model, experts]`, bias `[experts]`.
/// Its weights are those before capacity: raw, or renormalised over the top-k (for
/// `renormalize` and `renormalize_kept`; the latter's renormalisation over the kept choices
/// needs the capacity decisions and is the host's).
pub fn route_cuda(cfg: &MoeConfig, x: &[f32], gate: &[f32], bias: &[f32]) -> Result<DeviceRouting> {
    let launch = plan_route(cfg)?;
    let (t, d, e, k) = (cfg.tokens, cfg.d_model, cfg.experts, token_choice_k(cfg)?);
    if x.len() != t * d || gate.len() != d * e || bias.len() != e {
        return Err(KernelError::BadBuffer(format!(
            "router inputs: x {} (want {}), gate {} (want {}), bias {} (want {e})",
            x.len(),
            t * d,
            gate.len(),
            d * e,
            bias.len()
        )));
    }
    let rt = CudaRuntime::current()?;
    let f = rt.function(&SOURCE, "moe_route_f32")?;
    let (xd, gd, bd) = (
        rt.upload(&f32_bytes(x))?,
        rt.upload(&f32_bytes(gate))?,
        rt.upload(&f32_bytes(bias))?,
    );
    let nan = |n: usize| rt.upload(&f32_bytes(&vec![f32::NAN; n]));
    let (mut probs, mut gp, mut w) = (nan(t * e)?, nan(t * k)?, nan(t * k)?);
    let mut ex = rt.upload(&i32_bytes(&vec![-1; t * k]))?;
    let renorm = (cfg.norm != WeightNorm::Raw) as i32;
    let (ti, di, ei, ki) = (
        int_arg("tokens", t)?,
        int_arg("d_model", d)?,
        int_arg("experts", e)?,
        int_arg("top_k", k)?,
    );
    cuda_launch!(
        rt, f, launch, &xd, &gd, &bd, &mut probs, &mut ex, &mut gp, &mut w, &ti, &di, &ei, &ki,
        &renorm
    )?;
    rt.sync()?;
    Ok(DeviceRouting {
        probs: f32_from_bytes(&rt.download(&probs)?),
        experts: i32_from_bytes(&rt.download(&ex)?),
        gate_probs: f32_from_bytes(&rt.download(&gp)?),
        weights: f32_from_bytes(&rt.download(&w)?),
    })
}

/// The capacity kernel's policy code: 0 token order, 1 score, 2 rank-major (`gshard`).
pub fn capacity_policy_code(policy: Priority) -> Result<i32> {
    match policy {
        Priority::TokenOrder => Ok(0),
        Priority::Score => Ok(1),
        Priority::RankMajor => Ok(2),
        Priority::Reroute => Err(KernelError::Unsupported(
            "the CUDA capacity kernel keeps by order, score or gshard; reroute's second-chance \
             rounds run on the host"
                .into(),
        )),
    }
}

/// Capacity positions on the device: for each assignment (token·k + rank) its slot in its
/// expert's queue, or −1 when dropped.
pub fn capacity_cuda(cfg: &MoeConfig, experts: &[i32], gate_probs: &[f32]) -> Result<Vec<i32>> {
    let k = token_choice_k(cfg)?;
    let policy = capacity_policy_code(cfg.policy().expect("token choice has a policy"))?;
    let n = cfg.tokens * k;
    if experts.len() != n || gate_probs.len() != n {
        return Err(KernelError::BadBuffer(format!(
            "capacity inputs need tokens·top_k = {n} assignments"
        )));
    }
    if let Some((a, e)) = experts
        .iter()
        .enumerate()
        .find(|(_, &e)| e < 0 || e as usize >= cfg.experts)
    {
        return Err(KernelError::BadBuffer(format!(
            "assignment {a}: expert {e} is outside 0..{}",
            cfg.experts
        )));
    }
    let launch = Launch::new((blocks_for(n, CAPACITY_THREADS), 1, 1), CAPACITY_THREADS, 0)?;
    let rt = CudaRuntime::current()?;
    let f = rt.function(&SOURCE, "moe_capacity_f32")?;
    let (ed, pd) = (
        rt.upload(&i32_bytes(experts))?,
        rt.upload(&f32_bytes(gate_probs))?,
    );
    let mut pos = rt.upload(&i32_bytes(&vec![i32::MIN; n]))?;
    let (ni, ki, cap) = (
        int_arg("assignments", n)?,
        int_arg("top_k", k)?,
        int_arg("capacity", slots_per_expert(cfg))?,
    );
    cuda_launch!(rt, f, launch, &ed, &pd, &mut pos, &ni, &ki, &cap, &policy)?;
    rt.sync()?;
    Ok(i32_from_bytes(&rt.download(&pos)?))
}

/// top_k, d_model and slots per expert as the movement kernels' int arguments.
fn movement_args(cfg: &MoeConfig) -> Result<(i32, i32, i32)> {
    Ok((
        int_arg("top_k", token_choice_k(cfg)?)?,
        int_arg("d_model", cfg.d_model)?,
        int_arg("slots", slots_per_expert(cfg))?,
    ))
}

/// Checks, before a launch, what the movement kernels index with: one expert and one slot
/// position per assignment (tokens·top_k of each), every expert in 0..experts, every position
/// −1 (dropped) or in 0..slots, and no slot filled twice. The kernels trust these: a bad one
/// would read or write outside the slot array.
pub fn check_decisions(cfg: &MoeConfig, experts: &[i32], positions: &[i32]) -> Result<()> {
    let n = cfg.tokens * token_choice_k(cfg)?;
    let slots = slots_per_expert(cfg);
    if experts.len() != n || positions.len() != n {
        return Err(KernelError::BadBuffer(format!(
            "decisions need tokens·top_k = {n} experts and positions, got {} and {}",
            experts.len(),
            positions.len()
        )));
    }
    let mut filled = vec![false; cfg.experts * slots];
    for (a, (&e, &p)) in experts.iter().zip(positions).enumerate() {
        if e < 0 || e as usize >= cfg.experts {
            return Err(KernelError::BadBuffer(format!(
                "assignment {a}: expert {e} is outside 0..{}",
                cfg.experts
            )));
        }
        if p == -1 {
            continue;
        }
        if p < 0 || p as usize >= slots {
            return Err(KernelError::BadBuffer(format!(
                "assignment {a}: slot position {p} is neither -1 (dropped) nor in 0..{slots}"
            )));
        }
        let slot = &mut filled[e as usize * slots + p as usize];
        if std::mem::replace(slot, true) {
            return Err(KernelError::BadBuffer(format!(
                "assignment {a}: slot {p} of expert {e} is filled twice"
            )));
        }
    }
    Ok(())
}

/// The routing decisions (experts, positions) on the device (checked by the caller).
fn upload_decisions(
    rt: &CudaRuntime,
    experts: &[i32],
    positions: &[i32],
) -> Result<(CudaSlice<u8>, CudaSlice<u8>)> {
    Ok((
        rt.upload(&i32_bytes(experts))?,
        rt.upload(&i32_bytes(positions))?,
    ))
}

/// Dispatch on the device: x `[tokens, d_model]` → expert slots `[experts, slots, d_model]`
/// (slots no kept assignment fills stay NaN).
pub fn dispatch_cuda(
    cfg: &MoeConfig,
    x: &Buffer,
    experts: &[i32],
    positions: &[i32],
) -> Result<Buffer> {
    let (t, d, k) = (cfg.tokens, cfg.d_model, token_choice_k(cfg)?);
    let slots = slots_per_expert(cfg);
    x.expect("x", x.dtype(), t * d)?;
    check_decisions(cfg, experts, positions)?;
    let rt = CudaRuntime::current()?;
    let f = rt.function(
        &SOURCE,
        &format!("moe_dispatch_{}", dtype_suffix(x.dtype())),
    )?;
    let launch = Launch::new((t * k, 1, 1), 128, 0)?;
    let xd = DeviceBuffer::upload(&rt, x)?;
    let (ed, pd) = upload_decisions(&rt, experts, positions)?;
    let mut out = DeviceBuffer::poisoned(&rt, x.dtype(), cfg.experts * slots * d)?;
    let (ki, di, si) = movement_args(cfg)?;
    cuda_launch!(
        rt,
        f,
        launch,
        &xd.bytes,
        &ed,
        &pd,
        &mut out.bytes,
        &ki,
        &di,
        &si
    )?;
    rt.sync()?;
    out.download(&rt)
}

/// Combine on the device: out[t] = Σ_rank weight · expert_out[expert, position] over kept
/// assignments; expert_out is `[experts, slots, d_model]`.
pub fn combine_cuda(
    cfg: &MoeConfig,
    expert_out: &Buffer,
    experts: &[i32],
    positions: &[i32],
    weights: &[f32],
) -> Result<Buffer> {
    let (t, d) = (cfg.tokens, cfg.d_model);
    let slots = slots_per_expert(cfg);
    let dt = expert_out.dtype();
    expert_out.expect("expert_out", dt, cfg.experts * slots * d)?;
    check_decisions(cfg, experts, positions)?;
    if weights.len() != experts.len() {
        return Err(KernelError::BadBuffer(format!(
            "combine needs one weight per assignment ({}), got {}",
            experts.len(),
            weights.len()
        )));
    }
    let rt = CudaRuntime::current()?;
    let f = rt.function(&SOURCE, &format!("moe_combine_{}", dtype_suffix(dt)))?;
    let launch = Launch::new((t, 1, 1), 128, 0)?;
    let yd = DeviceBuffer::upload(&rt, expert_out)?;
    let (ed, pd) = upload_decisions(&rt, experts, positions)?;
    let wd = rt.upload(&f32_bytes(weights))?;
    let mut out = DeviceBuffer::poisoned(&rt, dt, t * d)?;
    let (ki, di, si) = movement_args(cfg)?;
    cuda_launch!(
        rt,
        f,
        launch,
        &yd.bytes,
        &ed,
        &pd,
        &wd,
        &mut out.bytes,
        &ki,
        &di,
        &si
    )?;
    rt.sync()?;
    out.download(&rt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Capacity;

    fn cfg(tokens: usize, experts: usize, top_k: usize, capacity: Capacity) -> MoeConfig {
        MoeConfig::token_choice(
            tokens,
            64,
            128,
            experts,
            top_k,
            Priority::TokenOrder,
            WeightNorm::Renormalize,
            capacity,
        )
    }

    #[test]
    fn router_plan_and_limits() {
        let l = plan_route(&cfg(1000, 8, 2, Capacity::Dropless)).unwrap();
        assert_eq!(l.grid.0, 250);
        assert_eq!(l.block.0, 128);
        assert!(plan_route(&cfg(10, 300, 2, Capacity::Dropless)).is_err());
        assert!(plan_route(&cfg(10, 64, 33, Capacity::Dropless)).is_err());
    }

    #[test]
    fn slots_follow_the_capacity() {
        assert_eq!(slots_per_expert(&cfg(100, 8, 2, Capacity::Dropless)), 100);
        // ⌈100·2·1.25 / 8⌉ = 32
        assert_eq!(
            slots_per_expert(&cfg(100, 8, 2, Capacity::Factor(1.25))),
            32
        );
    }

    #[test]
    fn decisions_out_of_range_are_refused_before_any_launch() {
        // 3 tokens, top-2 of 4 experts, ⌈3·2·1.0 / 4⌉ = 2 slots per expert.
        let c = cfg(3, 4, 2, Capacity::Factor(1.0));
        assert_eq!(slots_per_expert(&c), 2);
        let experts = [0, 1, 1, 2, 3, 0];
        let positions = [0, 0, 1, 0, -1, 1];
        check_decisions(&c, &experts, &positions).unwrap();
        let refused = |e: &[i32], p: &[i32]| {
            let err = check_decisions(&c, e, p).unwrap_err().to_string();
            assert!(matches!(
                check_decisions(&c, e, p),
                Err(KernelError::BadBuffer(_))
            ));
            err
        };
        assert!(refused(&experts[..5], &positions[..5]).contains("tokens·top_k = 6"));
        assert!(refused(&[0, 1, 1, 2, 4, 0], &positions).contains("expert 4"));
        assert!(refused(&[0, 1, 1, 2, -1, 0], &positions).contains("expert -1"));
        assert!(refused(&experts, &[0, 0, 1, 0, -1, 2]).contains("position 2"));
        assert!(refused(&experts, &[0, 0, 1, 0, -2, 1]).contains("position -2"));
        assert!(refused(&experts, &[0, 0, 0, 0, -1, 1]).contains("filled twice"));
        // The launchers run the check before they ask for a device, so it holds without one.
        let x = Buffer::F32(vec![0.0; 3 * 64]);
        let e = dispatch_cuda(&c, &x, &[0, 1, 1, 2, 4, 0], &positions).unwrap_err();
        assert!(e.to_string().contains("expert 4"), "{e}");
        let y = Buffer::F32(vec![0.0; 4 * 2 * 64]);
        let e = combine_cuda(&c, &y, &experts, &positions, &[0.5; 5]).unwrap_err();
        assert!(e.to_string().contains("one weight per assignment"), "{e}");
        let e = capacity_cuda(&c, &[0, 1, 1, 9, 3, 0], &[0.5; 6]).unwrap_err();
        assert!(e.to_string().contains("expert 9"), "{e}");
    }
}
