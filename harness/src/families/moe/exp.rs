//! `harness exp` for the moe family: for each layer (experts, sizes, router skew) one seeded
//! set of weights and one batch of tokens; then for each routing convention of the grid
//! (`grid.rs`: who chooses, top-k, priority policy, weight rule, capacity, floor) the f32
//! router's decisions and their statistics (drops, reroutes, unserved and multiply served
//! tokens, imbalance, the busiest 20%'s share, balance loss), each expert variant checked
//! on NaN-poisoned output against the f64 reference of the same decisions (64 sampled
//! tokens), the whole output's distance from the same convention without a capacity limit
//! (every token; the yardstick computed by the grouped f32 variant, whose own ~1e-7 error
//! is far below what this measures), and the call timed: on the CPU the whole layer (router + experts) with caches flushed, on CUDA
//! (`cuda_grouped`) the expert kernels alone with CUDA events, routing decided on the host,
//! cold (L2 flushed before each repetition) and hot (`hot_median_ms`). Its rows carry no
//! GB/s, so no copy-bandwidth bound applies to them.

use super::cols::{MoeCols, MoeRow};
use super::grid::{dropless, Layer, MoeGrid};
use crate::error::{HarnessError, Result};
use crate::measure::{hot_timing, time_reps, CacheFlusher, Timing};
use crate::row::Row;
use crate::run_files::{spread, ExpRequest, RunFiles};
use crate::spec::parse_set;
use crate::sweep::PointKey;
use kernel_common::inputs::{derive_seed, normal_buffer_par};
use kernel_common::{tolerance, Buffer, DType, ErrorStats};
use kernel_moe::cuda::experts::DeviceExperts;
use kernel_moe::reference::{experts_reference, experts_reference_stored};
use kernel_moe::{
    experts_forward, route, Capacity, ExpertVariant, MoeConfig, MoeWeights, Routing, RoutingStats,
};
use std::collections::hash_map::{Entry, HashMap};

pub use super::report::render;

