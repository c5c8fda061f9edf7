//! The MoE layer's descriptor: token count, model and expert widths, number of experts, who
//! chooses (each token its top-k experts — GShard, Switch, Mixtral, DeepSpeed-MoE, Tutel — or
//! each expert its top-c tokens — expert choice, Zhou et al. 2022), the priority policy that
//! decides which assignments an over-full expert keeps, how router probabilities become
//! combine weights, and the capacity: slots per expert from a factor with DeepSpeed's
//! `min_capacity` floor, or dropless as Mixtral runs at inference.
//!
//! Capacity, exactly:
//! - token choice: ⌈T·k·cf / E⌉ slots per expert, at least `min_capacity` (DeepSpeed-MoE
//!   `_capacity`: ⌈T/E · k·cf⌉, the same number up to floating-point rounding of the
//!   product; `min_capacity` defaults to 1 here and to 4 or 8 in DeepSpeed). Tutel rounds
//!   differently (k·⌊cf·⌈T/E⌉⌋); give it as `capacity` and `min_capacity` if you need it.
//! - expert choice: c = ⌊T·cf / E⌋ tokens per expert (Zhou et al.'s k = n·c/e, with the
//!   truncation of T5X/Flaxformer's `int(...)`), at least `min_capacity`, at most T;
//!   `dropless` means c = T (every expert takes every token: the dense softmax mixture).
//!
//! A factor that gives 0 slots (`min_capacity` 0 and ⌊T·cf/E⌋ = 0) is an error.

use kernel_common::{error::Result, KernelError};

/// How the router's probabilities become combine weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightNorm {
    /// w = p / Σ p over the token's k assignments, before capacity (Mixtral, Tutel's
    /// `normalize_gate`): a token that loses a choice keeps the other's weight below 1.
    Renormalize,
    /// w = p (Switch Transformer, expert choice).
    Raw,
    /// w = p / Σ p over the token's assignments that survived capacity (DeepSpeed-MoE
    /// `top2gating` and `topkgating`, expert choice renormalised over the experts that took
    /// the token): a token that loses one of two choices gives the other weight 1.
    RenormalizeKept,
}

impl WeightNorm {
    /// Every rule, in the order `parse` documents them.
    pub const ALL: [WeightNorm; 3] = [
        WeightNorm::Renormalize,
        WeightNorm::Raw,
        WeightNorm::RenormalizeKept,
    ];

    /// The name used by grids, case files and CSVs.
    pub fn name(self) -> &'static str {
        match self {
            WeightNorm::Renormalize => "renormalize",
            WeightNorm::Raw => "raw",
            WeightNorm::RenormalizeKept => "renormalize_kept",
        }
    }

    /// `renormalize`, `raw` or `renormalize_kept`.
    pub fn parse(text: &str) -> Result<WeightNorm> {
        Self::ALL
            .into_iter()
            .find(|n| n.name() == text)
            .ok_or_else(|| {
                KernelError::Unsupported(format!(
                    "norm '{text}' is not renormalize, raw or renormalize_kept"
                ))
            })
    }
}

/// Which assignments an expert keeps when more than its capacity route to it (token choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// `order`: token-major — the first tokens in, each token's choices together (DeepSpeed
    /// `topkgating` with `drop_policy="position"`, Switch top-1).
    TokenOrder,
    /// `gshard`: rank-major — every token's first choice claims a slot before any token's
    /// second choice, tokens in order within a rank (GShard, DeepSpeed-MoE `top2gating`:
    /// `locations2 += sum(mask1)`, Tutel's `extract_critical`).
    RankMajor,
    /// `score`: the highest router probabilities, ties to the lower token index (DeepSpeed
    /// `topkgating` with `drop_policy="probs"`, its default).
    Score,
    /// `reroute`: `gshard`'s placement, then Switch Transformer's "No Token Left Behind"
    /// second chance: in rounds, every assignment still without a slot (in (rank, token)
    /// order) tries its token's next-best expert by probability that the token does not
    /// already hold, and takes it if it has a free slot; dropped only once it has tried
    /// every expert. A rerouted assignment is weighted by its new expert's probability.
    Reroute,
}

impl Priority {
    /// Every policy.
    pub const ALL: [Priority; 4] = [
        Priority::TokenOrder,
        Priority::RankMajor,
        Priority::Score,
        Priority::Reroute,
    ];

    /// The name used by grids, case files and CSVs.
    pub fn name(self) -> &'static str {
        match self {
            Priority::TokenOrder => "order",
            Priority::RankMajor => "gshard",
            Priority::Score => "score",
            Priority::Reroute => "reroute",
        }
    }

    /// `order`, `gshard`, `score` or `reroute`.
    pub fn parse(text: &str) -> Result<Priority> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == text)
            .ok_or_else(|| {
                KernelError::Unsupported(format!(
                    "policy '{text}' is not order, gshard, score or reroute"
                ))
            })
    }
}

