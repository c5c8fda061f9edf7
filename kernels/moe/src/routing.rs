//! The router: logits = x·W_gate + bias (the bias is the experiments' skew knob), softmax per
//! token, then the decisions — token choice (`token_choice.rs`: top-k, capacity under a
//! priority policy, rerouting) or expert choice (`expert_choice.rs`) — and the combine
//! weights (`WeightNorm`). Assignments that lose their slot are dropped: those tokens
//! contribute nothing through that expert (the residual stream carries them). `route` is the
//! optimised f32 router (one GEMM for the logits); `route_reference` computes the
//! probabilities in f64. The decisions are one function, `select`, shared by both, so a test
//! can hand either the other's probabilities.

use crate::config::{Choice, MoeConfig, WeightNorm};
pub use crate::decision::{Assignment, Routing};
use kernel_common::{error::Result, KernelError};
use kernel_cpu::gemm::{sgemm, Strides};
use rayon::prelude::*;

fn check_inputs(cfg: &MoeConfig, x: &[f32], gate: &[f32], bias: &[f32]) -> Result<()> {
    cfg.validate()?;
    let bad = |what: &str, got: usize, want: usize| {
        Err(KernelError::BadBuffer(format!(
            "{what} has {got} values, expected {want}"
        )))
    };
    if x.len() != cfg.tokens * cfg.d_model {
        return bad("x (tokens × d_model)", x.len(), cfg.tokens * cfg.d_model);
    }
    if gate.len() != cfg.d_model * cfg.experts {
        return bad(
            "W_gate (d_model × experts)",
            gate.len(),
            cfg.d_model * cfg.experts,
        );
    }
    if bias.len() != cfg.experts {
        return bad("router bias (experts)", bias.len(), cfg.experts);
    }
    Ok(())
}

/// The optimised router: logits by one f32 GEMM, softmax per token in parallel, `select`.
pub fn route(cfg: &MoeConfig, x: &[f32], gate: &[f32], bias: &[f32]) -> Result<Routing> {
    check_inputs(cfg, x, gate, bias)?;
    let (t, d, e) = (cfg.tokens, cfg.d_model, cfg.experts);
    let mut logits = vec![0.0f32; t * e];
    logits
        .par_chunks_mut(e * 256)
        .enumerate()
        .for_each(|(c, out)| {
            let rows = out.len() / e;
            sgemm(
                rows,
                d,
                e,
                1.0,
                &x[c * 256 * d..],
                Strides::row_major(d),
                gate,
                Strides::row_major(e),
                0.0,
                out,
                e,
            );
        });
    let probs: Vec<f64> = logits
        .par_chunks(e)
        .flat_map_iter(|row| {
            let l: Vec<f32> = row.iter().zip(bias).map(|(a, b)| a + b).collect();
            let m = l.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let ex: Vec<f32> = l.iter().map(|&v| (v - m).exp()).collect();
            let s: f32 = ex.iter().sum();
            ex.into_iter().map(move |v| (v / s) as f64)
        })
        .collect();
    Ok(select(cfg, probs))
}

/// The f64 router: the same decisions computed from f64 logits and softmax.
pub fn route_reference(cfg: &MoeConfig, x: &[f32], gate: &[f32], bias: &[f32]) -> Result<Routing> {
    check_inputs(cfg, x, gate, bias)?;
    let (d, e) = (cfg.d_model, cfg.experts);
    let mut probs = Vec::with_capacity(cfg.tokens * e);
    for xt in x.chunks(d) {
        let l: Vec<f64> = (0..e)
            .map(|j| {
                xt.iter()
                    .enumerate()
                    .map(|(i, &v)| v as f64 * gate[i * e + j] as f64)
                    .sum::<f64>()
                    + bias[j] as f64
            })
            .collect();
        let m = l.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let s: f64 = l.iter().map(|&v| (v - m).exp()).sum();
        probs.extend(l.iter().map(|&v| (v - m).exp() / s));
    }
    Ok(select(cfg, probs))
}

