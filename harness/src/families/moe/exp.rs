//! `harness exp` for the moe family: for each (experts, top_k, skew, sizes), one seeded layer
//! and one batch of tokens; the dropless routing's f64 output on 64 sampled tokens is the
//! yardstick. Then for each capacity, policy and weight rule: the f32 router's decisions and
//! their statistics (drops, imbalance, the busiest 20%'s share, balance loss), each expert
//! variant checked on NaN-poisoned output against the f64 reference of the same decisions,
//! the output's distance from the dropless layer, and the whole layer (router + experts) timed
//! with caches flushed.

use crate::error::{HarnessError, Result};
use crate::measure::{time_reps, CacheFlusher};
use crate::provenance::Provenance;
use crate::render::{fmt_err, fmt_opt};
use crate::render::{report, Rendered};
use crate::row::{Head, Row};
use crate::run_files::{spread, ExpRequest, GridValues, RunFiles};
use crate::spec::ExperimentSpec;
use crate::sweep::PointKey;
use kernel_common::inputs::{derive_seed, normal_buffer_par};
use kernel_common::{tolerance, DType, ErrorStats, KernelError};
use moe_kernels::reference::experts_reference;
use moe_kernels::{
    experts_forward, parse_capacity, route, Capacity, DropPolicy, MoeConfig, MoeWeights, WeightNorm,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One variant at one grid point. Column names are stable.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MoeCols {
    /// `e8 k2` (the plots' panels)
    pub config: String,
    pub tokens: usize,
    pub d_model: usize,
    pub d_ff: usize,
    pub experts: usize,
    pub top_k: usize,
    /// A factor or `dropless`.
    pub capacity: String,
    /// The factor (empty when dropless).
    pub capacity_factor: Option<f64>,
    pub capacity_slots: Option<usize>,
    pub skew: f64,
    pub policy: String,
    pub norm: String,
    /// Useful FLOPs of the call (router + kept assignments' SwiGLU) / median.
    pub gflops: Option<f64>,
    pub flops: u64,
    pub dropped: usize,
    pub drop_rate: f64,
    /// Busiest expert's routed load / mean load.
    pub imbalance: f64,
    /// Share of routed assignments taken by the busiest ⌈20%⌉ of experts (C14).
    pub top20_share: f64,
    /// Switch's N·Σ f_i·P_i (1 when balanced).
    pub balance_loss: f64,
    /// Relative L2 distance of the sampled tokens' output from the dropless layer's (f64).
    pub out_rel_err_vs_dropless: Option<f64>,
    /// Against the f64 reference of the same routing (the correctness check).
    pub rel_l2_err: Option<f64>,
    pub max_abs_err: Option<f64>,
    pub checked_tokens: usize,
    /// Parameters one token touches (router + k experts) and the layer holds (C15).
    pub active_params: u64,
    pub total_params: u64,
    pub active_ratio: f64,
}

/// A row: the shared head, these columns, the note.
pub type MoeRow = Row<MoeCols>;

fn usage(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Usage(e.to_string())
}

/// The parsed grid.
struct MoeGrid {
    capacities: Vec<Capacity>,
    skews: Vec<f64>,
    top_ks: Vec<usize>,
    experts: Vec<usize>,
    tokens: Vec<usize>,
    d_models: Vec<usize>,
    d_ffs: Vec<usize>,
    policies: Vec<DropPolicy>,
    norms: Vec<WeightNorm>,
}

fn policy_name(p: DropPolicy) -> &'static str {
    match p {
        DropPolicy::Score => "score",
        DropPolicy::TokenOrder => "order",
    }
}

fn norm_name(n: WeightNorm) -> &'static str {
    match n {
        WeightNorm::Renormalize => "renormalize",
        WeightNorm::Raw => "raw",
    }
}

