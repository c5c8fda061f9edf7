//! `harness exp NAME`: expands an experiment spec into grid points and, for each point and
//! variant, prepares the variant (untimed), runs it once on NaN-poisoned output and checks
//! sampled rows against the f64 reference, then times it; every row streams to the CSV as it
//! finishes. Ends by writing provenance, the markdown table and the SVG plot.

use crate::error::{HarnessError, Result};
use crate::measure::{time_reps, CacheFlusher};
use crate::output::{ExpRow, Provenance, RowWriter};
use crate::roofline::{self, Roofline};
use crate::spec::{parse_set, ExperimentSpec, Limits, Point};
use crate::{alloc, machine, registry, render, Format};
use attention_kernels::reference::{attention_rows, QueryRow};
use attention_kernels::{AttentionInputs, AttentionKernel};
use indicatif::{ProgressBar, ProgressStyle};
use kernel_common::inputs::derive_seed;
use kernel_common::{tolerance, Buffer, Device, ErrorStats};
use std::path::PathBuf;
use std::time::Instant;

/// What `harness exp` was asked to do.
#[derive(Debug, Clone)]
pub struct ExpOptions {
    pub name: String,
    pub sets: Vec<String>,
    pub variants: Vec<String>,
    pub quick: bool,
    pub device: Device,
    pub reps: Option<usize>,
    pub seed: u64,
    pub format: Format,
    pub experiments_dir: PathBuf,
    pub results_dir: PathBuf,
}

/// Default timed repetitions per point.
pub const DEFAULT_REPS: usize = 5;

/// Runs the experiment; returns the exit code (1 when a variant gave a wrong answer).
pub fn run(opts: &ExpOptions) -> Result<i32> {
    // Everything that can be wrong with the request is found before results/ is touched.
    let (mut spec, spec_path) = ExperimentSpec::load(&opts.experiments_dir, &opts.name)?;
    let cuda = matches!(opts.device, Device::Cuda(_));
    if let Device::Cuda(n) = opts.device {
        // Driver, GPU and NVRTC first: each missing one is named in one line.
        kernel_cuda::CudaRuntime::get(n)?;
    }
    if let (true, Some(limits)) = (cuda, spec.cuda_limits.clone()) {
        spec.limits = limits;
    }
    let sets = opts
        .sets
        .iter()
        .map(|s| parse_set(s))
        .collect::<Result<Vec<_>>>()?;
    let grid = spec.resolve_grid(opts.quick, &sets)?;
    let names = if !opts.variants.is_empty() {
        opts.variants.clone()
    } else if cuda {
        if spec.cuda_variants.is_empty() {
            return Err(HarnessError::Usage(format!(
                "experiment '{}' names no cuda_variants; give them with --variant cuda_...",
                spec.name
            )));
        }
        spec.cuda_variants.clone()
    } else {
        spec.variants.clone()
    };
    let reps = opts.reps.or(spec.reps).unwrap_or(DEFAULT_REPS);
    if reps == 0 {
        return Err(HarnessError::Usage("--reps must be at least 1".into()));
    }
    match spec.family.as_str() {
        "quant" => return crate::exp_quant::run(opts, &spec, &spec_path, grid, &names, reps),
        "moe" => return crate::exp_moe::run(opts, &spec, &spec_path, grid, &names, reps),
        "kv" => return crate::exp_kv::run(opts, &spec, &spec_path, grid),
        "kv_alloc" => return crate::exp_kv_alloc::run(opts, &spec, &spec_path, grid, &names),
        "serving" => return crate::exp_serving::run(opts, &spec, &spec_path, grid),
        "decode" => return crate::exp_decode::run(opts, &spec, &spec_path, grid),
        "spec" => return crate::exp_spec::run(opts, &spec, &spec_path, grid),
        _ => {}
    }
    let points = ExperimentSpec::points(&grid)?;
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
    registry::require_variant_devices(&names, opts.device)?;
    crate::require_device(
        opts.device,
        kernels
            .iter()
            .map(|k| k.supports(&points[0].shape, points[0].dtype, opts.device)),
    )?;
    let mut run = RunFiles::start(opts, &spec, &spec_path, grid)?;
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
            if counts_as_failure(&row.status, &row.note) {
                failures += 1;
            }
            run.writer.write(&row)?;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    run.finish::<ExpRow>(&spec, opts.format, failures)
}

