//! Routing statistics of one call: load per expert before and after capacity, drops and
//! reroutes, tokens served by no expert or by several (what expert choice trades drops
//! for), the max/mean imbalance, the busiest 20% of experts' share (claim C14) and Switch
//! Transformer's balance loss.

use crate::decision::Routing;

/// Routing statistics of one call.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingStats {
    /// Assignments the router sent to each expert before capacity (token choice: the
    /// top-k choices; expert choice: the tokens each took).
    pub routed: Vec<usize>,
    /// Assignments each expert kept (rerouted arrivals included).
    pub kept: Vec<usize>,
    pub assignments: usize,
    pub dropped: usize,
    /// dropped / assignments.
    pub drop_rate: f64,
    /// Assignments moved to another expert by `reroute` (counted in `kept`, not `dropped`).
    pub rerouted: usize,
    /// Tokens no expert serves (every assignment dropped, or no expert took them).
    pub unserved_tokens: usize,
    /// Tokens two or more experts serve.
    pub multi_served_tokens: usize,
    /// Kept assignments per token.
    pub experts_per_token: f64,
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
        let tokens = self.tokens();
        let mut routed = vec![0usize; experts];
        let mut kept = vec![0usize; experts];
        for a in &self.assignments {
            routed[a.chosen] += 1;
            kept[a.expert] += a.kept as usize;
        }
        let served: Vec<usize> = (0..tokens)
            .map(|t| self.of_token(t).iter().filter(|a| a.kept).count())
            .collect();
        let kept_total: usize = kept.iter().sum();
        let dropped = total - kept_total;
        let mean = total as f64 / experts as f64;
        let mut sorted = routed.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let busiest = experts.div_ceil(5);
        let mean_prob =
            |i: usize| self.probs.iter().skip(i).step_by(experts).sum::<f64>() / tokens as f64;
        let share = |n: usize| n as f64 / total.max(1) as f64;
        let balance_loss = experts as f64
            * (0..experts)
                .map(|i| share(routed[i]) * mean_prob(i))
                .sum::<f64>();
        RoutingStats {
            assignments: total,
            drop_rate: share(dropped),
            rerouted: self.assignments.iter().filter(|a| a.rerouted).count(),
            unserved_tokens: served.iter().filter(|&&n| n == 0).count(),
            multi_served_tokens: served.iter().filter(|&&n| n >= 2).count(),
            experts_per_token: kept_total as f64 / tokens as f64,
            imbalance: sorted[0] as f64 / mean,
            top20_share: share(sorted[..busiest].iter().sum::<usize>()),
            balance_loss,
            routed,
            kept,
            dropped,
        }
    }
}