impl MoeGrid {
    fn parse(grid: &BTreeMap<String, Vec<String>>) -> Result<MoeGrid> {
        let g = GridValues(grid);
        let list = |key: &str, default: &str| g.strings(key, &[default]);
        let positive = |key: &str, default: &str| g.counts(key, &[default]);
        Ok(MoeGrid {
            capacities: list("capacity", "1.25")
                .iter()
                .map(|c| parse_capacity(c).map_err(usage))
                .collect::<Result<_>>()?,
            skews: list("skew", "0")
                .iter()
                .map(|v| match v.parse::<f64>() {
                    Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
                    _ => Err(HarnessError::Usage(format!(
                        "skew '{v}' is not a number >= 0"
                    ))),
                })
                .collect::<Result<_>>()?,
            top_ks: positive("top_k", "2")?,
            experts: positive("experts", "8")?,
            tokens: positive("tokens", "1024")?,
            d_models: positive("d_model", "512")?,
            d_ffs: positive("d_ff", "1024")?,
            policies: list("policy", "score")
                .iter()
                .map(|p| match p.as_str() {
                    "score" => Ok(DropPolicy::Score),
                    "order" => Ok(DropPolicy::TokenOrder),
                    o => Err(HarnessError::Usage(format!(
                        "policy '{o}' is not score or order"
                    ))),
                })
                .collect::<Result<_>>()?,
            norms: list("norm", "renormalize")
                .iter()
                .map(|n| match n.as_str() {
                    "renormalize" => Ok(WeightNorm::Renormalize),
                    "raw" => Ok(WeightNorm::Raw),
                    o => Err(HarnessError::Usage(format!(
                        "norm '{o}' is not renormalize or raw"
                    ))),
                })
                .collect::<Result<_>>()?,
        })
    }