/// Rows that make an experiment exit 1: wrong outputs, and a device that failed (a launch,
/// a fault, a kernel that does not compile) — not a variant that refuses a point.
pub(crate) fn counts_as_failure(status: &str, note: &str) -> bool {
    status == "fail" || (status == "error" && note.starts_with("device error"))
}

/// Up to `count` indices spread evenly over 0..len, first and last included (all of them
/// when len <= count): the outputs an experiment checks against its reference.
pub(crate) fn spread(len: usize, count: usize) -> Vec<usize> {
    let n = len.min(count);
    let mut v: Vec<usize> = (0..n).map(|i| i * (len - 1) / (n - 1).max(1)).collect();
    v.dedup();
    v
}

/// Typed reads of a resolved grid, one clear error per bad value.
pub(crate) struct GridValues<'a>(pub &'a std::collections::BTreeMap<String, Vec<String>>);

impl GridValues<'_> {
    /// The values of `key`, or `default` when the grid does not set it.
    pub fn strings(&self, key: &str, default: &[&str]) -> Vec<String> {
        self.0
            .get(key)
            .cloned()
            .unwrap_or_else(|| default.iter().map(|s| s.to_string()).collect())
    }

    /// Values of `key` parsed as `T` (a positive count, a rate, ...), checked by `ok`.
    pub fn parsed<T: std::str::FromStr + Copy>(
        &self,
        key: &str,
        default: &[&str],
        what: &str,
        ok: impl Fn(T) -> bool,
    ) -> Result<Vec<T>> {
        self.strings(key, default)
            .iter()
            .map(|v| match v.parse::<T>() {
                Ok(x) if ok(x) => Ok(x),
                _ => Err(HarnessError::Usage(format!("{key} '{v}' is not {what}"))),
            })
            .collect()
    }

    /// Positive integers.
    pub fn counts(&self, key: &str, default: &[&str]) -> Result<Vec<usize>> {
        self.parsed(key, default, "a positive integer", |n: usize| n > 0)
    }

    /// The single string value of `key`.
    pub fn one_string(&self, key: &str, default: &str) -> Result<String> {
        match &self.strings(key, &[default])[..] {
            [x] => Ok(x.clone()),
            v => Err(HarnessError::Usage(format!(
                "{key} takes one value, got {}",
                v.len()
            ))),
        }
    }

    /// The single value of `key` (a workload parameter, not a swept axis).
    pub fn one<T: std::str::FromStr + Copy>(
        &self,
        key: &str,
        default: &str,
        what: &str,
        ok: impl Fn(T) -> bool,
    ) -> Result<T> {
        let v = self.parsed(key, &[default], what, ok)?;
        match v[..] {
            [x] => Ok(x),
            _ => Err(HarnessError::Usage(format!(
                "{key} takes one value, got {}",
                v.len()
            ))),
        }
    }
}

/// A progress bar over `len` rows.
pub(crate) fn progress_bar(len: usize) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} rows (eta {eta}) {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar
}

/// The files of a run being written: its CSV (rows flushed one by one), its provenance, and
/// the roofline measured when it started.
pub(crate) struct RunFiles {
    pub run_id: String,
    pub csv_path: PathBuf,
    pub json_path: PathBuf,
    pub prov: Provenance,
    pub roof: Roofline,
    pub writer: RowWriter,
}

