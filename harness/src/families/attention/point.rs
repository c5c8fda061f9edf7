//! One attention grid point: its seeded inputs and f64 reference rows, made once and shared
//! by the variants (and peers); a variant's row with its cost model, its check (supports,
//! limits, untimed prepare, one run on NaN-poisoned output against the reference rows), and
//! its timing columns.

use super::cols::{AttentionCols, ExpRow};
use super::grid::Point;
use crate::alloc;
use crate::measure::{time_reps, CacheFlusher, Timing};
use crate::mem_guard::{human, MemBudget};
use crate::roofline::Roofline;
use crate::row::{Heads, Row};
use crate::spec::Limits;
use kernel_attention::reference::{attention_rows, QueryRow};
use kernel_attention::{AttentionInputs, AttentionKernel, PreparedAttention};
use kernel_common::{tolerance, Buffer, Device, ErrorStats};
use std::time::Instant;

/// Inputs and reference rows of one grid point, created on first use and shared by variants.
pub(super) struct PointRunner<'a> {
    point: &'a Point,
    seed: u64,
    limits: &'a Limits,
    budget: &'a MemBudget,
    inputs: Option<AttentionInputs>,
    reference: Option<(Vec<QueryRow>, Vec<f64>)>,
}

impl<'a> PointRunner<'a> {
    pub(super) fn new(
        point: &'a Point,
        seed: u64,
        limits: &'a Limits,
        budget: &'a MemBudget,
    ) -> PointRunner<'a> {
        PointRunner {
            point,
            seed,
            limits,
            budget,
            inputs: None,
            reference: None,
        }
    }

    /// A row with the point's columns and the variant's cost model filled in.
    pub(super) fn row(
        &self,
        kernel: &dyn AttentionKernel,
        heads: &Heads,
        roof: &Roofline,
    ) -> ExpRow {
        let cost = kernel.cost(&self.point.shape, self.point.dtype);
        self.row_named(&kernel.name(), cost, heads, roof)
    }

    /// A row named `name` with the point's columns and `cost` filled in (a peer's row takes
    /// the minimum-traffic cost of the point, `AttentionShape::io_cost`).
    pub(super) fn row_named(
        &self,
        name: &str,
        cost: kernel_common::Cost,
        heads: &Heads,
        roof: &Roofline,
    ) -> ExpRow {
        let s = &self.point.shape;
        let head = heads.head(name, self.seed);
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
                hot_median_ms: None,
            },
        )
    }

    /// Why the spec's limits on the point itself (its K+V and the call's `flops`) skip it,
    /// if they do: the same for variants and peers.
    pub(super) fn point_over_limit(&self, flops: u64) -> Option<String> {
        let s = &self.point.shape;
        let kv_mib = (2 * s.kv_elems() * self.point.dtype.size()) as f64 / (1 << 20) as f64;
        let gflop = flops as f64 / 1e9;
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
        } else {
            self.over_budget(0)
        }
    }

    /// The memory guard: Q, K, V as stored and in f32, the output and its poisoned copy, and
    /// `workspace` bytes, against the run's budget.
    fn over_budget(&self, workspace: u64) -> Option<String> {
        let s = &self.point.shape;
        let per_elem = (self.point.dtype.size() + 4) as u64;
        let inputs = (s.q_elems() as u64)
            .saturating_add(2 * s.kv_elems() as u64)
            .saturating_mul(per_elem);
        let outputs = (s.q_elems() as u64).saturating_mul(8);
        let what = format!(
            "Q/K/V {}, output {}, workspace {}",
            human(inputs),
            human(outputs),
            human(workspace)
        );
        self.budget.refuse(
            inputs.saturating_add(outputs).saturating_add(workspace),
            &what,
        )
    }

    /// Why the limits skip this variant here, if they do: the point's, then its workspace.
    fn over_limit(&self, kernel: &dyn AttentionKernel, row: &ExpRow) -> Option<String> {
        let s = &self.point.shape;
        let scratch = kernel.workspace_bytes(s, rayon::current_num_threads());
        let scratch_mib = scratch as f64 / (1 << 20) as f64;
        self.point_over_limit(row.flops)
            .or_else(|| {
                (scratch_mib > self.limits.max_scores_mib).then(|| {
                    format!(
                        "workspace {scratch_mib:.0} MiB > max_scores_mib {}",
                        self.limits.max_scores_mib
                    )
                })
            })
            .or_else(|| self.over_budget(scratch))
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

    /// The point.
    pub(super) fn point(&self) -> &Point {
        self.point
    }

    /// Makes the inputs and the reference rows, once per point.
    pub(super) fn ensure_reference(&mut self) {
        if self.reference.is_none() {
            let rows = self.sample_rows();
            let want = attention_rows(&self.point.shape, self.inputs(), &rows);
            self.reference = Some((rows, want));
        }
    }

    /// The point's inputs (after `ensure_reference`).
    pub(super) fn made_inputs(&self) -> &AttentionInputs {
        self.inputs.as_ref().expect("made by ensure_reference")
    }

    /// Compares a full output with the reference rows: the error columns, the rows checked,
    /// and (passed, non-finite count).
    pub(super) fn compare(&self, full: &[f32], row: &mut ExpRow) -> (bool, usize) {
        let (rows, want) = self.reference.as_ref().expect("made by ensure_reference");
        let shape = self.point.shape;
        let unwritten = full.iter().filter(|x| !x.is_finite()).count();
        let d = shape.head_dim;
        let got: Vec<f32> = rows
            .iter()
            .flat_map(|&(b, h, i)| {
                let at = ((b * shape.q_heads + h) * shape.q_len + i) * d;
                full[at..at + d].to_vec()
            })
            .collect();
        let stats = ErrorStats::compare(&got, want);
        row.max_abs_err = Some(stats.max_abs);
        row.rel_l2_err = Some(stats.rel_l2);
        row.nmse = Some(stats.nmse);
        row.checked_rows = rows.len();
        (
            unwritten == 0 && stats.passes(&tolerance(self.point.dtype).at_peak(want)),
            unwritten,
        )
    }

    /// Supports, limits, prepare (untimed), one run on NaN-poisoned output and the check:
    /// fills the error columns (or status unsupported, skipped or error) and returns the
    /// variant ready to time. Call `ensure_reference` first.
    /// Whether `kernel` runs at this point: `supports` and the spec's limits, neither of which
    /// needs the inputs; when not, the row says why (unsupported or skipped).
    pub(super) fn precheck(
        &self,
        kernel: &dyn AttentionKernel,
        device: Device,
        row: &mut ExpRow,
    ) -> bool {
        let why = match kernel.supports(&self.point.shape, self.point.dtype, device) {
            Err(e) => Some(("unsupported", e.to_string())),
            Ok(()) => self.over_limit(kernel, row).map(|w| ("skipped", w)),
        };
        match why {
            Some((status, note)) => {
                row.head.status = status.into();
                row.note = note;
                false
            }
            None => true,
        }
    }

    pub(super) fn check<'k>(
        &'k self,
        kernel: &'k dyn AttentionKernel,
        device: Device,
        row: &mut ExpRow,
    ) -> Option<Ready<'k>> {
        let (shape, dtype) = (self.point.shape, self.point.dtype);
        let fail = |row: &mut ExpRow, status: &str, note: String| {
            row.head.status = status.into();
            row.note = note;
            None
        };
        if !self.precheck(kernel, device, row) {
            return None;
        }
        let started = Instant::now();
        let mut prepared = match kernel.prepare(&shape, self.made_inputs()) {
            Ok(p) => p,
            Err(e) => return fail(row, "error", e.to_string()),
        };
        row.prepare_ms = Some(started.elapsed().as_secs_f64() * 1e3);
        let mut out = Buffer::poisoned(dtype, shape.q_elems());
        let baseline = alloc::reset_peak();
        if let Err(e) = prepared.run(&mut out) {
            return fail(row, "error", e.to_string());
        }
        // Host heap only: a CUDA variant's workspace lives on the device (its `run` allocates
        // just the downloaded output), so the column stays empty for it.
        if device == Device::Cpu {
            row.scratch_mib = Some(alloc::peak_above(baseline) as f64 / (1 << 20) as f64);
        }
        let (passed, unwritten) = self.compare(&out.to_f32(), row);
        Some(Ready {
            prepared,
            out,
            passed,
            unwritten,
        })
    }

    /// Fills status, errors and timings of `row`: checked, then timed on its own.
    pub(super) fn measure(
        &mut self,
        kernel: &dyn AttentionKernel,
        device: Device,
        reps: usize,
        flusher: &mut CacheFlusher,
        roof: &Roofline,
        row: &mut ExpRow,
    ) {
        self.ensure_reference();
        let Some(mut ready) = self.check(kernel, device, row) else {
            return;
        };
        let timed = match ready.prepared.time_on_device(reps) {
            Some(device_times) => device_times.map(|samples| Timing { samples }),
            None => time_reps(reps, self.limits.seconds_per_point, flusher, || {
                ready.prepared.run(&mut ready.out)
            }),
        };
        finish_row(row, timed, roof, ready.passed, ready.unwritten);
        time_hot(&mut ready, reps, row);
    }
}