    /// Every layer shape of the grid (capacity, policy and norm vary inside), validated.
    fn shapes(&self) -> Result<Vec<MoeConfig>> {
        let mut out = vec![];
        for &experts in &self.experts {
            for &top_k in &self.top_ks {
                for &tokens in &self.tokens {
                    for &d_model in &self.d_models {
                        for &d_ff in &self.d_ffs {
                            let c = MoeConfig {
                                tokens,
                                d_model,
                                d_ff,
                                experts,
                                top_k,
                                norm: WeightNorm::Renormalize,
                                capacity: Capacity::Dropless,
                                policy: DropPolicy::Score,
                            };
                            c.validate().map_err(usage)?;
                            for cap in &self.capacities {
                                MoeConfig {
                                    capacity: *cap,
                                    ..c
                                }
                                .validate()
                                .map_err(usage)?;
                            }
                            out.push(c);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    fn per_shape(&self) -> usize {
        self.skews.len() * self.capacities.len() * self.policies.len() * self.norms.len()
    }
}

/// Runs a moe-family experiment (called by `exp::run` once the spec and grid are loaded).
pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, spec_path, grid, names, reps) = (
        req.opts,
        req.spec,
        req.spec_path,
        req.grid.clone(),
        &req.names,
        req.reps,
    );
    let mgrid = MoeGrid::parse(&grid)?;
    let shapes = mgrid.shapes()?;
    let variants = names
        .iter()
        .map(|v| crate::registry::moe_variant(v))
        .collect::<Result<Vec<_>>>()?;
    crate::require_device(
        opts.device,
        std::iter::once(Err(KernelError::Unsupported(
            "the moe family has no CUDA implementation yet".into(),
        ))),
    )?;
    let mut run = RunFiles::start(opts, spec, spec_path, grid)?;
    let bar = run.progress_bar(shapes.len() * mgrid.per_shape() * variants.len());
    let mut flusher = CacheFlusher::new();
    let mut failures = 0;
    for (si, base) in shapes.iter().enumerate() {
        for (ki, &skew) in mgrid.skews.iter().enumerate() {
            let key = PointKey::of(&[
                ("experts", &base.experts),
                ("top_k", &base.top_k),
                ("tokens", &base.tokens),
                ("d_model", &base.d_model),
                ("d_ff", &base.d_ff),
                ("skew", &skew),
            ]);
            if !run.owns(&key) {
                continue;
            }
            let mut rows = vec![];
            let seed = derive_seed(opts.seed, (si * 64 + ki) as u64);
            bar.set_message(format!("weights {} skew {skew}", base.label()));
            let w = MoeWeights::random(base, skew, seed);
            let x = normal_buffer_par(
                derive_seed(seed, 99),
                DType::F32,
                base.tokens * base.d_model,
            )
            .to_f32();
            let sampled = spread(base.tokens, 64);
            for &norm in &mgrid.norms {
                let dropless = MoeConfig { norm, ..*base };
                let r0 = route(&dropless, &x, &w.router, &w.bias)?;
                let want_dropless = experts_reference(&dropless, &w, &x, &r0, &sampled);
                for &capacity in &mgrid.capacities {
                    for &policy in &mgrid.policies {
                        let cfg = MoeConfig {
                            capacity,
                            policy,
                            norm,
                            ..*base
                        };
                        let routing = route(&cfg, &x, &w.router, &w.bias)?;
                        let stats = routing.stats(cfg.experts);
                        let want = experts_reference(&cfg, &w, &x, &routing, &sampled);
                        let kept = (cfg.tokens * cfg.top_k - stats.dropped) as u64;
                        let flops = 2 * (cfg.tokens * cfg.d_model * cfg.experts) as u64
                            + 6 * (cfg.d_model * cfg.d_ff) as u64 * kept;
                        let router_params = (cfg.d_model * cfg.experts) as u64;
                        let active = router_params + (cfg.top_k * cfg.expert_params()) as u64;
                        let total = router_params + (cfg.experts * cfg.expert_params()) as u64;
                        for (vname, variant) in &variants {
                            bar.set_message(format!("{} s{skew} {vname}", cfg.label()));
                            let mut row = Row {
                                head: Head::new(
                                    &run.run_id,
                                    &spec.name,
                                    vname,
                                    &opts.device.to_string(),
                                    seed,
                                ),
                                cols: MoeCols {
                                    config: format!("e{} k{}", cfg.experts, cfg.top_k),
                                    tokens: cfg.tokens,
                                    d_model: cfg.d_model,
                                    d_ff: cfg.d_ff,
                                    experts: cfg.experts,
                                    top_k: cfg.top_k,
                                    capacity: match capacity {
                                        Capacity::Dropless => "dropless".into(),
                                        Capacity::Factor(f) => f.to_string(),
                                    },
                                    capacity_factor: match capacity {
                                        Capacity::Dropless => None,
                                        Capacity::Factor(f) => Some(f),
                                    },
                                    capacity_slots: routing.capacity,
                                    skew,
                                    policy: policy_name(policy).into(),
                                    norm: norm_name(norm).into(),
                                    gflops: None,
                                    flops,
                                    dropped: stats.dropped,
                                    drop_rate: stats.drop_rate,
                                    imbalance: stats.imbalance,
                                    top20_share: stats.top20_share,
                                    balance_loss: stats.balance_loss,
                                    out_rel_err_vs_dropless: None,
                                    rel_l2_err: None,
                                    max_abs_err: None,
                                    checked_tokens: sampled.len(),
                                    active_params: active,
                                    total_params: total,
                                    active_ratio: active as f64 / total as f64,
                                },
                                note: String::new(),
                            };
                            let d = cfg.d_model;
                            let mut out = vec![f32::NAN; cfg.tokens * d];
                            match experts_forward(&cfg, &w, &x, &routing, *variant, &mut out) {
                                Err(e) => {
                                    row.head.status = "error".into();
                                    row.note = e.to_string();
                                }
                                Ok(()) => {
                                    let got: Vec<f32> = sampled
                                        .iter()
                                        .flat_map(|&t| out[t * d..(t + 1) * d].to_vec())
                                        .collect();
                                    let s = ErrorStats::compare(&got, &want);
                                    row.rel_l2_err = Some(s.rel_l2);
                                    row.max_abs_err = Some(s.max_abs);
                                    row.out_rel_err_vs_dropless =
                                        Some(ErrorStats::compare(&got, &want_dropless).rel_l2);
                                    let unwritten = out.iter().filter(|v| !v.is_finite()).count();
                                    let ok = unwritten == 0
                                        && s.passes(&tolerance(DType::F32).scaled_to(&want));
                                    row.head.status = if ok { "ok" } else { "fail" }.into();
                                    let timed = time_reps(
                                        reps,
                                        spec.limits.seconds_per_point,
                                        &mut flusher,
                                        || {
                                            moe_kernels::moe_forward(
                                                &cfg, &w, &x, *variant, &mut out,
                                            )
                                            .map(|_| ())
                                        },
                                    );
                                    match timed {
                                        Ok(t) => {
                                            let m = t.median();
                                            row.head.reps = t.samples.len();
                                            row.head.median_ms = Some(m * 1e3);
                                            row.head.p10_ms = Some(t.percentile(10.0) * 1e3);
                                            row.head.p90_ms = Some(t.percentile(90.0) * 1e3);
                                            row.gflops = Some(flops as f64 / m / 1e9);
                                        }
                                        Err(e) => {
                                            row.head.status = "error".into();
                                            row.note = e.to_string();
                                        }
                                    }
                                }
                            }
                            if row.head.status == "fail" {
                                failures += 1;
                            }
                            rows.push(row);
                            bar.inc(1);
                        }
                    }
                }
            }
            run.write_point(&key, &rows)?;
        }
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, failures, render)
}

/// This family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<MoeCols>(spec, csv, prov, |_, rows| tables(rows))
}

/// The markdown tables of a moe run: routing and accuracy per point, then timing.
pub fn tables(rows: &[MoeRow]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "## Routing, drops and accuracy\n");
    let _ = writeln!(md, "| experts | k | skew | capacity | slots | policy | norm | drop rate | imbalance | top-20% share | balance loss | out err vs dropless | active/total params |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let first = rows
        .first()
        .map(|r| r.head.variant.clone())
        .unwrap_or_default();
    for r in rows.iter().filter(|r| r.head.variant == first) {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.2} | {:.3} | {:.3} | {} | {:.3} |",
            r.experts,
            r.top_k,
            r.skew,
            r.capacity,
            r.capacity_slots.map_or("–".into(), |s| s.to_string()),
            r.policy,
            r.norm,
            r.drop_rate,
            r.imbalance,
            r.top20_share,
            r.balance_loss,
            r.out_rel_err_vs_dropless
                .map_or("–".into(), |e| format!("{e:.2e}")),
            r.active_ratio
        );
    }
    let _ = writeln!(md, "\n## Timing (router + experts)\n");
    let _ = writeln!(md, "| experts | k | skew | capacity | variant | median ms | p10–p90 ms | GFLOP/s (active) | rel L2 vs ref | status |\n|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {}–{} | {} | {} | {} |",
            r.experts,
            r.top_k,
            r.skew,
            r.capacity,
            r.head.variant,
            fmt_opt(r.head.median_ms, 2),
            fmt_opt(r.head.p10_ms, 2),
            fmt_opt(r.head.p90_ms, 2),
            fmt_opt(r.gflops, 1),
            fmt_err(r.rel_l2_err),
            r.head.status
        );
    }
    let bad: Vec<&MoeRow> = rows.iter().filter(|r| r.head.status != "ok").collect();
    if !bad.is_empty() {
        let _ = writeln!(md, "\n## Rows not passing\n\n| config | capacity | skew | variant | status | why |\n|---|---|---|---|---|---|");
        for r in bad {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                r.config, r.capacity, r.skew, r.head.variant, r.head.status, r.note
            );
        }
    }
    md.push('\n');
    md
}
