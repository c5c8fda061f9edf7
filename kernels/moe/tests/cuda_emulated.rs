//! The MoE CUDA kernels (route, capacity, dispatch, combine), run by the CPU emulator
//! (`kernel_test_support::emu`: g++, CUDA threads as coroutines, warp shuffles),
//! against the same f64 references the CPU variants answer to, with launch shapes from the
//! host-side plans and NaN-poisoned outputs. No GPU is involved: this checks what the kernels
//! compute before a GPU is lent, not their speed. Skips (with the reason) where g++ is missing.

use kernel_common::inputs::{normal_buffer, normal_f32, rng};
use kernel_common::{tolerance, Buffer, DType};
use kernel_cuda::buffer::{buffer_bytes, buffer_from_bytes, f32_bytes, f32_from_bytes};
use kernel_cuda::buffer::{i32_bytes, i32_from_bytes};
use kernel_cuda::{blocks_for, Launch};
use kernel_test_support::emu::{Arg, EmuModule};
use kernel_test_support::emulated::{assert_close, module, nan_bytes};

/// What the router kernel wrote: probabilities (as bytes), chosen experts, their
/// probabilities and the combine weights.
struct EmulatedRouting {
    probs: Vec<u8>,
    experts: Vec<i32>,
    gate_probs: Vec<f32>,
    weights: Vec<f32>,
}

/// `moe_route_f32` over `c`'s tokens with the launch `plan_route` gives, on outputs poisoned
/// with values no router writes (probability 1.5, expert −7).
fn emulated_route(
    m: &EmuModule,
    c: &kernel_moe::MoeConfig,
    x: &[f32],
    w: &kernel_moe::MoeWeights,
) -> EmulatedRouting {
    let (t, k, e) = (c.tokens, c.top_k().unwrap(), c.experts);
    let (xb, gb, bb) = (f32_bytes(x), f32_bytes(&w.router), f32_bytes(&w.bias));
    let mut probs = f32_bytes(&vec![1.5; t * e]);
    let mut ex = i32_bytes(&vec![-7; t * k]);
    let mut gp = f32_bytes(&vec![1.5; t * k]);
    let mut wt = f32_bytes(&vec![1.5; t * k]);
    let i = |v: usize| Arg::I32(v as i32);
    m.launch(
        "moe_route_f32",
        kernel_moe::cuda::plan_route(c).unwrap(),
        &mut [
            Arg::In(&xb),
            Arg::In(&gb),
            Arg::In(&bb),
            Arg::Out(&mut probs),
            Arg::Out(&mut ex),
            Arg::Out(&mut gp),
            Arg::Out(&mut wt),
            i(t),
            i(c.d_model),
            i(e),
            i(k),
            Arg::I32((c.norm != kernel_moe::WeightNorm::Raw) as i32),
        ],
    )
    .unwrap();
    EmulatedRouting {
        probs,
        experts: i32_from_bytes(&ex),
        gate_probs: f32_from_bytes(&gp),
        weights: f32_from_bytes(&wt),
    }
}

/// `moe_capacity_f32`: each assignment's slot in its expert's queue under `c`'s policy, or −1.
fn emulated_capacity(
    m: &EmuModule,
    c: &kernel_moe::MoeConfig,
    experts: &[i32],
    gate_probs: &[f32],
) -> Vec<i32> {
    use kernel_moe::cuda::{capacity_policy_code, slots_per_expert};
    let n = experts.len();
    let mut pos = i32_bytes(&vec![i32::MIN; n]);
    let i = |v: usize| Arg::I32(v as i32);
    m.launch(
        "moe_capacity_f32",
        Launch::new((blocks_for(n, 256), 1, 1), 256, 0).unwrap(),
        &mut [
            Arg::In(&i32_bytes(experts)),
            Arg::In(&f32_bytes(gate_probs)),
            Arg::Out(&mut pos),
            i(n),
            i(c.top_k().unwrap()),
            i(slots_per_expert(c)),
            Arg::I32(capacity_policy_code(c.policy().unwrap()).unwrap()),
        ],
    )
    .unwrap();
    i32_from_bytes(&pos)
}