impl RunFiles {
    /// Measures the roofline, creates results/<exp>/<run-id>.csv and writes provenance.
    pub fn start(
        opts: &ExpOptions,
        spec: &ExperimentSpec,
        spec_path: &std::path::Path,
        grid: std::collections::BTreeMap<String, Vec<String>>,
    ) -> Result<RunFiles> {
        let roof = match opts.device {
            Device::Cuda(n) => {
                eprintln!(
                    "measuring {}'s copy bandwidth and bf16 GEMM rate for this run",
                    opts.device
                );
                roofline::measure_cuda_and_record(&opts.results_dir, n)?.0
            }
            Device::Cpu => {
                eprintln!("measuring this machine's roofline for this run (a few seconds)");
                roofline::measure_and_record(&opts.results_dir)?
            }
        };
        let run_id = machine::run_id(if opts.quick { "quick" } else { "" });
        let dir = opts.results_dir.join(&spec.name);
        std::fs::create_dir_all(&dir)
            .map_err(HarnessError::io(format!("creating {}", dir.display())))?;
        let (csv_path, json_path) = (
            dir.join(format!("{run_id}.csv")),
            dir.join(format!("{run_id}.json")),
        );
        let prov = Provenance::start(
            &run_id,
            &spec.name,
            spec_path,
            &spec.claims,
            &opts.device.to_string(),
            opts.quick,
            opts.seed,
            grid,
            roof.clone(),
        );
        prov.write(&json_path)?;
        let writer = RowWriter::create(csv_path.clone())?;
        Ok(RunFiles {
            run_id,
            csv_path,
            json_path,
            prov,
            roof,
            writer,
        })
    }

    /// Marks the run finished, renders the report and prints it; exit code 1 on failures.
    pub fn finish<R: serde::de::DeserializeOwned + serde::Serialize>(
        mut self,
        spec: &ExperimentSpec,
        format: Format,
        failures: usize,
    ) -> Result<i32> {
        self.prov.status = "finished".into();
        self.prov.finished_at = Some(machine::now_rfc3339());
        self.prov.rows = self.writer.rows;
        self.prov.write(&self.json_path)?;
        let report = render::render_run(spec, &self.csv_path, &self.prov)?;
        match format {
            Format::Table => println!("{}", report.summary),
            Format::Json => println!(
                "{}",
                serde_json::to_string_pretty(&crate::output::read_rows::<R>(&self.csv_path)?)?
            ),
        }
        eprintln!(
            "wrote {} rows: {} (+ .json, .md, .svg)",
            self.writer.rows,
            self.csv_path.display()
        );
        if failures > 0 {
            eprintln!("{failures} row(s) disagree with the reference: see status=fail in the CSV");
        }
        Ok(if failures > 0 { 1 } else { 0 })
    }
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
        ExpRow {
            run_id: run_id.into(),
            experiment: exp.into(),
            variant: kernel.name(),
            mode: self.point.mode.clone(),
            dtype: self.point.dtype.to_string(),
            batch: s.batch,
            q_heads: s.q_heads,
            kv_heads: s.kv_heads,
            q_len: s.q_len,
            kv_len: s.kv_len,
            head_dim: s.head_dim,
            causal: s.causal,
            threads: rayon::current_num_threads(),
            device: device.to_string(),
            status: String::new(),
            reps: 0,
            median_ms: None,
            p10_ms: None,
            p90_ms: None,
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
            seed: self.seed,
            note: String::new(),
        }
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
            row.status = "unsupported".into();
            row.note = e.to_string();
            return;
        }
        if let Some(why) = self.over_limit(kernel, row) {
            row.status = "skipped".into();
            row.note = why;
            return;
        }
        let (rows, want) = self.reference();
        let inputs = self.inputs.as_ref().expect("created by reference()");
        let started = Instant::now();
        let mut prepared = match kernel.prepare(&shape, inputs) {
            Ok(p) => p,
            Err(e) => {
                row.status = "error".into();
                row.note = e.to_string();
                return;
            }
        };
        row.prepare_ms = Some(started.elapsed().as_secs_f64() * 1e3);
        let mut out = Buffer::poisoned(dtype, shape.q_elems());
        let baseline = alloc::reset_peak();
        if let Err(e) = prepared.run(&mut out) {
            row.status = "error".into();
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
                row.reps = t.samples.len();
                row.median_ms = Some(median * 1e3);
                row.p10_ms = Some(t.percentile(10.0) * 1e3);
                row.p90_ms = Some(t.percentile(90.0) * 1e3);
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
                row.status = if passed { "ok" } else { "fail" }.into();
                if unwritten > 0 {
                    row.note =
                        format!("{unwritten} output elements non-finite (unwritten or NaN leak)");
                }
            }
            Err(e) => {
                row.status = "error".into();
                row.note = e.to_string();
            }
        }
    }
}