/// A variant prepared, run once and checked at a point, ready to time.
pub(super) struct Ready<'k> {
    pub prepared: Box<dyn PreparedAttention + 'k>,
    pub out: Buffer,
    pub passed: bool,
    pub unwritten: usize,
}

/// A CUDA variant's `hot_median_ms`: its kernels timed again hot (no L2 flush) after its
/// cold timing succeeded; a failure there is the row's error. Nothing for a CPU variant.
pub(super) fn time_hot(ready: &mut Ready, reps: usize, row: &mut ExpRow) {
    if row.head.status != "ok" && row.head.status != "fail" {
        return;
    }
    match kernel_cuda::Flush::Hot.scoped(|| ready.prepared.time_on_device(reps)) {
        None => {}
        Some(Ok(samples)) => row.hot_median_ms = Some(Timing { samples }.median() * 1e3),
        Some(Err(e)) => {
            row.head.status = "error".into();
            row.note = format!("timed hot: {e}");
        }
    }
}

/// The timing columns and the status of a checked row (or status error). On a CUDA device a
/// GB/s above the run's measured copy bandwidth makes an `ok` row an error
/// (`Row::hold_to_copy_bandwidth`), its timing kept beside the note.
pub(super) fn finish_row(
    row: &mut ExpRow,
    timed: kernel_common::error::Result<Timing>,
    roof: &Roofline,
    passed: bool,
    unwritten: usize,
) {
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
                100.0 * cost.roofline_seconds(roof.read_gbps * 1e9, roof.fma_gflops * 1e9) / median,
            );
            row.head.status = if passed { "ok" } else { "fail" }.into();
            if unwritten > 0 {
                row.note =
                    format!("{unwritten} output elements non-finite (unwritten or NaN leak)");
            }
            let gbps = row.bytes as f64 / median / 1e9;
            row.hold_to_copy_bandwidth(gbps, roof.read_gbps);
        }
        Err(e) => {
            row.head.status = "error".into();
            row.note = e.to_string();
        }
    }
}
