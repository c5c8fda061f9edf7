//! The router's decisions: every (token, expert) assignment — the expert the router chose,
//! the one that serves it, its probability and combine weight, whether it kept a slot,
//! whether it was rerouted — grouped by token, and the slots per expert. What token and
//! expert choice produce and what the expert side (CPU, reference, CUDA) consumes.

use crate::config::MoeConfig;
use kernel_common::{error::Result, KernelError};
use std::cmp::Ordering;

/// The order every selection ranks probabilities in: the higher first, a NaN (a row with a
/// NaN or infinite logit softmaxes to all NaN) before every probability whatever its sign bit
/// (`torch.topk` ranks NaN largest too), so equal keys fall to the caller's tie-break (the
/// lower index). The CUDA router and capacity kernels rank the same way (`moe.cu`'s
/// `rank_key`).
pub fn higher_first(x: f64, y: f64) -> Ordering {
    let key = |p: f64| if p.is_nan() { f64::INFINITY } else { p };
    key(y).total_cmp(&key(x))
}

/// One (token, expert) assignment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assignment {
    pub token: usize,
    /// Token choice: 0 for the token's most probable expert. Expert choice: the position
    /// among the experts that took the token, most probable first.
    pub rank: usize,
    /// The expert the router chose (token choice: the rank-th most probable).
    pub chosen: usize,
    /// The expert that serves it: `chosen`, or where `reroute` moved it.
    pub expert: usize,
    /// Router probability of `expert` for this token.
    pub prob: f64,
    /// Combine weight (`WeightNorm`); 0 for a dropped assignment under `renormalize_kept`.
    pub weight: f64,
    /// Whether `expert` had a slot for it.
    pub kept: bool,
    /// Whether it was moved from `chosen` to another expert.
    pub rerouted: bool,
}

/// What the router decided for a batch of tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// Softmax probabilities, tokens × experts.
    pub probs: Vec<f64>,
    /// Every assignment, grouped by token in token order (token choice: k per token in rank
    /// order; expert choice: 0..=experts per token).
    pub assignments: Vec<Assignment>,
    /// Token t's assignments are `assignments[starts[t]..starts[t + 1]]` (tokens + 1 entries).
    pub starts: Vec<usize>,
    /// Slots per expert (None: dropless token choice).
    pub capacity: Option<usize>,
}

impl Routing {
    /// Token `t`'s assignments.
    pub fn of_token(&self, t: usize) -> &[Assignment] {
        &self.assignments[self.starts[t]..self.starts[t + 1]]
    }

    /// Tokens routed.
    pub fn tokens(&self) -> usize {
        self.starts.len() - 1
    }

    /// Checks that these decisions describe `cfg`'s batch (what the expert side relies on).
    pub fn check(&self, cfg: &MoeConfig) -> Result<()> {
        let bad = |m: String| Err(KernelError::BadBuffer(m));
        if self.starts.len() != cfg.tokens + 1
            || self.starts.first() != Some(&0)
            || self.starts.last() != Some(&self.assignments.len())
            || self.starts.windows(2).any(|w| w[0] > w[1])
        {
            return bad(format!(
                "routing has {} token starts over {} assignments, expected tokens + 1 = {} \
                 ascending from 0",
                self.starts.len(),
                self.assignments.len(),
                cfg.tokens + 1
            ));
        }
        if let Some(k) = cfg.top_k() {
            if self.assignments.len() != cfg.tokens * k {
                return bad(format!(
                    "routing has {} assignments, expected tokens × top_k = {}",
                    self.assignments.len(),
                    cfg.tokens * k
                ));
            }
        }
        for t in 0..cfg.tokens {
            if let Some(a) = self
                .of_token(t)
                .iter()
                .find(|a| a.token != t || a.expert >= cfg.experts)
            {
                return bad(format!(
                    "assignment {a:?} is filed under token {t} of {} experts",
                    cfg.experts
                ));
            }
        }
        Ok(())
    }
}
