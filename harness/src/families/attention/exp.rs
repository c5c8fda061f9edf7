//! `harness exp` for attention specs: per grid point, seeded inputs and the f64 reference of
//! sampled rows are made once and shared by the variants; each variant is prepared (untimed),
//! run once on NaN-poisoned output and checked, then timed with caches flushed; its cost model
//! gives GB/s, GFLOP/s and % of the roofline measured at the start of the run.

use super::cols::{AttentionCols, ExpRow};
use super::grid::{points, Point};
use crate::alloc;
use crate::error::{HarnessError, Result};
use crate::measure::{time_reps, CacheFlusher};
use crate::registry;
use crate::roofline::Roofline;
use crate::row::{Head, Row};
use crate::run_files::{counts_as_failure, progress_bar, ExpRequest, RunFiles};
use crate::spec::Limits;
use attention_kernels::reference::{attention_rows, QueryRow};
use attention_kernels::{AttentionInputs, AttentionKernel};
use kernel_common::inputs::derive_seed;
use kernel_common::{tolerance, Buffer, Device, ErrorStats};
use std::time::Instant;

/// Runs an attention experiment: every variant at every point, checked and timed.
pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, names, reps) = (req.opts, req.spec, &req.names, req.reps);
    let points = points(&req.grid)?;
    if points.is_empty() {
        return Err(HarnessError::Usage(format!(
            "experiment '{}': the grid has no point",
            spec.name
        )));
    }
    let kernels = names
        .iter()
        .map(|v| registry::attention_kernel(v))
        .collect::<Result<Vec<_>>>()?;

    registry::require_variant_devices(names, opts.device)?;
    crate::require_device(
        opts.device,
        kernels
            .iter()
            .map(|k| k.supports(&points[0].shape, points[0].dtype, opts.device)),
    )?;
    let mut run = RunFiles::start(opts, spec, req.spec_path, req.grid.clone())?;
    let bar = progress_bar(points.len() * kernels.len());
    let mut flusher = CacheFlusher::new();
    let mut failures = 0;
    for (index, point) in points.iter().enumerate() {
        let mut runner =
            PointRunner::new(point, derive_seed(opts.seed, index as u64), &spec.limits);
        for kernel in &kernels {
            bar.set_message(format!(
                "{} {} {}",
                point.mode,
                point.shape.label(),
                kernel.name()
            ));
            let mut row = runner.row(
                kernel.as_ref(),
                &run.run_id,
                &spec.name,
                opts.device,
                &run.roof,
            );
            runner.measure(
                kernel.as_ref(),
                opts.device,
                reps,
                &mut flusher,
                &run.roof,
                &mut row,
            );
            if counts_as_failure(&row.head.status, &row.note) {
                failures += 1;
            }
            run.writer.write(&row)?;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, failures, super::report::render)
}

/// Inputs and reference rows of one grid point, created on first use and shared by variants.
struct PointRunner<'a> {
    point: &'a Point,
    seed: u64,
    limits: &'a Limits,
    inputs: Option<AttentionInputs>,
    reference: Option<(Vec<QueryRow>, Vec<f64>)>,
}

