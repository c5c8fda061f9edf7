//! The moe experiment's grid: layers (experts, tokens, widths, router skew), each with one
//! seeded set of weights and tokens, and at each layer every routing convention of the grid
//! — token choice: top_k × policy × norm × capacity × min_capacity; expert choice: the grid's
//! `raw` and `renormalize_kept` norms × capacity × min_capacity (it has no top-k and no
//! policy) — so every convention of a layer routes the same tokens through the same experts.

use crate::error::{HarnessError, Result};
use crate::run_files::GridValues;
use kernel_moe::{parse_capacity, Capacity, Choice, MoeConfig, Priority, WeightNorm};
use std::collections::BTreeMap;

fn usage(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Usage(e.to_string())
}

/// One layer of the grid: its shape and router skew.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Layer {
    pub experts: usize,
    pub tokens: usize,
    pub d_model: usize,
    pub d_ff: usize,
    pub skew: f64,
}

/// The parsed grid.
pub struct MoeGrid {
    capacities: Vec<Capacity>,
    skews: Vec<f64>,
    top_ks: Vec<usize>,
    experts: Vec<usize>,
    tokens: Vec<usize>,
    d_models: Vec<usize>,
    d_ffs: Vec<usize>,
    policies: Vec<Priority>,
    norms: Vec<WeightNorm>,
    min_capacities: Vec<usize>,
    token_choice: bool,
    expert_choice: bool,
}

impl MoeGrid {
    /// Parses and validates every point: nothing is run before the whole grid is good.
    pub fn parse(grid: &BTreeMap<String, Vec<String>>) -> Result<MoeGrid> {
        let g = GridValues(grid);
        let list = |key: &str, default: &str| g.strings(key, &[default]);
        let positive = |key: &str, default: &str| g.counts(key, &[default]);
        let routings = list("routing", "token_choice");
        for r in &routings {
            if r != "token_choice" && r != "expert_choice" {
                return Err(usage(format!(
                    "routing '{r}' is not token_choice or expert_choice"
                )));
            }
        }
        let parsed = MoeGrid {
            capacities: list("capacity", "1.25")
                .iter()
                .map(|c| parse_capacity(c).map_err(usage))
                .collect::<Result<_>>()?,
            skews: g.parsed("skew", &["0"], "a number >= 0", |s: f64| {
                s.is_finite() && s >= 0.0
            })?,
            top_ks: positive("top_k", "2")?,
            experts: positive("experts", "8")?,
            tokens: positive("tokens", "1024")?,
            d_models: positive("d_model", "512")?,
            d_ffs: positive("d_ff", "1024")?,
            policies: list("policy", "score")
                .iter()
                .map(|p| Priority::parse(p).map_err(usage))
                .collect::<Result<_>>()?,
            norms: list("norm", "renormalize")
                .iter()
                .map(|n| WeightNorm::parse(n).map_err(usage))
                .collect::<Result<_>>()?,
            min_capacities: g.parsed("min_capacity", &["1"], "an integer >= 0", |_: usize| true)?,
            token_choice: routings.iter().any(|r| r == "token_choice"),
            expert_choice: routings.iter().any(|r| r == "expert_choice"),
        };
        if parsed.expert_choice && parsed.expert_choice_norms().is_empty() {
            return Err(usage(
                "routing=expert_choice: none of the grid's norms applies (expert choice has no \
                 top-k to renormalise over before capacity); add norm=raw or renormalize_kept",
            ));
        }
        for layer in parsed.layers() {
            for cfg in parsed.conventions(&layer) {
                cfg.validate().map_err(usage)?;
            }
        }
        Ok(parsed)
    }

    fn expert_choice_norms(&self) -> Vec<WeightNorm> {
        self.norms
            .iter()
            .copied()
            .filter(|&n| n != WeightNorm::Renormalize)
            .collect()
    }

