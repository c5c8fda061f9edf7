//! The f64 oracle for the expert side: for each requested token, Σ over its kept assignments
//! of weight · W_down·(silu(W_gate·x) ⊙ W_up·x), every product and the SiLU in f64. Shares no
//! code with the kernels. `experts_reference_stored` rounds the hidden activation h to a
//! storage type first, as a variant that keeps h in that type between its two GEMMs does
//! (`cuda_grouped`: MegaBlocks' and vLLM's fused_moe layout).

use crate::config::MoeConfig;
use crate::decision::Routing;
use crate::weights::MoeWeights;
use kernel_common::DType;

/// Reference outputs of `tokens` (each d_model values, in the order given).
pub fn experts_reference(
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    routing: &Routing,
    tokens: &[usize],
) -> Vec<f64> {
    experts_reference_with(cfg, w, x, routing, tokens, |_| {})
}

/// As `experts_reference`, with each hidden value h = silu(g)·u rounded to `hidden` (through
/// f32, as a kernel that computes h in f32 stores it) before the down projection: the
/// oracle of a variant whose h lives in `hidden` between its GEMMs. The rounding is part of
/// what that variant computes (each h is off by up to half an ulp of `hidden`, 2^-9 relative
/// in bf16), so it belongs in its reference, not in its tolerance.
pub fn experts_reference_stored(
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    routing: &Routing,
    tokens: &[usize],
    hidden: DType,
) -> Vec<f64> {
    experts_reference_with(cfg, w, x, routing, tokens, |h| {
        let wide: Vec<f32> = h.iter().map(|&v| v as f32).collect();
        let stored = kernel_common::Buffer::from_f32(hidden, &wide).to_f64();
        h.copy_from_slice(&stored);
    })
}

fn experts_reference_with(
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    routing: &Routing,
    tokens: &[usize],
    store_hidden: impl Fn(&mut [f64]),
) -> Vec<f64> {
    let (d, f) = (cfg.d_model, cfg.d_ff);
    let mut out = Vec::with_capacity(tokens.len() * d);
    for &t in tokens {
        let xt = &x[t * d..(t + 1) * d];
        let mut y = vec![0.0f64; d];
        for a in routing.of_token(t).iter().filter(|a| a.kept) {
            let e = a.expert;
            let mut h = vec![0.0f64; f];
            for (j, hj) in h.iter_mut().enumerate() {
                let (mut g, mut u) = (0.0f64, 0.0f64);
                for (i, &xi) in xt.iter().enumerate() {
                    g += xi as f64 * w.w_gate[(e * d + i) * f + j] as f64;
                    u += xi as f64 * w.w_up[(e * d + i) * f + j] as f64;
                }
                *hj = g / (1.0 + (-g).exp()) * u;
            }
            store_hidden(&mut h);
            for (c, yc) in y.iter_mut().enumerate() {
                let s: f64 = h
                    .iter()
                    .enumerate()
                    .map(|(j, &hj)| hj * w.w_down[(e * f + j) * d + c] as f64)
                    .sum();
                *yc += a.weight * s;
            }
        }
        out.extend(y);
    }
    out
}