/// Who chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Each token takes its `top_k` most probable experts; full experts keep by `policy`.
    Tokens { top_k: usize, policy: Priority },
    /// Each expert takes its c most probable tokens (Zhou et al. 2022): nothing is dropped,
    /// a token may be served by 0..=experts experts.
    Experts,
}

impl Choice {
    /// `token_choice` or `expert_choice`.
    pub fn routing_name(&self) -> &'static str {
        match self {
            Choice::Tokens { .. } => "token_choice",
            Choice::Experts => "expert_choice",
        }
    }
}

/// Slots per expert.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Capacity {
    /// No limit: every assignment is kept (token choice), every token taken (expert choice).
    Dropless,
    /// A capacity factor (the formulas in the module documentation).
    Factor(f64),
}

/// One MoE layer call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    pub tokens: usize,
    pub d_model: usize,
    pub d_ff: usize,
    pub experts: usize,
    pub choice: Choice,
    pub norm: WeightNorm,
    pub capacity: Capacity,
    /// The floor on slots per expert (DeepSpeed's `min_capacity`).
    pub min_capacity: usize,
}

impl MoeConfig {
    /// A token-choice layer with the default floor of one slot.
    #[allow(clippy::too_many_arguments)]
    pub fn token_choice(
        tokens: usize,
        d_model: usize,
        d_ff: usize,
        experts: usize,
        top_k: usize,
        policy: Priority,
        norm: WeightNorm,
        capacity: Capacity,
    ) -> MoeConfig {
        MoeConfig {
            tokens,
            d_model,
            d_ff,
            experts,
            choice: Choice::Tokens { top_k, policy },
            norm,
            capacity,
            min_capacity: 1,
        }
    }

    /// Experts per token (token choice), or None under expert choice.
    pub fn top_k(&self) -> Option<usize> {
        match self.choice {
            Choice::Tokens { top_k, .. } => Some(top_k),
            Choice::Experts => None,
        }
    }

    /// The priority policy (token choice), or None under expert choice.
    pub fn policy(&self) -> Option<Priority> {
        match self.choice {
            Choice::Tokens { policy, .. } => Some(policy),
            Choice::Experts => None,
        }
    }

