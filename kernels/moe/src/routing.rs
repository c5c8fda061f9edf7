//! The router: logits = x·W_gate + bias (the bias is the experiments' skew knob), softmax per
//! token, top-k with ties to the lower expert index (GShard/Switch/Mixtral), combine weights
//! (renormalised or raw), then capacity: each expert keeps at most its slots under the drop
//! policy and the rest of its assignments are dropped (those tokens contribute nothing through
//! it; the residual stream carries them). `route` is the optimised f32 router (one GEMM for the
//! logits); `route_reference` computes the probabilities in f64. Selection and capacity are
//! one function, `select`, shared by both, so a test can hand either the other's decisions.

use crate::config::{DropPolicy, MoeConfig, WeightNorm};
use kernel_common::{error::Result, KernelError};
use kernel_cpu::gemm::{sgemm, Strides};
use rayon::prelude::*;

/// One (token, rank) choice of the router.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assignment {
    pub token: usize,
    /// 0 for the token's most probable expert.
    pub rank: usize,
    pub expert: usize,
    /// Router probability of this expert for this token.
    pub prob: f64,
    /// Combine weight (renormalised or raw probability).
    pub weight: f64,
    /// Whether the expert had a slot for it.
    pub kept: bool,
}

/// What the router decided for a batch of tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// Softmax probabilities, tokens × experts.
    pub probs: Vec<f64>,
    /// tokens × top_k assignments in (token, rank) order.
    pub assignments: Vec<Assignment>,
    /// Slots per expert (None: dropless).
    pub capacity: Option<usize>,
}

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

/// The optimised router: logits by one f32 GEMM, softmax and selection per token in parallel.
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

/// Top-k, combine weights and capacity from per-token probabilities (tokens × experts).
pub fn select(cfg: &MoeConfig, probs: Vec<f64>) -> Routing {
    let (e, k) = (cfg.experts, cfg.top_k);
    let mut assignments = Vec::with_capacity(cfg.tokens * k);
    let mut order: Vec<usize> = (0..e).collect();
    for (token, p) in probs.chunks(e).enumerate() {
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let chosen = &order[..k];
        let sum: f64 = chosen.iter().map(|&j| p[j]).sum();
        for (rank, &expert) in chosen.iter().enumerate() {
            let weight = match cfg.norm {
                WeightNorm::Renormalize => p[expert] / sum,
                WeightNorm::Raw => p[expert],
            };
            assignments.push(Assignment {
                token,
                rank,
                expert,
                prob: p[expert],
                weight,
                kept: true,
            });
        }
    }
    let capacity = cfg.capacity_slots();
    if let Some(cap) = capacity {
        let mut per_expert: Vec<Vec<usize>> = vec![vec![]; e];
        for (i, a) in assignments.iter().enumerate() {
            per_expert[a.expert].push(i);
        }
        for list in &mut per_expert {
            if list.len() <= cap {
                continue;
            }
            if cfg.policy == DropPolicy::Score {
                list.sort_by(|&a, &b| {
                    let (x, y) = (&assignments[a], &assignments[b]);
                    y.prob.total_cmp(&x.prob).then(x.token.cmp(&y.token))
                });
            }
            for &i in &list[cap..] {
                assignments[i].kept = false;
            }
        }
    }
    Routing {
        probs,
        assignments,
        capacity,
    }
}

/// Routing statistics of one call.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingStats {
    /// Assignments routed to each expert before capacity.
    pub routed: Vec<usize>,
    /// Assignments each expert kept.
    pub kept: Vec<usize>,
    pub dropped: usize,
    /// dropped / (tokens · k).
    pub drop_rate: f64,
    /// max / mean of `routed`.
    pub imbalance: f64,
    /// Share of all routed assignments taken by the busiest ⌈20%⌉ of experts (claim C14).
    pub top20_share: f64,
    /// Switch Transformer's balance loss without α: N · Σ_i f_i · P_i, f_i the fraction of
    /// assignments routed to expert i, P_i its mean router probability; 1 when balanced.
    pub balance_loss: f64,
}

impl Routing {
    /// Statistics of these decisions.
    pub fn stats(&self, experts: usize) -> RoutingStats {
        let total = self.assignments.len();
        let mut routed = vec![0usize; experts];
        let mut kept = vec![0usize; experts];
        for a in &self.assignments {
            routed[a.expert] += 1;
            kept[a.expert] += a.kept as usize;
        }
        let dropped = total - kept.iter().sum::<usize>();
        let mean = total as f64 / experts as f64;
        let mut sorted = routed.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let busiest = experts.div_ceil(5);
        let tokens = self.probs.len() / experts;
        let mean_prob =
            |i: usize| self.probs.iter().skip(i).step_by(experts).sum::<f64>() / tokens as f64;
        let balance_loss = experts as f64
            * (0..experts)
                .map(|i| routed[i] as f64 / total as f64 * mean_prob(i))
                .sum::<f64>();
        RoutingStats {
            drop_rate: dropped as f64 / total as f64,
            imbalance: sorted[0] as f64 / mean,
            top20_share: sorted[..busiest].iter().sum::<usize>() as f64 / total as f64,
            balance_loss,
            routed,
            kept,
            dropped,
        }
    }
}