#[test]
fn moe_route_capacity_dispatch_combine_match_the_cpu() {
    let Some(m) = module(&kernel_moe::cuda::SOURCE) else {
        return;
    };
    use kernel_moe::cuda::slots_per_expert;
    use kernel_moe::WeightNorm::{Raw, Renormalize};
    use kernel_moe::{route_reference, select, Capacity, MoeConfig, MoeWeights, Priority};
    let layer = |experts, top_k, policy, norm, capacity| {
        MoeConfig::token_choice(97, 54, 8, experts, top_k, policy, norm, capacity)
    };
    let configs = [
        layer(
            40,
            2,
            Priority::TokenOrder,
            Renormalize,
            Capacity::Factor(1.0),
        ),
        layer(40, 2, Priority::Score, Renormalize, Capacity::Factor(0.5)),
        layer(8, 8, Priority::TokenOrder, Raw, Capacity::Dropless),
        // Skewed 8 experts, top-2, tight: rank-major order differs from token order here.
        layer(8, 2, Priority::RankMajor, Raw, Capacity::Factor(0.6)),
    ];
    for (ci, c) in configs.iter().enumerate() {
        let w = MoeWeights::random(c, 1.0, ci as u64);
        let x = normal_f32(&mut rng(ci as u64 ^ 9), c.tokens * c.d_model, 1.0);
        let (t, k, e) = (c.tokens, c.top_k().unwrap(), c.experts);
        let r = emulated_route(&m, c, &x, &w);
        let (probs, experts, weights) = (f32_from_bytes(&r.probs), r.experts, r.weights);
        let ex = i32_bytes(&experts);
        let i = |v: usize| Arg::I32(v as i32);
        let exact = route_reference(c, &x, &w.router, &w.bias).unwrap();
        assert_close("router probs", &probs, &exact.probs, tolerance(DType::F32));
        let cpu = select(c, probs.iter().map(|&p| p as f64).collect());
        if c.policy() == Some(Priority::RankMajor) {
            let token_major = MoeConfig {
                choice: kernel_moe::Choice::Tokens {
                    top_k: k,
                    policy: Priority::TokenOrder,
                },
                ..*c
            };
            let order = select(&token_major, probs.iter().map(|&p| p as f64).collect());
            let kept =
                |r: &kernel_moe::Routing| r.assignments.iter().map(|a| a.kept).collect::<Vec<_>>();
            assert_ne!(
                kept(&cpu),
                kept(&order),
                "the case must tell gshard from order"
            );
        }
        for (a, &got) in cpu.assignments.iter().zip(&experts) {
            assert_eq!(a.expert as i32, got, "config {ci}: top-k choice");
        }
        let want_w: Vec<f64> = cpu.assignments.iter().map(|a| a.weight).collect();
        assert_close("weights", &weights, &want_w, tolerance(DType::F32));
        // Capacity positions: kept exactly when the CPU keeps, positions 0..kept per expert.
        let cap = slots_per_expert(c);
        let n = t * k;
        let pos = emulated_capacity(&m, c, &experts, &r.gate_probs);
        let mut per_expert = vec![vec![]; e];
        for (a, &p) in cpu.assignments.iter().zip(&pos) {
            assert_eq!(a.kept, p >= 0, "config {ci}: kept flag of {a:?}");
            if p >= 0 {
                per_expert[a.expert].push(p);
            }
        }
        for v in &mut per_expert {
            v.sort_unstable();
            assert!(v.iter().enumerate().all(|(i, &p)| i as i32 == p));
        }
        // Dispatch (bf16 rows, bit-exact) and combine (f64 reference of the same decisions).
        let dt = DType::BF16;
        let xs = Buffer::from_f32(dt, &x);
        let xsb = buffer_bytes(&xs);
        let mut slots_b = nan_bytes(dt, e * cap * c.d_model);
        m.launch(
            "moe_dispatch_bf16",
            Launch::new((n, 1, 1), 128, 0).unwrap(),
            &mut [
                Arg::In(&xsb),
                Arg::In(&ex),
                Arg::In(&i32_bytes(&pos)),
                Arg::Out(&mut slots_b),
                i(k),
                i(c.d_model),
                i(cap),
            ],
        )
        .unwrap();
        let slots_f = buffer_from_bytes(dt, &slots_b).to_f32();
        let xf = xs.to_f32();
        let d = c.d_model;
        for (a, (&ee, &p)) in experts.iter().zip(&pos).enumerate() {
            if p >= 0 {
                let at = (ee as usize * cap + p as usize) * d;
                assert_eq!(&slots_f[at..at + d], &xf[(a / k) * d..(a / k + 1) * d]);
            }
        }
        let y = normal_buffer(&mut rng(5), dt, e * cap * d);
        let yf = y.to_f32();
        let mut want = vec![0.0f64; t * d];
        for (a, (&ee, &p)) in experts.iter().zip(&pos).enumerate() {
            if p >= 0 {
                let at = (ee as usize * cap + p as usize) * d;
                for j in 0..d {
                    want[(a / k) * d + j] += weights[a] as f64 * yf[at + j] as f64;
                }
            }
        }
        let mut out = nan_bytes(dt, t * d);
        m.launch(
            "moe_combine_bf16",
            Launch::new((t, 1, 1), 128, 0).unwrap(),
            &mut [
                Arg::In(&buffer_bytes(&y)),
                Arg::In(&ex),
                Arg::In(&i32_bytes(&pos)),
                Arg::In(&f32_bytes(&weights)),
                Arg::Out(&mut out),
                i(k),
                i(d),
                i(cap),
            ],
        )
        .unwrap();
        assert_close(
            "combine",
            &buffer_from_bytes(dt, &out).to_f32(),
            &want,
            tolerance(dt).scaled_to(&want),
        );
    }
    router_and_capacity_follow_the_cpu_on_nan_and_inf_logits(&m);
}