/// The decisions and combine weights from per-token probabilities (tokens × experts).
pub fn select(cfg: &MoeConfig, probs: Vec<f64>) -> Routing {
    let mut routing = match cfg.choice {
        Choice::Tokens { top_k, policy } => {
            crate::token_choice::select_tokens(cfg, probs, top_k, policy)
        }
        Choice::Experts => crate::expert_choice::select_experts(cfg, probs),
    };
    set_weights(&mut routing, cfg.norm);
    routing
}

/// Combine weights per token from the probabilities of its assignments' experts.
fn set_weights(routing: &mut Routing, norm: WeightNorm) {
    for t in 0..routing.tokens() {
        let own = &mut routing.assignments[routing.starts[t]..routing.starts[t + 1]];
        let all: f64 = own.iter().map(|a| a.prob).sum();
        // DeepSpeed clamps the denominator (here: a token whose kept probabilities all
        // underflowed gets weight 0, not NaN).
        let kept: f64 = own
            .iter()
            .filter(|a| a.kept)
            .map(|a| a.prob)
            .sum::<f64>()
            .max(f64::MIN_POSITIVE);
        for a in own.iter_mut() {
            a.weight = match norm {
                WeightNorm::Raw => a.prob,
                WeightNorm::Renormalize => a.prob / all,
                WeightNorm::RenormalizeKept if a.kept => a.prob / kept,
                WeightNorm::RenormalizeKept => 0.0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Capacity, Priority};

    /// Two tokens, three experts; token 0 prefers expert 0 then 1, token 1 prefers 0 then 2.
    fn probs() -> Vec<f64> {
        vec![0.6, 0.3, 0.1, 0.5, 0.1, 0.4]
    }

    fn layer(norm: WeightNorm, capacity: Capacity) -> MoeConfig {
        MoeConfig::token_choice(2, 1, 1, 3, 2, Priority::RankMajor, norm, capacity)
    }

    #[test]
    fn weights_follow_each_rule() {
        // Capacity 1: expert 0 keeps token 0's first choice; token 1 loses its first (0) and
        // keeps its second (2).
        let c = layer(WeightNorm::Raw, Capacity::Factor(0.5));
        assert_eq!(c.capacity_slots(), Some(1));
        let r = select(&c, probs());
        let kept: Vec<bool> = r.assignments.iter().map(|a| a.kept).collect();
        assert_eq!(kept, vec![true, true, false, true]);
        let w = |n| {
            select(&MoeConfig { norm: n, ..c }, probs())
                .assignments
                .iter()
                .map(|a| a.weight)
                .collect::<Vec<_>>()
        };
        assert_eq!(w(WeightNorm::Raw), vec![0.6, 0.3, 0.5, 0.4]);
        let r = w(WeightNorm::Renormalize);
        for (a, b) in r.iter().zip([0.6 / 0.9, 0.3 / 0.9, 0.5 / 0.9, 0.4 / 0.9]) {
            assert!((a - b).abs() < 1e-15);
        }
        // DeepSpeed: token 1's surviving choice takes the whole weight.
        let r = w(WeightNorm::RenormalizeKept);
        for (a, b) in r.iter().zip([0.6 / 0.9, 0.3 / 0.9, 0.0, 1.0]) {
            assert!((a - b).abs() < 1e-15);
        }
    }

    #[test]
    fn malformed_routings_are_refused() {
        let c = layer(WeightNorm::Raw, Capacity::Dropless);
        let mut r = select(&c, probs());
        assert!(r.check(&c).is_ok());
        r.starts[1] = 3;
        assert!(r.check(&c).is_err());
        let mut r = select(&c, probs());
        r.assignments[0].expert = 7;
        assert!(r.check(&c).unwrap_err().to_string().contains("3 experts"));
        let other = MoeConfig { tokens: 3, ..c };
        assert!(select(&c, probs()).check(&other).is_err());
    }
}