    /// Every layer: shape × skew.
    pub fn layers(&self) -> Vec<Layer> {
        let mut out = vec![];
        for &experts in &self.experts {
            for &tokens in &self.tokens {
                for &d_model in &self.d_models {
                    for &d_ff in &self.d_ffs {
                        for &skew in &self.skews {
                            out.push(Layer {
                                experts,
                                tokens,
                                d_model,
                                d_ff,
                                skew,
                            });
                        }
                    }
                }
            }
        }
        out
    }

    /// Every convention at `layer`, token choice first.
    pub fn conventions(&self, layer: &Layer) -> Vec<MoeConfig> {
        let at = |choice, norm, capacity, min_capacity| MoeConfig {
            tokens: layer.tokens,
            d_model: layer.d_model,
            d_ff: layer.d_ff,
            experts: layer.experts,
            choice,
            norm,
            capacity,
            min_capacity,
        };
        let mut out = vec![];
        let mut each_capacity = |choice: Choice, norm: WeightNorm| {
            for &capacity in &self.capacities {
                for &min_capacity in &self.min_capacities {
                    out.push(at(choice, norm, capacity, min_capacity));
                }
            }
        };
        if self.token_choice {
            for &top_k in &self.top_ks {
                for &policy in &self.policies {
                    for &norm in &self.norms {
                        each_capacity(Choice::Tokens { top_k, policy }, norm);
                    }
                }
            }
        }
        if self.expert_choice {
            for norm in self.expert_choice_norms() {
                each_capacity(Choice::Experts, norm);
            }
        }
        out
    }

    /// Grid points (layer × convention).
    pub fn points(&self) -> usize {
        self.layers()
            .iter()
            .map(|l| self.conventions(l).len())
            .sum()
    }
}

/// The same convention without a capacity limit: the yardstick of `out_rel_err_vs_dropless`.
pub fn dropless(cfg: &MoeConfig) -> MoeConfig {
    MoeConfig {
        capacity: Capacity::Dropless,
        ..*cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn conventions_cross_token_choice_and_add_expert_choice() {
        let g = MoeGrid::parse(&grid(&[
            ("capacity", &["1.0", "dropless"]),
            ("top_k", &["1", "2"]),
            ("policy", &["gshard", "reroute"]),
            ("norm", &["renormalize", "renormalize_kept"]),
            ("routing", &["token_choice", "expert_choice"]),
            ("tokens", &["64"]),
            ("d_model", &["8"]),
            ("d_ff", &["8"]),
        ]))
        .unwrap();
        let layers = g.layers();
        assert_eq!(layers.len(), 1);
        let c = g.conventions(&layers[0]);
        // 2 k × 2 policies × 2 norms × 2 capacities, then expert choice with the one
        // norm it takes × 2 capacities.
        assert_eq!(c.len(), 16 + 2);
        assert!(c[16..]
            .iter()
            .all(|c| c.choice == Choice::Experts && c.norm == WeightNorm::RenormalizeKept));
        assert_eq!(g.points(), 18);
    }

    #[test]
    fn bad_grids_are_usage_errors() {
        for (pairs, needle) in [
            (&[("policy", &["random"][..])][..], "policy 'random'"),
            (&[("norm", &["softmax"][..])][..], "norm 'softmax'"),
            (&[("routing", &["both"][..])][..], "routing 'both'"),
            (&[("min_capacity", &["-1"][..])][..], "min_capacity"),
            (
                &[("routing", &["expert_choice"][..])][..],
                "none of the grid's norms",
            ),
            (
                &[
                    ("routing", &["expert_choice"][..]),
                    ("norm", &["raw"][..]),
                    ("min_capacity", &["0"][..]),
                    ("capacity", &["0.5"][..]),
                    ("tokens", &["8"][..]),
                ][..],
                "0 slots",
            ),
        ] {
            let e = MoeGrid::parse(&grid(pairs))
                .err()
                .expect("an error")
                .to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}