    /// Checks every size and parameter; one clear error per problem.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(KernelError::InvalidShape(m));
        if self.tokens == 0 || self.d_model == 0 || self.d_ff == 0 {
            return bad(format!(
                "tokens ({}), d_model ({}) and d_ff ({}) must be > 0",
                self.tokens, self.d_model, self.d_ff
            ));
        }
        if self.experts == 0 {
            return bad("experts must be > 0".into());
        }
        match self.choice {
            Choice::Tokens { top_k, .. } if top_k == 0 || top_k > self.experts => {
                return bad(format!(
                    "top_k must be in 1..={} (the number of experts), got {top_k}",
                    self.experts
                ));
            }
            Choice::Experts if self.norm == WeightNorm::Renormalize => {
                return bad(
                    "expert-choice routing has no top-k to renormalise over before capacity: \
                     use norm raw (Zhou et al.) or renormalize_kept"
                        .into(),
                );
            }
            _ => {}
        }
        if let Capacity::Factor(f) = self.capacity {
            if !(f.is_finite() && f > 0.0) {
                return bad(format!("capacity factor must be finite and > 0, got {f}"));
            }
            if self.capacity_slots() == Some(0) {
                return bad(format!(
                    "capacity factor {f} gives 0 slots per expert ({} tokens, {} experts) and \
                     min_capacity is 0: raise either",
                    self.tokens, self.experts
                ));
            }
        }
        Ok(())
    }

    /// Slots per expert, or None when a token-choice layer is dropless.
    pub fn capacity_slots(&self) -> Option<usize> {
        let (t, e) = (self.tokens as f64, self.experts as f64);
        match (self.choice, self.capacity) {
            (Choice::Tokens { .. }, Capacity::Dropless) => None,
            (Choice::Tokens { top_k, .. }, Capacity::Factor(f)) => {
                let slots = (t * top_k as f64 * f / e).ceil() as usize;
                Some(slots.max(self.min_capacity))
            }
            (Choice::Experts, Capacity::Dropless) => Some(self.tokens),
            (Choice::Experts, Capacity::Factor(f)) => {
                let c = (t * f / e).floor() as usize;
                Some(c.max(self.min_capacity).min(self.tokens))
            }
        }
    }

    /// Parameters of one expert (gate, up and down projections).
    pub fn expert_params(&self) -> usize {
        3 * self.d_model * self.d_ff
    }

    /// `t1024 d512 ff1024 e8 k2 gshard renormalize cf1.25`, `... e8 ec raw cf2 min4`.
    pub fn label(&self) -> String {
        let cap = match self.capacity {
            Capacity::Dropless => "dropless".to_string(),
            Capacity::Factor(f) => format!("cf{f}"),
        };
        let who = match self.choice {
            Choice::Tokens { top_k, policy } => format!("k{top_k} {}", policy.name()),
            Choice::Experts => "ec".to_string(),
        };
        let floor = if self.min_capacity == 1 {
            String::new()
        } else {
            format!(" min{}", self.min_capacity)
        };
        format!(
            "t{} d{} ff{} e{} {who} {} {cap}{floor}",
            self.tokens,
            self.d_model,
            self.d_ff,
            self.experts,
            self.norm.name()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> MoeConfig {
        MoeConfig::token_choice(
            10,
            4,
            6,
            8,
            2,
            Priority::Score,
            WeightNorm::Renormalize,
            Capacity::Factor(1.2),
        )
    }

    #[test]
    fn capacity_follows_the_formula() {
        // ceil(10 · 2 · 1.2 / 8) = ceil(3.0) = 3
        assert_eq!(cfg().capacity_slots(), Some(3));
        let c = MoeConfig {
            capacity: Capacity::Factor(1.25),
            ..cfg()
        };
        assert_eq!(c.capacity_slots(), Some(4)); // ceil(3.125)
        let floored = MoeConfig {
            min_capacity: 8,
            ..c
        };
        assert_eq!(floored.capacity_slots(), Some(8));
        let d = MoeConfig {
            capacity: Capacity::Dropless,
            ..cfg()
        };
        assert_eq!(d.capacity_slots(), None);
        // Expert choice: floor(10 · 2.0 / 8) = 2, floored by min_capacity, at most T.
        let ec = MoeConfig {
            choice: Choice::Experts,
            norm: WeightNorm::Raw,
            capacity: Capacity::Factor(2.0),
            ..cfg()
        };
        assert_eq!(ec.capacity_slots(), Some(2));
        assert_eq!(
            MoeConfig {
                min_capacity: 50,
                ..ec
            }
            .capacity_slots(),
            Some(10)
        );
        assert_eq!(
            MoeConfig {
                capacity: Capacity::Dropless,
                ..ec
            }
            .capacity_slots(),
            Some(10)
        );
    }

    #[test]
    fn names_round_trip() {
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.name()).unwrap(), p);
        }
        for n in WeightNorm::ALL {
            assert_eq!(WeightNorm::parse(n.name()).unwrap(), n);
        }
        assert!(Priority::parse("random")
            .unwrap_err()
            .to_string()
            .contains("gshard"));
        assert!(WeightNorm::parse("softmax")
            .unwrap_err()
            .to_string()
            .contains("renormalize_kept"));
    }

    #[test]
    fn bad_configs_are_errors() {
        let ec = MoeConfig {
            choice: Choice::Experts,
            norm: WeightNorm::Raw,
            ..cfg()
        };
        let tokens = |top_k| Choice::Tokens {
            top_k,
            policy: Priority::Score,
        };
        for (c, needle) in [
            (
                MoeConfig {
                    choice: tokens(0),
                    ..cfg()
                },
                "top_k",
            ),
            (
                MoeConfig {
                    choice: tokens(9),
                    ..cfg()
                },
                "top_k",
            ),
            (
                MoeConfig {
                    capacity: Capacity::Factor(0.0),
                    ..cfg()
                },
                "capacity",
            ),
            (
                MoeConfig {
                    capacity: Capacity::Factor(f64::NAN),
                    ..cfg()
                },
                "capacity",
            ),
            (MoeConfig { d_ff: 0, ..cfg() }, "d_ff"),
            (
                MoeConfig {
                    experts: 0,
                    choice: tokens(0),
                    ..cfg()
                },
                "experts",
            ),
            (
                MoeConfig {
                    norm: WeightNorm::Renormalize,
                    ..ec
                },
                "no top-k",
            ),
            // floor(10 · 0.5 / 8) = 0 slots with no floor.
            (
                MoeConfig {
                    capacity: Capacity::Factor(0.5),
                    min_capacity: 0,
                    ..ec
                },
                "0 slots",
            ),
        ] {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        assert!(cfg().validate().is_ok());
        // Token choice rounds up: a tiny factor still gives one slot without a floor.
        let tiny = MoeConfig {
            capacity: Capacity::Factor(0.001),
            min_capacity: 0,
            ..cfg()
        };
        assert_eq!(tiny.capacity_slots(), Some(1));
        assert!(tiny.validate().is_ok());
        assert!(MoeConfig {
            capacity: Capacity::Factor(0.5),
            ..ec
        }
        .validate()
        .is_ok());
    }
}