/// `--set top_k=...` with only expert-choice routing asked for: a k that nothing would use.
fn refuse_k_for_expert_choice(req: &ExpRequest) -> Result<()> {
    let only_expert_choice = req
        .grid
        .get("routing")
        .is_some_and(|r| r.iter().all(|v| v == "expert_choice"));
    for set in &req.opts.sets {
        if parse_set(set)?.0 == "top_k" && only_expert_choice {
            return Err(HarnessError::Usage(
                "routing=expert_choice takes no top_k (each expert picks its tokens; capacity \
                 sets how many)"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// What every variant at one convention shares.
struct Point<'a> {
    cfg: MoeConfig,
    w: &'a MoeWeights,
    x: &'a [f32],
    routing: Routing,
    stats: RoutingStats,
    sampled: &'a [usize],
    /// f64 outputs of the sampled tokens under this routing.
    want: Vec<f64>,
    /// Every token's output without a capacity limit.
    yardstick: &'a [f64],
}

/// The columns of a row that one convention at one layer fixes (the routing's statistics,
/// timing and error left empty: a skipped point has only these).
fn convention_cols(layer: &Layer, cfg: &MoeConfig, dtype: DType) -> MoeCols {
    MoeCols {
        config: match cfg.top_k() {
            Some(k) => format!("e{} k{k}", cfg.experts),
            None => format!("e{} ec", cfg.experts),
        },
        tokens: cfg.tokens,
        d_model: cfg.d_model,
        d_ff: cfg.d_ff,
        experts: cfg.experts,
        top_k: cfg.top_k(),
        capacity: match cfg.capacity {
            Capacity::Dropless => "dropless".into(),
            Capacity::Factor(f) => f.to_string(),
        },
        capacity_factor: match cfg.capacity {
            Capacity::Dropless => None,
            Capacity::Factor(f) => Some(f),
        },
        skew: layer.skew,
        policy: cfg.policy().map_or("", |p| p.name()).into(),
        norm: cfg.norm.name().into(),
        routing: cfg.choice.routing_name().into(),
        min_capacity: cfg.min_capacity,
        dtype: dtype.to_string(),
        ..MoeCols::default()
    }
}

/// What one layer's point holds at once, estimated for the memory guard: the weights (and a
/// device variant's rounded copy), the tokens, the outputs (f32 run, f32 and f64 yardstick),
/// the router's scores, and the grouped variants' gathered inputs and hidden activations.
fn layer_bytes(layer: &Layer, conventions: &[MoeConfig]) -> (u64, String) {
    use crate::mem_guard::{human, product};
    let per_token = conventions
        .iter()
        .map(|c| c.top_k().unwrap_or(c.experts))
        .max()
        .unwrap_or(1);
    let weights = 2 * 4 * product(&[layer.experts, 3, layer.d_model, layer.d_ff]);
    let tokens = product(&[layer.tokens, layer.d_model, 4 + 4 + 4 + 8]);
    let router = product(&[layer.tokens, layer.experts, 8 * 2]);
    let routed = product(&[layer.tokens, per_token, layer.d_model + 2 * layer.d_ff, 4]);
    let total = weights
        .saturating_add(tokens)
        .saturating_add(router)
        .saturating_add(routed);
    let what = format!(
        "weights {}, tokens and outputs {}, routed activations {}",
        human(weights),
        human(tokens.saturating_add(router)),
        human(routed)
    );
    (total, what)
}

/// The share of all routed assignments taken by the busiest fifth of the experts, counting
/// the expert at the boundary by the fraction of it inside the fifth.
fn fifth_share(routed: &[usize]) -> f64 {
    let mut sorted = routed.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let fifth = sorted.len() as f64 / 5.0;
    let whole = fifth.floor() as usize;
    let top: usize = sorted[..whole].iter().sum();
    let part = sorted
        .get(whole)
        .map_or(0.0, |&n| (fifth - whole as f64) * n as f64);
    (top as f64 + part) / sorted.iter().sum::<usize>().max(1) as f64
}

impl Point<'_> {
    /// The columns of a row of this point for storage `dtype`, timing `flops`.
    fn cols(&self, layer: &Layer, dtype: DType, flops: u64) -> MoeCols {
        let (cfg, s) = (&self.cfg, &self.stats);
        let router_params = (cfg.d_model * cfg.experts) as u64;
        let per_token = cfg.top_k().map_or(s.experts_per_token, |k| k as f64);
        let active = router_params + (per_token * cfg.expert_params() as f64) as u64;
        let total = router_params + (cfg.experts * cfg.expert_params()) as u64;
        MoeCols {
            capacity_slots: self.routing.capacity,
            gflops: None,
            flops,
            assignments: Some(s.assignments),
            dropped: s.dropped,
            drop_rate: s.drop_rate,
            rerouted: s.rerouted,
            unserved_tokens: Some(s.unserved_tokens),
            multi_served_tokens: Some(s.multi_served_tokens),
            experts_per_token: Some(s.experts_per_token),
            imbalance: s.imbalance,
            top20_share: s.top20_share,
            top_fifth_share: Some(fifth_share(&s.routed)),
            balance_loss: s.balance_loss,
            out_rel_err_vs_dropless: None,
            rel_l2_err: None,
            max_abs_err: None,
            checked_tokens: self.sampled.len(),
            active_params: active,
            total_params: total,
            active_ratio: active as f64 / total as f64,
            ..convention_cols(layer, cfg, dtype)
        }
    }

    /// Fills the error columns and status from a full output and the reference it answers to.
    fn judge(&self, row: &mut MoeRow, out: &[f32], want: &[f64], dtype: DType) {
        let d = self.cfg.d_model;
        let got: Vec<f32> = self
            .sampled
            .iter()
            .flat_map(|&t| out[t * d..(t + 1) * d].to_vec())
            .collect();
        let s = ErrorStats::compare(&got, want);
        row.rel_l2_err = Some(s.rel_l2);
        row.max_abs_err = Some(s.max_abs);
        row.out_rel_err_vs_dropless = Some(ErrorStats::compare(out, self.yardstick).rel_l2);
        let unwritten = out.iter().filter(|v| !v.is_finite()).count();
        let ok = unwritten == 0 && s.passes(&tolerance(dtype).scaled_to(want));
        row.head.status = if ok { "ok" } else { "fail" }.into();
    }
}

fn fail(row: &mut MoeRow, e: impl std::fmt::Display) {
    row.head.status = "error".into();
    row.note = e.to_string();
}

/// A CPU variant: checked, then the whole layer timed with caches flushed.
fn cpu_row(
    p: &Point,
    mut row: MoeRow,
    variant: ExpertVariant,
    reps: usize,
    budget: f64,
    flusher: &mut CacheFlusher,
) -> MoeRow {
    let mut out = vec![f32::NAN; p.x.len()];
    if let Err(e) = experts_forward(&p.cfg, p.w, p.x, &p.routing, variant, &mut out) {
        fail(&mut row, e);
        return row;
    }
    p.judge(&mut row, &out, &p.want, DType::F32);
    let timed = time_reps(reps, budget, flusher, || {
        kernel_moe::moe_forward(&p.cfg, p.w, p.x, variant, &mut out).map(|_| ())
    });
    match timed {
        Ok(t) => set_timing(&mut row, &t),
        Err(e) => fail(&mut row, e),
    }
    row
}

/// `cuda_grouped`: the layer's weights (uploaded once per layer and dtype) and the routed
/// batch resident on the device (untimed), checked against the f64 experts of the rounded
/// weights and tokens, then event-timed: cold (L2 flushed before each repetition), then hot
/// (`hot_median_ms`).
fn cuda_row(
    p: &Point,
    mut row: MoeRow,
    experts: &DeviceExperts,
    dtype: DType,
    reps: usize,
) -> MoeRow {
    let run = || -> kernel_common::error::Result<(Vec<f32>, Timing, f64)> {
        let mut batch = experts.batch(&p.cfg, p.x, &p.routing)?;
        let out = batch.run()?.to_f32();
        let samples = batch.time(reps)?;
        let hot_ms = hot_timing(|| batch.time(reps))?;
        Ok((out, Timing { samples }, hot_ms))
    };
    match run() {
        Err(e) => fail(&mut row, e),
        Ok((out, t, hot_ms)) => {
            let xr = Buffer::from_f32(dtype, p.x).to_f32();
            let want = experts_reference_stored(
                &p.cfg,
                &p.w.rounded(dtype),
                &xr,
                &p.routing,
                p.sampled,
                dtype,
            );
            p.judge(&mut row, &out, &want, dtype);
            set_timing(&mut row, &t);
            row.hot_median_ms = Some(hot_ms);
            row.note = "timed: the expert kernels on the device (gate+up, down, combine); routing by the CPU router, untimed".into();
        }
    }
    row
}

fn set_timing(row: &mut MoeRow, t: &Timing) {
    row.head.set_timing(t);
    row.gflops = Some(row.flops as f64 / t.median() / 1e9);
}

/// Runs a moe-family experiment (called by `exp::run` once the spec and grid are loaded).
pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, names, reps) = (req.opts, req.spec, &req.names, req.reps);
    let mgrid = MoeGrid::parse(&req.grid)?;
    refuse_k_for_expert_choice(req)?;
    let variants = names
        .iter()
        .map(|v| crate::registry::moe_variant(v))
        .collect::<Result<Vec<_>>>()?;
    let mut run = RunFiles::start(opts, spec, req.spec_path, req.grid.clone())?;
    let bar = run.progress_bar(mgrid.points() * variants.len());
    let mut flusher = CacheFlusher::new();
    let mut failures = 0;
    for (li, layer) in mgrid.layers().iter().enumerate() {
        // A point is a layer (shape and skew): every convention and variant runs on its
        // weights and tokens.
        let key = PointKey::of(&[
            ("experts", &layer.experts),
            ("tokens", &layer.tokens),
            ("d_model", &layer.d_model),
            ("d_ff", &layer.d_ff),
            ("skew", &layer.skew),
        ]);
        if !run.owns(&key) {
            continue;
        }
        let mut rows = vec![];
        let conventions = mgrid.conventions(layer);
        let seed = derive_seed(opts.seed, li as u64);
        let (need, what) = layer_bytes(layer, &conventions);
        if let Some(note) = opts.mem_budget.refuse(need, &what) {
            for cfg in &conventions {
                for (vname, variant) in &variants {
                    let dtype = match *variant {
                        ExpertVariant::CudaGrouped(dtype) => dtype,
                        _ => DType::F32,
                    };
                    let head = run.head(vname, seed);
                    let mut row = Row::new(head, convention_cols(layer, cfg, dtype));
                    row.head.status = "skipped".into();
                    row.note = note.clone();
                    rows.push(row);
                    bar.inc(1);
                }
            }
            run.write_point(&key, &rows)?;
            continue;
        }
        bar.set_message(format!(
            "weights e{} t{} skew {}",
            layer.experts, layer.tokens, layer.skew
        ));
        let w = MoeWeights::random(&conventions[0], layer.skew, seed);
        let x = normal_buffer_par(
            derive_seed(seed, 99),
            DType::F32,
            layer.tokens * layer.d_model,
        )
        .to_f32();
        let sampled = spread(layer.tokens, 64);
        let mut yardsticks: HashMap<String, Vec<f64>> = HashMap::new();
        let mut on_device: HashMap<DType, DeviceExperts> = HashMap::new();
        for cfg in conventions {
            let open = dropless(&cfg);
            let yardstick = match yardsticks.entry(open.label()) {
                Entry::Occupied(known) => known.into_mut(),
                Entry::Vacant(slot) => {
                    let r0 = route(&open, &x, &w.router, &w.bias)?;
                    let mut y0 = vec![f32::NAN; x.len()];
                    experts_forward(&open, &w, &x, &r0, ExpertVariant::Grouped, &mut y0)?;
                    slot.insert(y0.iter().map(|&v| v as f64).collect())
                }
            };
            let routing = route(&cfg, &x, &w.router, &w.bias)?;
            let point = Point {
                stats: routing.stats(cfg.experts),
                want: experts_reference(&cfg, &w, &x, &routing, &sampled),
                yardstick,
                cfg,
                w: &w,
                x: &x,
                routing,
                sampled: &sampled,
            };
            let kept = (point.stats.assignments - point.stats.dropped) as u64;
            let expert_flops = 6 * (cfg.d_model * cfg.d_ff) as u64 * kept;
            let router_flops = 2 * (cfg.tokens * cfg.d_model * cfg.experts) as u64;
            for (vname, variant) in &variants {
                bar.set_message(format!("{} s{} {vname}", cfg.label(), layer.skew));
                let head = run.head(vname, seed);
                let row = match *variant {
                    ExpertVariant::CudaGrouped(dtype) => {
                        let mut row = Row::new(head, point.cols(layer, dtype, expert_flops));
                        let uploaded = match on_device.entry(dtype) {
                            Entry::Occupied(known) => Ok(&*known.into_mut()),
                            Entry::Vacant(slot) => {
                                DeviceExperts::upload(&cfg, &w, dtype).map(|up| &*slot.insert(up))
                            }
                        };
                        match uploaded {
                            Ok(experts) => cuda_row(&point, row, experts, dtype, reps),
                            Err(e) => {
                                fail(&mut row, e);
                                row
                            }
                        }
                    }
                    cpu => {
                        let flops = router_flops + expert_flops;
                        let row = Row::new(head, point.cols(layer, DType::F32, flops));
                        let budget = spec.limits.seconds_per_point;
                        cpu_row(&point, row, cpu, reps, budget, &mut flusher)
                    }
                };
                if crate::run_files::counts_as_failure(&row.head.status, &row.note) {
                    failures += 1;
                }
                rows.push(row);
                bar.inc(1);
            }
        }
        run.write_point(&key, &rows)?;
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, failures, render)
}

#[cfg(test)]
mod tests {
    use super::fifth_share;

    #[test]
    fn a_fifth_of_the_experts_counts_the_boundary_expert_by_its_fraction() {
        // 8 experts: the busiest and 0.6 of the second.
        let got = fifth_share(&[6, 10, 4, 0, 0, 0, 0, 0]);
        assert!((got - (10.0 + 0.6 * 6.0) / 20.0).abs() < 1e-12, "{got}");
        assert!((fifth_share(&[1; 10]) - 0.2).abs() < 1e-12);
        assert!((fifth_share(&[1, 3]) - 0.4 * 3.0 / 4.0).abs() < 1e-12);
        assert_eq!(fifth_share(&[0, 0, 0, 0, 0]), 0.0);
    }
}
