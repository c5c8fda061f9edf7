//! The f64 oracle for the expert side: for each requested token, Σ over its kept assignments
//! of weight · W_down·(silu(W_gate·x) ⊙ W_up·x), every product and the SiLU in f64. Shares no
//! code with the kernels.

use crate::config::MoeConfig;
use crate::decision::Routing;
use crate::weights::MoeWeights;

/// Reference outputs of `tokens` (each d_model values, in the order given).
pub fn experts_reference(
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    routing: &Routing,
    tokens: &[usize],
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
