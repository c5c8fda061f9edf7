//! The feed-forward of a decoder layer: a gated MLP — SwiGLU, silu(gate) · up (Shazeer 2020,
//! `kernel_cpu::ops::gated`), or GeGLU with the tanh GELU (Gemma's `gelu_pytorch_tanh`:
//! ½x(1 + tanh(√(2/π)(x + 0.044715x³)))) — or a sparse MoE block routed by
//! `kernel_moe::route` (softmax over the experts, top-k, the k weights renormalised as
//! Mixtral and `norm_topk_prob` do or kept raw as OLMoE does, capacity), each expert's MLP on
//! the rows routed to it, combined with the routing weights, plus Qwen2-MoE's shared expert
//! scaled by sigmoid(x · gate).

use crate::model::forward::LayerScratch;
use crate::model::llama::{Expert, Ffn, Llama, Mlp, Result, SharedExpert};
use kernel_cpu::ops::Gate;
use kernel_moe::{route, MoeConfig, Priority};
use kernel_quant::MatVecVariant;

impl Expert {
    /// down(act(gate) · up) for `n` rows of `x`.
    fn forward(&self, x: &[f32], n: usize, mlp: Mlp, v: MatVecVariant) -> Result<Vec<f32>> {
        let mut s = LayerScratch::default();
        self.forward_into(x, n, mlp, v, &mut s)?;
        Ok(s.ffn_out)
    }

    /// `forward` into `s.ffn_out`, through `s`'s gate|up and gated buffers.
    fn forward_into(
        &self,
        x: &[f32],
        n: usize,
        mlp: Mlp,
        v: MatVecVariant,
        s: &mut LayerScratch,
    ) -> Result<()> {
        self.gate_up.forward_into(x, n, v, &mut s.gate_up)?;
        let f = self.width();
        let gate = match mlp {
            Mlp::SwiGlu => Gate::Silu,
            Mlp::GeGlu => Gate::GeluTanh,
        };
        s.gated.resize(s.gate_up.len() / 2, 0.0);
        kernel_cpu::ops::gated(&s.gate_up, f, &mut s.gated, gate);
        self.down.forward_into(&s.gated, n, v, &mut s.ffn_out)
    }
}

impl Llama {
    /// The feed-forward `ffn` of `n` rows of `x`, into `s.ffn_out`.
    pub(super) fn ffn_into(
        &self,
        ffn: &Ffn,
        x: &[f32],
        n: usize,
        s: &mut LayerScratch,
    ) -> Result<()> {
        let mlp = self.cfg.blocks.mlp;
        match ffn {
            Ffn::Dense(e) => e.forward_into(x, n, mlp, self.matmul, s),
            Ffn::Moe {
                router,
                experts,
                shared,
            } => {
                let mut out = self.moe(router, experts, x, n)?;
                if let Some(sh) = shared {
                    self.add_shared(sh, x, n, &mut out)?;
                }
                s.ffn_out = out;
                Ok(())
            }
        }
    }

    /// The routed experts: route (softmax, top-k, the spec's weight rule, capacity), then each
    /// expert's MLP on the rows routed to it, combined with the routing weights.
    fn moe(&self, router: &[f32], experts: &[Expert], x: &[f32], n: usize) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let spec = cfg.moe.expect("an MoE layer has a spec");
        let mcfg = MoeConfig::token_choice(
            n,
            cfg.d_model,
            spec.d_ff,
            spec.experts,
            spec.top_k,
            Priority::TokenOrder,
            spec.norm,
            spec.capacity,
        );
        let routing = route(&mcfg, x, router, &vec![0.0; spec.experts])?;
        let d = cfg.d_model;
        let mut out = vec![0.0f32; n * d];
        for (e, expert) in experts.iter().enumerate() {
            let mine: Vec<_> = routing
                .assignments
                .iter()
                .filter(|a| a.kept && a.expert == e)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let rows: Vec<f32> = mine
                .iter()
                .flat_map(|a| x[a.token * d..(a.token + 1) * d].iter().copied())
                .collect();
            let y = expert.forward(&rows, mine.len(), cfg.blocks.mlp, self.matmul)?;
            for (a, yr) in mine.iter().zip(y.chunks(d)) {
                let w = a.weight as f32;
                out[a.token * d..(a.token + 1) * d]
                    .iter_mut()
                    .zip(yr)
                    .for_each(|(o, v)| *o += w * v);
            }
        }
        Ok(out)
    }

    /// out += sigmoid(x · gate) · shared(x), row by row.
    fn add_shared(&self, s: &SharedExpert, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        let y = s.expert.forward(x, n, self.cfg.blocks.mlp, self.matmul)?;
        let g = s.gate.forward(x, n, self.matmul)?;
        let d = self.cfg.d_model;
        for ((o, yr), g) in out.chunks_mut(d).zip(y.chunks(d)).zip(g) {
            let w = 1.0 / (1.0 + (-g).exp());
            o.iter_mut().zip(yr).for_each(|(o, v)| *o += w * v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geglu_is_the_tanh_gelu_times_up() {
        // gelu_tanh(1) = 0.841192, gelu_tanh(-2) = -0.045402 (torch, approximate="tanh").
        let gelu =
            |x: f64| 0.5 * x * (1.0 + (0.797_884_560_8 * (x + 0.044_715 * x.powi(3))).tanh());
        for isa in kernel_cpu::isa::runnable() {
            kernel_cpu::isa::with_isa(isa, || {
                let mut out = [f32::NAN; 2];
                kernel_cpu::ops::gated(&[1.0, -2.0, 3.0, 0.5], 2, &mut out, Gate::GeluTanh);
                assert!((out[0] - 0.841_192 * 3.0).abs() < 1e-5, "{isa}: {out:?}");
                assert!((out[1] + 0.045_402 * 0.5).abs() < 1e-5, "{isa}: {out:?}");
                // Against the f64 tanh formula from −12 to 12, both tails included.
                let g: Vec<f32> = (0..97).map(|i| -12.0 + 0.25 * i as f32).collect();
                let mut gu = g.clone();
                gu.extend(std::iter::repeat_n(1.0f32, g.len()));
                let mut out = vec![f32::NAN; g.len()];
                kernel_cpu::ops::gated(&gu, g.len(), &mut out, Gate::GeluTanh);
                for (&x, &y) in g.iter().zip(&out) {
                    let want = gelu(x as f64);
                    assert!(
                        (y as f64 - want).abs() <= 1e-6 * want.abs().max(1e-3),
                        "{isa} {x}: {y} vs {want}"
                    );
                }
            })
            .unwrap();
        }
    }
}
