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
use kernel_test_support::emu::Arg;
use kernel_test_support::emulated::{assert_close, module, nan_bytes};

#[test]
fn moe_route_capacity_dispatch_combine_match_the_cpu() {
    let Some(m) = module(&moe_kernels::cuda::SOURCE) else {
        return;
    };
    use moe_kernels::cuda::{plan_route, slots_per_expert};
    use moe_kernels::{route_reference, select, Capacity, DropPolicy, MoeConfig, MoeWeights};
    let base = MoeConfig {
        tokens: 97,
        d_model: 54,
        d_ff: 8,
        experts: 40,
        top_k: 2,
        norm: moe_kernels::WeightNorm::Renormalize,
        capacity: Capacity::Factor(1.0),
        policy: DropPolicy::TokenOrder,
    };
    let configs = [
        base,
        MoeConfig {
            policy: DropPolicy::Score,
            capacity: Capacity::Factor(0.5),
            ..base
        },
        MoeConfig {
            top_k: 8,
            experts: 8,
            capacity: Capacity::Dropless,
            norm: moe_kernels::WeightNorm::Raw,
            ..base
        },
    ];
    for (ci, c) in configs.iter().enumerate() {
        let w = MoeWeights::random(c, 1.0, ci as u64);
        let x = normal_f32(&mut rng(ci as u64 ^ 9), c.tokens * c.d_model, 1.0);
        let (t, k, e) = (c.tokens, c.top_k, c.experts);
        let (xb, gb, bb) = (f32_bytes(&x), f32_bytes(&w.router), f32_bytes(&w.bias));
        let mut probs = f32_bytes(&vec![f32::NAN; t * e]);
        let mut ex = i32_bytes(&vec![-1; t * k]);
        let mut gp = f32_bytes(&vec![f32::NAN; t * k]);
        let mut wt = f32_bytes(&vec![f32::NAN; t * k]);
        let i = |v: usize| Arg::I32(v as i32);
        m.launch(
            "moe_route_f32",
            plan_route(c).unwrap(),
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
                Arg::I32((c.norm == moe_kernels::WeightNorm::Renormalize) as i32),
            ],
        )
        .unwrap();
        let probs = f32_from_bytes(&probs);
        let exact = route_reference(c, &x, &w.router, &w.bias).unwrap();
        assert_close("router probs", &probs, &exact.probs, tolerance(DType::F32));
        let cpu = select(c, probs.iter().map(|&p| p as f64).collect());
        let experts = i32_from_bytes(&ex);
        for (a, &got) in cpu.assignments.iter().zip(&experts) {
            assert_eq!(a.expert as i32, got, "config {ci}: top-k choice");
        }
        let weights = f32_from_bytes(&wt);
        let want_w: Vec<f64> = cpu.assignments.iter().map(|a| a.weight).collect();
        assert_close("weights", &weights, &want_w, tolerance(DType::F32));
        // Capacity positions: kept exactly when the CPU keeps, positions 0..kept per expert.
        let cap = slots_per_expert(c);
        let mut pos = i32_bytes(&vec![i32::MIN; t * k]);
        let n = t * k;
        m.launch(
            "moe_capacity_f32",
            Launch::new((blocks_for(n, 256), 1, 1), 256, 0).unwrap(),
            &mut [
                Arg::In(&ex),
                Arg::In(&gp),
                Arg::Out(&mut pos),
                i(n),
                i(k),
                i(cap),
                Arg::I32((c.policy == DropPolicy::Score) as i32),
            ],
        )
        .unwrap();
        let pos = i32_from_bytes(&pos);
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
}
