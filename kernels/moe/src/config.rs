//! The MoE layer's descriptor: token count, model and expert widths, number of experts, top-k,
//! how the selected probabilities become combine weights (Mixtral renormalises them, Switch
//! keeps the raw softmax), the capacity (GShard/Switch: ⌈tokens·k·factor / experts⌉ slots per
//! expert, or dropless as Mixtral runs at inference) and which assignments an over-full
//! expert keeps (by token order, or by router score with ties to the lower token index).

use kernel_common::{error::Result, KernelError};

/// How the k selected probabilities become combine weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightNorm {
    /// w = p / Σ selected p (Mixtral): weights sum to 1 per token.
    Renormalize,
    /// w = p (Switch Transformer).
    Raw,
}

/// Slots per expert.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Capacity {
    /// No limit: every assignment is kept (the plain mixture).
    Dropless,
    /// ⌈tokens·k·factor / experts⌉ slots per expert.
    Factor(f64),
}

/// Which assignments an expert keeps when more than its capacity route to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropPolicy {
    /// The first ones in (token, rank) order.
    TokenOrder,
    /// The highest router probabilities; ties go to the lower token index.
    Score,
}

/// One MoE layer call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    pub tokens: usize,
    pub d_model: usize,
    pub d_ff: usize,
    pub experts: usize,
    pub top_k: usize,
    pub norm: WeightNorm,
    pub capacity: Capacity,
    pub policy: DropPolicy,
}

impl MoeConfig {
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
        if self.top_k == 0 || self.top_k > self.experts {
            return bad(format!(
                "top_k must be in 1..={} (the number of experts), got {}",
                self.experts, self.top_k
            ));
        }
        if let Capacity::Factor(f) = self.capacity {
            if !(f.is_finite() && f > 0.0) {
                return bad(format!("capacity factor must be finite and > 0, got {f}"));
            }
        }
        Ok(())
    }

    /// Slots per expert, or None when dropless.
    pub fn capacity_slots(&self) -> Option<usize> {
        match self.capacity {
            Capacity::Dropless => None,
            Capacity::Factor(f) => Some(
                ((self.tokens * self.top_k) as f64 * f / self.experts as f64)
                    .ceil()
                    .max(1.0) as usize,
            ),
        }
    }

    /// Parameters of one expert (gate, up and down projections).
    pub fn expert_params(&self) -> usize {
        3 * self.d_model * self.d_ff
    }

    /// `t1024 d512 ff1024 e8 k2 cf1.25`.
    pub fn label(&self) -> String {
        let cap = match self.capacity {
            Capacity::Dropless => "dropless".to_string(),
            Capacity::Factor(f) => format!("cf{f}"),
        };
        format!(
            "t{} d{} ff{} e{} k{} {cap}",
            self.tokens, self.d_model, self.d_ff, self.experts, self.top_k
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> MoeConfig {
        MoeConfig {
            tokens: 10,
            d_model: 4,
            d_ff: 6,
            experts: 8,
            top_k: 2,
            norm: WeightNorm::Renormalize,
            capacity: Capacity::Factor(1.2),
            policy: DropPolicy::Score,
        }
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
        let d = MoeConfig {
            capacity: Capacity::Dropless,
            ..cfg()
        };
        assert_eq!(d.capacity_slots(), None);
    }

    #[test]
    fn bad_configs_are_errors() {
        for (c, needle) in [
            (MoeConfig { top_k: 0, ..cfg() }, "top_k"),
            (MoeConfig { top_k: 9, ..cfg() }, "top_k"),
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
                    top_k: 0,
                    ..cfg()
                },
                "experts",
            ),
        ] {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        assert!(cfg().validate().is_ok());
    }
}