/// NaN and ±Inf logits on the router and capacity kernels (part of the routing test, so its
/// planted bugs and its sanitised rerun cover it): 256 experts (the router's
/// `MAX_EXPERTS`, where an expert index left at `n_experts` would write past the shared
/// row), top-8, score priority under a tight capacity. Rows with a NaN, +Inf or −Inf input, an
/// row of huge activations (logits near or past f32's range) and a row scaled until most probabilities underflow to
/// exactly 0 (ties) sit among ordinary ones. The kernels must give the CPU's probabilities
/// (NaN where it has NaN), its choices (`decision::higher_first`: NaN before every probability,
/// ties to the lower expert, so an all-NaN row takes experts 0..7), its weights and its kept
/// flags, and every expert index in range.
fn router_and_capacity_follow_the_cpu_on_nan_and_inf_logits(m: &EmuModule) {
    use kernel_moe::{route, select, Capacity, MoeConfig, MoeWeights, Priority, WeightNorm};
    let (t, d, e, k) = (13, 24, 256, 8);
    for (policy, norm) in [
        (Priority::Score, WeightNorm::Renormalize),
        (Priority::TokenOrder, WeightNorm::Raw),
    ] {
        let c = MoeConfig::token_choice(t, d, 8, e, k, policy, norm, Capacity::Factor(0.5));
        let w = MoeWeights::random(&c, 1.0, 3);
        let mut x = normal_f32(&mut rng(11), t * d, 1.0);
        x[d + 3] = f32::NAN;
        x[2 * d + 5] = f32::INFINITY;
        x[3 * d] = f32::NEG_INFINITY;
        x[5 * d..6 * d].iter_mut().for_each(|v| *v *= 1e38);
        x[7 * d..8 * d].iter_mut().for_each(|v| *v *= 300.0);
        x[9 * d..10 * d].fill(f32::NAN);
        let r = emulated_route(m, &c, &x, &w);
        let probs = f32_from_bytes(&r.probs);
        let cpu_probs = route(&c, &x, &w.router, &w.bias).unwrap().probs;
        let nan_rows: Vec<usize> = (0..t)
            .filter(|&r| cpu_probs[r * e..(r + 1) * e].iter().all(|p| p.is_nan()))
            .collect();
        assert!(
            [1, 2, 3, 9].iter().all(|r| nan_rows.contains(r)),
            "the non-finite rows must softmax to NaN on the CPU: {nan_rows:?}"
        );
        let zeros = probs[7 * e..8 * e].iter().filter(|&&p| p == 0.0).count();
        assert!(zeros > 2 * k, "row 7 must tie at 0 ({zeros} zeros)");
        for (j, (&g, &want)) in probs.iter().zip(&cpu_probs).enumerate() {
            if want.is_nan() {
                assert!(g.is_nan(), "prob {j}: {g}, the CPU has NaN");
            } else {
                assert!((g as f64 - want).abs() <= 1e-5, "prob {j}: {g} vs {want}");
            }
        }
        let cpu = select(&c, probs.iter().map(|&p| p as f64).collect());
        let experts = r.experts.as_slice();
        assert!(experts.iter().all(|&x| (0..e as i32).contains(&x)));
        for (a, &got) in cpu.assignments.iter().zip(experts) {
            assert_eq!(a.expert as i32, got, "{policy:?}: top-k choice of {a:?}");
        }
        assert_eq!(&experts[9 * k..10 * k], &[0, 1, 2, 3, 4, 5, 6, 7]);
        for (a, &got) in cpu.assignments.iter().zip(&r.weights) {
            if a.weight.is_nan() {
                assert!(got.is_nan(), "{a:?}: weight {got}, the CPU has NaN");
            } else {
                assert!((got as f64 - a.weight).abs() <= 1e-5, "{a:?}: weight {got}");
            }
        }
        let pos = emulated_capacity(m, &c, experts, &r.gate_probs);
        assert!(
            cpu.assignments.iter().any(|a| !a.kept),
            "a tight capacity drops"
        );
        for (a, &p) in cpu.assignments.iter().zip(&pos) {
            assert_eq!(a.kept, p >= 0, "{policy:?}: kept flag of {a:?}");
        }
        kernel_moe::cuda::check_decisions(&c, experts, &pos).unwrap();
    }
}