impl<'a> PointRunner<'a> {
    fn new(point: &'a Point, seed: u64, limits: &'a Limits) -> PointRunner<'a> {
        PointRunner {
            point,
            seed,
            limits,
            inputs: None,
            reference: None,
        }
    }

    /// A row with the point's columns and the variant's cost model filled in.
    fn row(
        &self,
        kernel: &dyn AttentionKernel,
        run_id: &str,
        exp: &str,
        device: Device,
        roof: &Roofline,
    ) -> ExpRow {
        let s = &self.point.shape;
        let cost = kernel.cost(s, self.point.dtype);
        let head = Head::new(run_id, exp, &kernel.name(), &device.to_string(), self.seed);
        Row::new(
            head,
            AttentionCols {
                mode: self.point.mode.clone(),
                dtype: self.point.dtype.to_string(),
                batch: s.batch,
                q_heads: s.q_heads,
                kv_heads: s.kv_heads,
                q_len: s.q_len,
                kv_len: s.kv_len,
                head_dim: s.head_dim,
                causal: s.causal,
                gbps: None,
                gflops: None,
                pct_roofline: None,
                bound: if cost.memory_bound(roof.read_gbps * 1e9, roof.fma_gflops * 1e9) {
                    "memory"
                } else {
                    "compute"
                }
                .into(),
                bytes: cost.bytes,
                flops: cost.flops,
                scratch_mib: None,
                prepare_ms: None,
                max_abs_err: None,
                rel_l2_err: None,
                nmse: None,
                checked_rows: 0,
            },
        )
    }

    /// Why the limits skip this variant here, if they do.
    fn over_limit(&self, kernel: &dyn AttentionKernel, row: &ExpRow) -> Option<String> {
        let s = &self.point.shape;
        let kv_mib = (2 * s.kv_elems() * self.point.dtype.size()) as f64 / (1 << 20) as f64;
        let gflop = row.flops as f64 / 1e9;
        let scratch_mib =
            kernel.workspace_bytes(s, rayon::current_num_threads()) as f64 / (1 << 20) as f64;
        if kv_mib > self.limits.max_kv_mib {
            Some(format!(
                "K+V {kv_mib:.0} MiB > max_kv_mib {}",
                self.limits.max_kv_mib
            ))
        } else if gflop > self.limits.max_gflop {
            Some(format!(
                "{gflop:.1} GFLOP > max_gflop {}",
                self.limits.max_gflop
            ))
        } else if scratch_mib > self.limits.max_scores_mib {
            Some(format!(
                "workspace {scratch_mib:.0} MiB > max_scores_mib {}",
                self.limits.max_scores_mib
            ))
        } else {
            None
        }
    }

    /// Rows checked against the reference: first and last batch entry, first, middle and
    /// last query head, first, middle and last query row.
    fn sample_rows(&self) -> Vec<QueryRow> {
        let s = &self.point.shape;
        let pick = |n: usize| {
            let mut v = vec![0, n / 2, n - 1];
            v.dedup();
            v
        };
        let mut rows = vec![];
        for b in [0, s.batch - 1] {
            for &h in &pick(s.q_heads) {
                for &i in &pick(s.q_len) {
                    if !rows.contains(&(b, h, i)) {
                        rows.push((b, h, i));
                    }
                }
            }
        }
        rows
    }

    fn inputs(&mut self) -> &AttentionInputs {
        let (shape, dtype, seed) = (self.point.shape, self.point.dtype, self.seed);
        self.inputs
            .get_or_insert_with(|| AttentionInputs::random(&shape, dtype, seed))
    }

    fn reference(&mut self) -> (Vec<QueryRow>, Vec<f64>) {
        if self.reference.is_none() {
            let rows = self.sample_rows();
            let want = attention_rows(&self.point.shape, self.inputs(), &rows);
            self.reference = Some((rows, want));
        }
        self.reference.clone().expect("just computed")
    }

    /// Fills status, errors and timings of `row`.
    fn measure(
        &mut self,
        kernel: &dyn AttentionKernel,
        device: Device,
        reps: usize,
        flusher: &mut CacheFlusher,
        roof: &Roofline,
        row: &mut ExpRow,
    ) {
        let (shape, dtype) = (self.point.shape, self.point.dtype);
        if let Err(e) = kernel.supports(&shape, dtype, device) {
            row.head.status = "unsupported".into();
            row.note = e.to_string();
            return;
        }
        if let Some(why) = self.over_limit(kernel, row) {
            row.head.status = "skipped".into();
            row.note = why;
            return;
        }
        let (rows, want) = self.reference();
        let inputs = self.inputs.as_ref().expect("created by reference()");
        let started = Instant::now();
        let mut prepared = match kernel.prepare(&shape, inputs) {
            Ok(p) => p,
            Err(e) => {
                row.head.status = "error".into();
                row.note = e.to_string();
                return;
            }
        };
        row.prepare_ms = Some(started.elapsed().as_secs_f64() * 1e3);
        let mut out = Buffer::poisoned(dtype, shape.q_elems());
        let baseline = alloc::reset_peak();
        if let Err(e) = prepared.run(&mut out) {
            row.head.status = "error".into();
            row.note = e.to_string();
            return;
        }
        // Host heap only: a CUDA variant's workspace lives on the device (its `run` allocates
        // just the downloaded output), so the column stays empty for it.
        if device == Device::Cpu {
            row.scratch_mib = Some(alloc::peak_above(baseline) as f64 / (1 << 20) as f64);
        }
        let full = out.to_f32();
        let unwritten = full.iter().filter(|x| !x.is_finite()).count();
        let d = shape.head_dim;
        let got: Vec<f32> = rows
            .iter()
            .flat_map(|&(b, h, i)| {
                let at = ((b * shape.q_heads + h) * shape.q_len + i) * d;
                full[at..at + d].to_vec()
            })
            .collect();
        let stats = ErrorStats::compare(&got, &want);
        row.max_abs_err = Some(stats.max_abs);
        row.rel_l2_err = Some(stats.rel_l2);
        row.nmse = Some(stats.nmse);
        row.checked_rows = rows.len();
        let passed = unwritten == 0 && stats.passes(&tolerance(dtype));
        let timed = match prepared.time_on_device(reps) {
            Some(device_times) => device_times.map(|samples| crate::measure::Timing { samples }),
            None => time_reps(reps, self.limits.seconds_per_point, flusher, || {
                prepared.run(&mut out)
            }),
        };
        match timed {
            Ok(t) => {
                let median = t.median();
                row.head.set_timing(&t);
                row.gbps = Some(row.bytes as f64 / median / 1e9);
                row.gflops = Some(row.flops as f64 / median / 1e9);
                let cost = kernel_common::Cost {
                    bytes: row.bytes,
                    flops: row.flops,
                };
                row.pct_roofline = Some(
                    100.0 * cost.roofline_seconds(roof.read_gbps * 1e9, roof.fma_gflops * 1e9)
                        / median,
                );
                row.head.status = if passed { "ok" } else { "fail" }.into();
                if unwritten > 0 {
                    row.note =
                        format!("{unwritten} output elements non-finite (unwritten or NaN leak)");
                }
            }
            Err(e) => {
                row.head.status = "error".into();
                row.note = e.to_string();
            }
        }
    }
}
