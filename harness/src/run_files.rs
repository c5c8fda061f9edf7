//! The toolkit every experiment runner uses, whatever its family: the request (`ExpOptions`,
//! `ExpRequest`), typed reads of the resolved grid (`GridValues`), the progress bar, the files
//! of a run (`RunFiles`: roofline measured at the start, CSV streamed row by row, provenance,
//! the report at the end), and the rules shared by all families (`spread`, `counts_as_failure`).

use crate::error::{HarnessError, Result};
use crate::provenance::Provenance;
use crate::render::{self, RenderFn};
use crate::roofline::{self, Roofline};
use crate::row::RowWriter;
use crate::spec::ExperimentSpec;
use crate::{machine, Format};
use indicatif::{ProgressBar, ProgressStyle};
use kernel_common::Device;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    /// Peers to run instead of the spec's (`--peer`).
    pub peers: Vec<String>,
    /// Run none of the spec's peers (`--no-peers`).
    pub no_peers: bool,
    /// Where peers are registered (`scripts/peers` of the checkout).
    pub peers_dir: PathBuf,
}

/// Default timed repetitions per point.
pub const DEFAULT_REPS: usize = 5;

/// One experiment as a family's runner receives it: the request, the loaded spec, the grid
/// after `--quick` and `--set`, the variants to run and the repetitions per point.
pub struct ExpRequest<'a> {
    pub opts: &'a ExpOptions,
    pub spec: &'a ExperimentSpec,
    pub spec_path: &'a Path,
    pub grid: BTreeMap<String, Vec<String>>,
    pub names: Vec<String>,
    pub reps: usize,
    /// The peers to run beside the variants (their manifests, checked).
    pub peers: Vec<crate::peer::Manifest>,
    /// The checkout the peers belong to (their `{python}`: target/peers/venv).
    pub peer_root: PathBuf,
}

/// Rows that make an experiment exit 1: wrong outputs, and a device that failed (a launch,
/// a fault, a kernel that does not compile) — not a variant that refuses a point.
pub fn counts_as_failure(status: &str, note: &str) -> bool {
    status == "fail" || (status == "error" && note.starts_with("device error"))
}

/// Up to `count` indices spread evenly over 0..len, first and last included (all of them
/// when len <= count): the outputs an experiment checks against its reference.
pub fn spread(len: usize, count: usize) -> Vec<usize> {
    let n = len.min(count);
    let mut v: Vec<usize> = (0..n).map(|i| i * (len - 1) / (n - 1).max(1)).collect();
    v.dedup();
    v
}

/// Typed reads of a resolved grid, one clear error per bad value.
pub struct GridValues<'a>(pub &'a BTreeMap<String, Vec<String>>);

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
pub fn progress_bar(len: usize) -> ProgressBar {
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
pub struct RunFiles {
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
        spec_path: &Path,
        grid: BTreeMap<String, Vec<String>>,
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

    /// Marks the run finished, renders the report through the family's `render` and prints
    /// it (or the rows as JSON); exit code 1 on failures.
    pub fn finish(
        mut self,
        spec: &ExperimentSpec,
        format: Format,
        failures: usize,
        render: RenderFn,
    ) -> Result<i32> {
        self.prov.status = "finished".into();
        self.prov.finished_at = Some(machine::now_rfc3339());
        self.prov.rows = self.writer.rows;
        self.prov.write(&self.json_path)?;
        let report = render::render_run(spec, &self.csv_path, &self.prov, render)?;
        match format {
            Format::Table => println!("{}", report.tables),
            Format::Json => println!("{}", serde_json::to_string_pretty(&report.rows)?),
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