/// `cuda_grouped` (gate+up, down, combine) on the emulator against the f64 experts of the same
/// decisions, x, weights and the hidden activation rounded to the storage type as the
/// variant rounds them: every
/// routing convention, odd widths (element loads) and multiples of 8 (16-byte loads), experts
/// spanning several row tiles, K over several 32-deep steps, experts with no tokens.
#[test]
fn grouped_expert_gemms_match_the_f64_reference() {
    let Some(m) = module(&kernel_moe::cuda::experts::SOURCE) else {
        return;
    };
    use kernel_moe::cuda::experts::{plan_grouped, plan_launches};
    use kernel_moe::reference::experts_reference_stored;
    use kernel_moe::{route, Capacity, Choice, MoeConfig, MoeWeights, Priority, WeightNorm};
    let tc = |tokens, d, f, experts, k, policy, norm, cf| {
        MoeConfig::token_choice(tokens, d, f, experts, k, policy, norm, Capacity::Factor(cf))
    };
    let configs = [
        tc(
            97,
            54,
            77,
            6,
            2,
            Priority::RankMajor,
            WeightNorm::RenormalizeKept,
            1.0,
        ),
        tc(
            150,
            64,
            128,
            4,
            2,
            Priority::Reroute,
            WeightNorm::Renormalize,
            0.8,
        ),
        tc(40, 16, 40, 8, 1, Priority::Score, WeightNorm::Raw, 2.0),
        MoeConfig {
            choice: Choice::Experts,
            norm: WeightNorm::Raw,
            ..tc(70, 33, 24, 5, 1, Priority::Score, WeightNorm::Raw, 1.5)
        },
    ];
    for (ci, c) in configs.iter().enumerate() {
        let w = MoeWeights::random(c, 1.5, 40 + ci as u64);
        let x = normal_f32(&mut rng(ci as u64 ^ 0x77), c.tokens * c.d_model, 1.0);
        let routing = route(c, &x, &w.router, &w.bias).unwrap();
        let plan = plan_grouped(c, &routing).unwrap();
        let [up, down, combine] = plan_launches(c, &plan).unwrap();
        let (d, f) = (c.d_model, c.d_ff);
        for dt in [DType::F16, DType::BF16] {
            let xr = Buffer::from_f32(dt, &x).to_f32();
            let all: Vec<usize> = (0..c.tokens).collect();
            let want = experts_reference_stored(c, &w.rounded(dt), &xr, &routing, &all, dt);
            let transposed = |m: &[f32], rows: usize, cols: usize| {
                let mut t = vec![0.0f32; m.len()];
                for e in 0..c.experts {
                    for r in 0..rows {
                        for k in 0..cols {
                            t[e * rows * cols + k * rows + r] = m[e * rows * cols + r * cols + k];
                        }
                    }
                }
                buffer_bytes(&Buffer::from_f32(dt, &t))
            };
            let (wg, wu, wd) = (
                transposed(&w.w_gate, d, f),
                transposed(&w.w_up, d, f),
                transposed(&w.w_down, f, d),
            );
            let padded = plan.rows.len();
            let i = |v: usize| Arg::I32(v as i32);
            let mut h = nan_bytes(dt, padded * f);
            let suffix = if dt == DType::F16 { "f16" } else { "bf16" };
            m.launch(
                &format!("moe_up_{suffix}"),
                up.unwrap(),
                &mut [
                    Arg::In(&buffer_bytes(&Buffer::from_f32(dt, &x))),
                    Arg::In(&wg),
                    Arg::In(&wu),
                    Arg::In(&i32_bytes(&plan.rows)),
                    Arg::In(&i32_bytes(&plan.tile_expert)),
                    Arg::Out(&mut h),
                    i(d),
                    i(f),
                ],
            )
            .unwrap();
            let mut y = f32_bytes(&vec![f32::NAN; padded * d]);
            m.launch(
                &format!("moe_down_{suffix}"),
                down.unwrap(),
                &mut [
                    Arg::In(&h),
                    Arg::In(&wd),
                    Arg::In(&i32_bytes(&plan.tile_expert)),
                    Arg::Out(&mut y),
                    i(d),
                    i(f),
                ],
            )
            .unwrap();
            let mut out = nan_bytes(dt, c.tokens * d);
            m.launch(
                &format!("moe_combine_rows_{suffix}"),
                combine.unwrap(),
                &mut [
                    Arg::In(&y),
                    Arg::In(&i32_bytes(&plan.token_starts)),
                    Arg::In(&i32_bytes(&plan.token_rows)),
                    Arg::In(&f32_bytes(&plan.token_weights)),
                    Arg::Out(&mut out),
                    i(d),
                ],
            )
            .unwrap();
            assert_close(
                &format!("config {ci} ({}) {dt}", c.label()),
                &buffer_from_bytes(dt, &out).to_f32(),
                &want,
                tolerance(dt).scaled_to(&want),
            );
        }
        let stats = routing.stats(c.experts);
        if ci == 1 {
            assert!(stats.rerouted > 0, "config 1 must reroute: {stats:?}");
        }
        if ci == 3 {
            assert!(
                stats.unserved_tokens > 0 && stats.multi_served_tokens > 0,
                "{stats:?}"
            );
        }
    }
}

/// The planted bugs kernels/CUDA.md lists for this family, each switched on in a child
/// process (`kernel_test_support::mutations`): in moe.cu the slot combine skipping a token's
/// last-ranked assignment; in experts.cu the up projection's MMA fed the gate's B fragments,
/// the barrier after the gate/up tiles are loaded removed, and the per-token row combine
/// skipping a token's last assignment. Each must fail the emulated check it names (the tests
/// passing unmutated are the other half).
#[test]
fn planted_bugs_fail_the_emulated_check() {
    use kernel_test_support::mutations;
    if kernel_test_support::emu::unavailable().is_some() || mutations::switched_on() {
        return;
    }
    let routing = mutations::assert_each_caught(
        "moe.cu",
        "moe_route_capacity_dispatch_combine_match_the_cpu",
    );
    assert_eq!(routing.len(), 2);
    let experts =
        mutations::assert_each_caught("experts.cu", "grouped_expert_gemms_match_the_f64_reference");
    assert_eq!(experts.len(), 3);
}
