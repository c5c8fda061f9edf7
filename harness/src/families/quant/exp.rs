//! `harness exp` for the quant family: for each weight shape and distribution, quantise the
//! same f32 matrix into every format of the grid (untimed, its error against the originals
//! recorded), then for each batch size multiply it with the same seeded activations: check
//! sampled outputs against the f64 product of the dequantised weights (correctness), measure
//! how far they are from the f64 product of the original weights (what quantisation costs),
//! and time the calls with caches flushed, round-robin over every format and variant of the
//! point (see `time_interleaved`). Speed-ups are over the f32 (and f16) weights of the same
//! point, timed in the same rounds. Peers (`peers.rs`: PyTorch's `F.linear`, gguf-py's
//! quantisers) are checked against the same references and timed in the same rounds.

use super::cols::{QuantRow, RowBase, Stored};
use super::peers::{QuantPeers, Timed};
use super::report::render;
use crate::error::{HarnessError, Result};
use crate::measure::{hot_timing, on_cuda, time_reps, CacheFlusher, Timing};
use crate::peer::Peer;
use crate::roofline::Roofline;
use crate::run_files::{counts_as_failure, spread, ExpRequest, GridValues, RunFiles};
use crate::spec::Limits;
use crate::sweep::PointKey;
use kernel_common::inputs::{derive_seed, normal_buffer_par};
use kernel_common::{tolerance, DType, ErrorStats};
use kernel_quant::{
    matvec::cost, reference, MatVecVariant, Prepared, QuantError, QuantMatrix, WeightDist,
    WeightFormat,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The grid of a quant experiment, parsed and validated.
struct QuantGrid {
    formats: Vec<WeightFormat>,
    shapes: Vec<(usize, usize)>,
    dists: Vec<WeightDist>,
    batches: Vec<usize>,
}

fn usage(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Usage(e.to_string())
}

fn parse_shape(text: &str) -> Result<(usize, usize)> {
    crate::run_files::pair_of_counts(text).ok_or_else(|| {
        HarnessError::Usage(format!(
            "shape '{text}' is not ROWSxCOLS with both > 0 (e.g. 4096x11008)"
        ))
    })
}

impl QuantGrid {
    fn parse(grid: &BTreeMap<String, Vec<String>>) -> Result<QuantGrid> {
        let g = GridValues(grid);
        let list = |key: &str, default: &str| g.strings(key, &[default]);
        let mut formats = list("format", "q4_0")
            .iter()
            .map(|f| WeightFormat::parse(f).map_err(usage))
            .collect::<Result<Vec<_>>>()?;
        // The baselines run first so every later row can carry its speed-up.
        formats.sort_by_key(|f| match f {
            WeightFormat::F32 => 0,
            WeightFormat::F16 => 1,
            _ => 2,
        });
        formats.dedup();
        let shapes = list("shape", "4096x4096")
            .iter()
            .map(|s| parse_shape(s))
            .collect::<Result<Vec<_>>>()?;
        let dists = list("weights", "gaussian")
            .iter()
            .map(|d| WeightDist::parse(d).map_err(usage))
            .collect::<Result<Vec<_>>>()?;
        let batches = list("batch", "1")
            .iter()
            .map(|b| match b.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(HarnessError::Usage(format!(
                    "batch '{b}' is not a positive integer"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        for &(_, cols) in &shapes {
            for f in &formats {
                f.validate(cols).map_err(usage)?;
            }
        }
        Ok(QuantGrid {
            formats,
            shapes,
            dists,
            batches,
        })
    }

    /// (shape, weights) pairs.
    fn pairs(&self) -> usize {
        self.shapes.len() * self.dists.len()
    }

    /// Batch sizes.
    fn batches(&self) -> usize {
        self.batches.len()
    }

    /// Rows the run will write: unsupported (variant, format) pairs are left out.
    fn rows(&self, variants: &[(String, MatVecVariant)]) -> usize {
        let pairs = self
            .formats
            .iter()
            .flat_map(|f| variants.iter().map(move |(_, v)| (*f, *v)))
            .filter(|&(f, v)| kernel_quant::supports(v, f).is_ok())
            .count();
        pairs * self.shapes.len() * self.dists.len() * self.batches.len()
    }
}

/// A (shape, weights, batch) point's key: its rows are timed together; batch 0 is the
/// quantiser rows of the (shape, weights) pair (timed beside a quantiser peer).
fn point_key(rows: usize, cols: usize, dist: &WeightDist, batch: usize) -> PointKey {
    PointKey::of(&[
        ("shape", &format!("{rows}x{cols}")),
        ("weights", &dist.name()),
        ("batch", &batch),
    ])
}

/// f64 products of the original f32 weights' `rows` with every activation vector.
fn dense_reference(w: &[f32], cols: usize, x: &[f32], batch: usize, rows: &[usize]) -> Vec<f64> {
    let mut out = Vec::with_capacity(batch * rows.len());
    for b in 0..batch {
        let xb = &x[b * cols..(b + 1) * cols];
        for &r in rows {
            let wr = &w[r * cols..(r + 1) * cols];
            out.push(wr.iter().zip(xb).map(|(&a, &v)| a as f64 * v as f64).sum());
        }
    }
    out
}

/// Runs a quant-family experiment (called by `exp::run` once the spec and grid are loaded).
/// What one (shape, weights) point holds at once, estimated for the memory guard: the f32
/// weights and a dequantised copy, every format stored and laid out for a variant, and the
/// largest batch's activations, outputs and f64 reference rows.
fn shape_bytes(
    rows: usize,
    cols: usize,
    formats: &[WeightFormat],
    batches: &[usize],
) -> (u64, String) {
    use crate::mem_guard::{human, product};
    let elems = product(&[rows, cols]);
    let dense = elems.saturating_mul(8);
    let stored: f64 = formats
        .iter()
        .map(|f| 2.0 * f.bits_per_weight() / 8.0)
        .sum();
    let stored = (elems as f64 * stored).min(u64::MAX as f64) as u64;
    let batch = batches.iter().copied().max().unwrap_or(1);
    let acts = product(&[batch, rows + cols, 4 + 4 + 8]);
    let what = format!(
        "f32 weights {}, stored formats {}, activations {}",
        human(dense),
        human(stored),
        human(acts)
    );
    (dense.saturating_add(stored).saturating_add(acts), what)
}

pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, names, reps) = (req.opts, req.spec, &req.names, req.reps);
    let qgrid = QuantGrid::parse(&req.grid)?;
    let variants = names
        .iter()
        .map(|v| crate::registry::quant_variant(v))
        .collect::<Result<Vec<_>>>()?;
    // A variant pinned to a tier this CPU lacks or --isa excludes would skip every row.
    for (name, v) in &variants {
        v.isa()
            .map_err(|e| usage(format!("--variant {name}: {e}")))?;
    }
    let mut run = RunFiles::start(opts, spec, req.spec_path, req.grid.clone())?;
    let mut peers = QuantPeers::start(req, &run.run_id)?;
    let bar = run.progress_bar(
        qgrid.rows(&variants) + peers.rows(&qgrid.formats, qgrid.pairs(), qgrid.batches()),
    );
    let mut flusher = CacheFlusher::new();
    let heads = run.heads.clone();
    let mut failures = 0;
    for (si, &(rows, cols)) in qgrid.shapes.iter().enumerate() {
        for (di, dist) in qgrid.dists.iter().enumerate() {
            let key = |batch: usize| point_key(rows, cols, dist, batch);
            // Batch 0: the quantiser rows, a point of their own when a peer quantises.
            let quantizer_point = peers.quantizes().then_some(0);
            let mut batches = quantizer_point.iter().chain(&qgrid.batches);
            if !batches.any(|&b| run.owns(&key(b))) {
                continue;
            }
            let seed = derive_seed(opts.seed, (si * 64 + di) as u64);
            let base = RowBase {
                heads: &heads,
                seed,
                rows,
                cols,
                weights: dist.name(),
            };
            let (need, what) = shape_bytes(rows, cols, &qgrid.formats, &qgrid.batches);
            if let Some(note) = opts.mem_budget.refuse(need, &what) {
                let skipped = |variant: &str, format, batch| {
                    let mut row = base.format_row(variant, format, batch, None);
                    row.head.status = "skipped".into();
                    row.note = note.clone();
                    row
                };
                if peers.quantizes() && run.owns(&key(0)) {
                    let rows: Vec<QuantRow> = qgrid
                        .formats
                        .iter()
                        .map(|&f| {
                            let mut row = skipped("quantize", f, 0);
                            row.op = "quantize".into();
                            row
                        })
                        .collect();
                    bar.inc(rows.len() as u64);
                    run.write_point(&key(0), &rows)?;
                }
                for &batch in &qgrid.batches {
                    if !run.owns(&key(batch)) {
                        continue;
                    }
                    let mut rows = vec![];
                    for &format in &qgrid.formats {
                        for (vname, variant) in &variants {
                            if kernel_quant::supports(*variant, format).is_ok() {
                                rows.push(skipped(vname, format, batch));
                            }
                        }
                    }
                    bar.inc(rows.len() as u64);
                    run.write_point(&key(batch), &rows)?;
                }
                continue;
            }
            bar.set_message(format!("sampling {rows}x{cols} {} weights", dist.name()));
            let w = dist.sample(rows, cols, seed);
            // 256 rows: 16 gave output errors too noisy to rank formats by.
            let sampled = spread(rows, 256);
            // Every format of this (shape, weights), quantised once (untimed).
            let mut stored = vec![];
            for &format in &qgrid.formats {
                bar.set_message(format!("quantising {rows}x{cols} to {format}"));
                let started = Instant::now();
                let matrix = QuantMatrix::quantize(format, rows, cols, &w).map(Arc::new);
                let quantize_ms = started.elapsed().as_secs_f64() * 1e3;
                let err = matrix
                    .as_ref()
                    .map(|m| QuantError::measure(&w, &m.dequantize()))
                    .ok();
                stored.push(Stored {
                    format,
                    matrix,
                    quantize_ms,
                    err,
                });
            }
            peers.new_weights(&w, (rows, cols), (si, di))?;
            if peers.quantizes() && run.owns(&key(0)) {
                bar.set_message(format!("quantising {rows}x{cols} beside the peers"));
                let timing = (reps, &spec.limits, &mut flusher);
                let rows = peers.quantize_rows(&base, &w, &stored, timing)?;
                for row in &rows {
                    failures += usize::from(counts_as_failure(&row.head.status, &row.note));
                    bar.inc(1);
                }
                run.write_point(&key(0), &rows)?;
            }
            for &batch in &qgrid.batches {
                if !run.owns(&key(batch)) {
                    continue;
                }
                let x = normal_buffer_par(
                    derive_seed(seed, 1000 + batch as u64),
                    DType::F32,
                    batch * cols,
                )
                .to_f32();
                let want_dense = dense_reference(&w, cols, &x, batch, &sampled);
                let mut point: Vec<(QuantRow, Option<Timed>)> = vec![];
                for st in &stored {
                    for (vname, variant) in &variants {
                        if kernel_quant::supports(*variant, st.format).is_err() {
                            continue;
                        }
                        let mut row = base.format_row(vname, st.format, batch, st.err);
                        row.quantize_ms = st.quantize_ms;
                        bar.set_message(format!("checking {} b{batch} {vname}", st.format));
                        let timed = match &st.matrix {
                            Err(e) => {
                                row.head.status = "error".into();
                                row.note = e.to_string();
                                None
                            }
                            // Laid out for the variant once, untimed (packed builds its tiles).
                            Ok(m) => match Prepared::new(m.clone(), *variant) {
                                Err(e) => {
                                    row.head.status = "error".into();
                                    row.note = e.to_string();
                                    None
                                }
                                Ok(p) => {
                                    let check = Check {
                                        m,
                                        p: &p,
                                        x: &x,
                                        want_dense: &want_dense,
                                        sampled: &sampled,
                                        batch,
                                    };
                                    let ran = check.run(*variant, &mut row);
                                    ran.then_some(Timed::Ours(p, *variant))
                                }
                            },
                        };
                        point.push((row, timed));
                    }
                }
                if peers.multiplies() {
                    bar.set_message(format!("checking the peers at {rows}x{cols} b{batch}"));
                    let checks = (&x[..], &sampled[..], &want_dense[..]);
                    point.extend(peers.matmul_rows(&base, &w, batch, checks)?);
                }
                bar.set_message(format!("timing {rows}x{cols} {} b{batch}", dist.name()));
                time_interleaved(
                    &mut point,
                    peers.peers_mut(),
                    (&x, batch),
                    reps,
                    &spec.limits,
                    &mut flusher,
                    &run.roof,
                );
                for (row, _) in &point {
                    if counts_as_failure(&row.head.status, &row.note) {
                        failures += 1;
                    }
                    bar.inc(1);
                }
                run.write_point(&key(batch), point.iter().map(|(row, _)| row))?;
            }
        }
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, failures, render)
}

/// Times every runnable row of one (shape, weights, batch) point round-robin: repetition i
/// of every format, variant and peer runs before repetition i + 1 of any, each after a cache
/// flush, so the shared machine's drift (its read bandwidth moved 25–50 GB/s within an hour)
/// hits all of them alike and the speed-ups compare like with like. Stops after `reps`
/// rounds, or once at least 3 rounds ran and the point has used `seconds_per_point` per row.
/// Then fills the timing columns and the speed-ups over our fastest f32 and f16 rows of the
/// point (a peer's row too: its time against ours). CUDA rows (ours and a peer's on the
/// device) are timed cold, L2 flushed before each repetition, then hot for `hot_median_ms`;
/// a CUDA row's GB/s above the run's measured copy bandwidth is an error
/// (`implausible_bandwidth`).
fn time_interleaved(
    point: &mut [(QuantRow, Option<Timed>)],
    peers: &mut [Peer],
    (x, batch): (&[f32], usize),
    reps: usize,
    limits: &Limits,
    flusher: &mut CacheFlusher,
    roof: &Roofline,
) {
    let live = point.iter().filter(|(_, t)| t.is_some()).count();
    let mut samples: Vec<Vec<f64>> = vec![vec![]; point.len()];
    let mut errors: Vec<Option<String>> = vec![None; point.len()];
    let mut ys: Vec<Vec<f32>> = point
        .iter()
        .map(|(_, t)| match t {
            Some(Timed::Ours(m, _)) => vec![0.0; batch * m.rows()],
            _ => vec![],
        })
        .collect();
    let budget = limits.seconds_per_point * live as f64;
    let mut spent = 0.0;
    let mut hot: Vec<Option<f64>> = vec![None; point.len()];
    // CUDA rows: the kernel alone, resident data, CUDA events (after a warm-up): cold (L2
    // flushed before each repetition), then hot.
    for (i, (_, timed)) in point.iter().enumerate() {
        if let Some(Timed::Ours(m, MatVecVariant::Cuda)) = timed {
            let m = m.rows_matrix();
            let timed = kernel_quant::cuda::DeviceGemv::new(&m, x, batch).and_then(|mut g| {
                let cold = g.time(reps)?;
                Ok((cold, hot_timing(|| g.time(reps))?))
            });
            match timed {
                Ok((cold, hot_ms)) => (samples[i], hot[i]) = (cold, Some(hot_ms)),
                Err(e) => errors[i] = Some(e.to_string()),
            }
        }
    }
    for round in 0..reps.max(1) {
        if round >= 3 && spent > budget {
            break;
        }
        for (i, (_, timed)) in point.iter().enumerate() {
            if errors[i].is_some() {
                continue;
            }
            let t = match timed {
                None | Some(Timed::Ours(_, MatVecVariant::Cuda)) => continue,
                Some(Timed::Ours(p, variant)) => time_reps(1, f64::INFINITY, flusher, || {
                    p.matmul(x, batch, &mut ys[i], *variant)
                })
                .map(|t| t.samples[0])
                .map_err(|e| e.to_string()),
                Some(Timed::Peer(k)) => {
                    // The caches are the machine's: evict them before the peer's call too.
                    flusher.flush();
                    peers[*k].time_once()
                }
            };
            match t {
                Ok(t) => {
                    spent += t;
                    samples[i].push(t);
                }
                Err(e) => errors[i] = Some(e),
            }
        }
    }
    // A peer on the device, timed hot once more after the rounds (the cold timing stands
    // whatever happens to the hot one).
    for (i, (row, timed)) in point.iter_mut().enumerate() {
        if let (Some(Timed::Peer(k)), None) = (timed, &errors[i]) {
            if on_cuda(&row.head.device) && !samples[i].is_empty() {
                match peers[*k].time_hot_ms(reps) {
                    Ok(ms) => hot[i] = ms,
                    Err(e) => row.note = format!("no hot timing: {e}"),
                }
            }
        }
    }
    let medians: Vec<Option<f64>> = samples
        .iter()
        .map(|s| (!s.is_empty()).then(|| Timing { samples: s.clone() }.median()))
        .collect();
    // Before the baselines are chosen: a CUDA row faster than the device's copy is an error.
    for (i, (row, timed)) in point.iter_mut().enumerate() {
        let (Some(_), None, Some(median)) = (timed, &errors[i], medians[i]) else {
            continue;
        };
        let gbps = row.bytes as f64 / median / 1e9;
        row.hold_to_copy_bandwidth(gbps, roof.read_gbps);
    }
    let best = |format: &str| {
        point
            .iter()
            .zip(&medians)
            .filter(|((r, t), _)| {
                matches!(t, Some(Timed::Ours(..))) && r.format == format && r.head.status == "ok"
            })
            .filter_map(|(_, m)| *m)
            .reduce(f64::min)
    };
    let (f32_best, f16_best) = (best("f32"), best("f16"));
    for (i, (row, timed)) in point.iter_mut().enumerate() {
        if timed.is_none() {
            continue;
        }
        if let Some(e) = &errors[i] {
            row.head.status = "error".into();
            row.note = e.clone();
            continue;
        }
        if samples[i].is_empty() {
            row.head.status = "error".into();
            row.note = "not timed".into();
            continue;
        }
        let t = Timing {
            samples: samples[i].clone(),
        };
        let median = t.median();
        row.head.set_timing(&t);
        row.gbps = Some(row.bytes as f64 / median / 1e9);
        row.gflops = Some(row.flops as f64 / median / 1e9);
        row.pct_read_bw = Some(100.0 * row.bytes as f64 / median / 1e9 / roof.read_gbps);
        row.speedup_vs_f32 = f32_best.map(|b| b / median);
        row.speedup_vs_f16 = f16_best.map(|b| b / median);
        row.hot_median_ms = hot[i];
    }
}

/// One product to check (untimed).
struct Check<'a> {
    m: &'a QuantMatrix,
    /// `m` laid out for the variant.
    p: &'a Prepared,
    x: &'a [f32],
    want_dense: &'a [f64],
    sampled: &'a [usize],
    batch: usize,
}

impl Check<'_> {
    /// Runs the variant once on NaN-poisoned output, fills the error columns and the status
    /// (ok | fail | error); returns whether it ran (and so can be timed).
    fn run(&self, variant: MatVecVariant, row: &mut QuantRow) -> bool {
        let (m, batch) = (self.m, self.batch);
        let c = cost(m, batch);
        (row.bytes, row.flops) = (c.bytes, c.flops);
        let mut y = vec![f32::NAN; batch * m.rows];
        if let Err(e) = self.p.matmul(self.x, batch, &mut y, variant) {
            row.head.status = "error".into();
            row.note = e.to_string();
            return false;
        }
        let got: Vec<f32> = (0..batch)
            .flat_map(|b| self.sampled.iter().map(move |&r| (b, r)))
            .map(|(b, r)| y[b * m.rows + r])
            .collect();
        // act=q8 multiplies the int8-quantised activation: judge it against that product
        // (out_rel_err below still measures against x itself).
        let seen = kernel_quant::activation_as_seen(variant, m.format, self.x, m.cols);
        let want = reference::matmul_rows(m, &seen, batch, self.sampled);
        let stats = ErrorStats::compare(&got, &want);
        row.max_abs_err = Some(stats.max_abs);
        row.rel_l2_err = Some(stats.rel_l2);
        row.checked_outputs = got.len();
        row.out_rel_err = Some(ErrorStats::compare(&got, self.want_dense).rel_l2);
        let unwritten = y.iter().filter(|v| !v.is_finite()).count();
        let passed = unwritten == 0 && stats.passes(&tolerance(DType::F32).scaled_to(&want));
        row.head.status = if passed { "ok" } else { "fail" }.into();
        if unwritten > 0 {
            row.note = format!("{unwritten} outputs non-finite (unwritten or NaN)");
        }
        true
    }
}
