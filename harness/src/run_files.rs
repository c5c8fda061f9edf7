//! The toolkit every experiment runner uses, whatever its family: the request (`ExpOptions`,
//! `ExpRequest`), typed reads of the resolved grid (`GridValues`), the progress bar, the files
//! of a run (`RunFiles`: roofline measured at the start, CSV streamed point by point,
//! provenance, the report at the end), and the rules shared by all families (`spread`,
//! `counts_as_failure`). A runner asks `RunFiles::owns(key)` before each grid point and
//! hands its rows to `RunFiles::write_point`: that is all it does for sweeps, whose shards,
//! resumes and plans (`crate::sweep`) are decided here.

use crate::error::{HarnessError, Result};
use crate::provenance::{Provenance, Session, ShardRecord};
use crate::render::{self, RenderFn};
use crate::roofline::{self, Roofline};
use crate::row::{Head, Heads, PointCols, Row, RowWriter};
use crate::spec::ExperimentSpec;
use crate::sweep::plan::Plan;
use crate::sweep::shard_csv::{self, ShardCsv};
use crate::sweep::{id, Definition, PointBook, PointKey, Role, Shard, SweepOptions};
use crate::{machine, Format};
use indicatif::{ProgressBar, ProgressStyle};
use kernel_common::Device;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
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
    /// `--shard`, `--sweep-id`, `--resume`, or `harness plan`.
    pub sweep: SweepOptions,
    /// What a point may plan to hold before its runner skips it (`--mem-budget`).
    pub mem_budget: crate::mem_guard::MemBudget,
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

/// `AxB` with both positive (`4096x11008`, `512x8`); `None` otherwise, for the caller to name
/// its form in the error.
pub fn pair_of_counts(text: &str) -> Option<(usize, usize)> {
    text.split_once('x')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .filter(|&(a, b): &(usize, usize)| a > 0 && b > 0)
}

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

/// The files of a run being written: its CSV (a grid point's rows at a time), its
/// provenance, the roofline measured when it started, and which points it measures.
pub struct RunFiles {
    /// What its rows' `run_id` says: the run id, or a shard's sweep id.
    pub run_id: String,
    pub csv_path: PathBuf,
    pub json_path: PathBuf,
    pub prov: Provenance,
    pub roof: Roofline,
    /// What every row's head repeats: the run id, the experiment, the device.
    pub heads: Heads,
    /// None under `harness plan`, which writes nothing.
    writer: Option<RowWriter>,
    points: PointBook,
    /// Rows already in a resumed shard's CSV, and how many of them count as failures.
    rows_before: usize,
    failures_before: usize,
    /// The row count the runner announced (`progress_bar`): `harness plan`'s rows.
    rows_hint: usize,
}

/// A shard's files found on disk by `--resume`, checked against this sweep.
struct Resumed {
    prov: Provenance,
    csv: Option<ShardCsv>,
}

impl RunFiles {
    /// Measures the roofline, creates results/<exp>/<run-id>.csv (or the shard's
    /// `<sweep-id>.shard-<i>-of-<n>.csv`, or reopens it under `--resume`) and writes
    /// provenance. Under `harness plan` it measures and creates nothing.
    pub fn start(
        opts: &ExpOptions,
        spec: &ExperimentSpec,
        spec_path: &Path,
        grid: BTreeMap<String, Vec<String>>,
    ) -> Result<RunFiles> {
        let sweep = &opts.sweep;
        if sweep.plan.is_none() && !sweep.is_sweep() {
            return RunFiles::start_whole(opts, spec, spec_path, grid);
        }
        let def = definition(opts, spec_path, &grid)?;
        let sweep_id = match &sweep.sweep_id {
            Some(given) => {
                id::check_sweep_id(given)?;
                given.clone()
            }
            None => def.derived_id(&spec.name, opts.quick, &machine::git_state().0),
        };
        let shard = sweep.shard.unwrap_or(Shard::WHOLE);
        let csv_path = id::shard_csv(&opts.results_dir.join(&spec.name), &sweep_id, shard);
        let json_path = csv_path.with_extension("json");
        let stem = format!("{sweep_id}.{}", shard.label());
        let start = |roof: Roofline| {
            let mut prov = provenance(opts, spec, spec_path, grid.clone(), &stem, roof);
            prov.sweep = Some(ShardRecord {
                sweep_id: sweep_id.clone(),
                shard: shard.index,
                shards: shard.count,
                definition: def.digest.clone(),
                spec_digest: def.spec_digest.clone(),
                points: vec![],
                owned: 0,
                sessions: vec![],
            });
            prov
        };
        if let Some(count) = sweep.plan {
            return Ok(RunFiles {
                heads: Heads::new(&sweep_id, &spec.name, &opts.device.to_string()),
                run_id: sweep_id.clone(),
                prov: start(Roofline::default()),
                csv_path,
                json_path,
                roof: Roofline::default(),
                writer: None,
                points: PointBook::new(Role::Plan(count), HashSet::new()),
                rows_before: 0,
                failures_before: 0,
                rows_hint: 0,
            });
        }
        // The shard on disk is checked before anything is measured or written.
        let resumed = existing_shard(&csv_path, &json_path, spec, &def, shard, sweep.resume)?;
        let roof = measure_roofline(opts)?;
        let dir = csv_path.parent().expect("a shard file has a folder");
        std::fs::create_dir_all(dir)
            .map_err(HarnessError::io(format!("creating {}", dir.display())))?;
        let csv = resumed.as_ref().and_then(|r| r.csv.clone());
        let done: HashSet<String> = csv
            .iter()
            .flat_map(|c| c.points.iter().map(|p| p.key.clone()))
            .collect();
        let session = Session::now(&opts.device.to_string(), roof.clone(), done.len());
        let mut prov = match resumed {
            Some(r) => {
                eprintln!(
                    "resuming {}: {} points complete{}",
                    csv_path.display(),
                    done.len(),
                    csv.as_ref()
                        .and_then(|c| c.tail.as_ref())
                        .map_or(String::new(), |t| format!(", discarding {t}"))
                );
                let mut prov = r.prov;
                prov.status = "running (if no process is running, it was interrupted)".into();
                prov.finished_at = None;
                prov
            }
            None => start(roof.clone()),
        };
        if let Some(rec) = prov.sweep.as_mut() {
            rec.sessions.push(session);
        }
        // Provenance first: a CSV on disk always has its JSON beside it.
        prov.write(&json_path)?;
        let writer = match &csv {
            Some(c) => RowWriter::append(
                csv_path.clone(),
                c.complete_len,
                c.header_line.clone(),
                c.rows(),
            )?,
            None => RowWriter::create(csv_path.clone())?,
        };
        let failures_before = csv.as_ref().map_or(0, failures_in);
        Ok(RunFiles {
            heads: Heads::new(&sweep_id, &spec.name, &opts.device.to_string()),
            run_id: sweep_id,
            csv_path,
            json_path,
            prov,
            roof,
            rows_before: writer.rows,
            writer: Some(writer),
            points: PointBook::new(Role::Shard(shard), done),
            failures_before,
            rows_hint: 0,
        })
    }

    /// A plain run: every point, results/<exp>/<run-id>.*.
    fn start_whole(
        opts: &ExpOptions,
        spec: &ExperimentSpec,
        spec_path: &Path,
        grid: BTreeMap<String, Vec<String>>,
    ) -> Result<RunFiles> {
        let roof = measure_roofline(opts)?;
        let run_id = machine::run_id(if opts.quick { "quick" } else { "" });
        let dir = opts.results_dir.join(&spec.name);
        std::fs::create_dir_all(&dir)
            .map_err(HarnessError::io(format!("creating {}", dir.display())))?;
        let (csv_path, json_path) = (
            dir.join(format!("{run_id}.csv")),
            dir.join(format!("{run_id}.json")),
        );
        let prov = provenance(opts, spec, spec_path, grid, &run_id, roof.clone());
        prov.write(&json_path)?;
        let writer = RowWriter::create(csv_path.clone())?;
        Ok(RunFiles {
            heads: Heads::new(&run_id, &spec.name, &opts.device.to_string()),
            run_id,
            csv_path,
            json_path,
            prov,
            roof,
            writer: Some(writer),
            points: PointBook::new(Role::Whole, HashSet::new()),
            rows_before: 0,
            failures_before: 0,
            rows_hint: 0,
        })
    }

    /// The head of a row of `variant` whose inputs came from `seed`: this run's id,
    /// experiment and device, status and timing still empty.
    pub fn head(&self, variant: &str, seed: u64) -> Head {
        self.heads.head(variant, seed)
    }

    /// Whether this run measures the grid point `key`: every point in a plain run, the
    /// shard's own points less those already complete under `--resume`, none under
    /// `harness plan`. Ask before making the point's inputs.
    pub fn owns(&mut self, key: &PointKey) -> bool {
        self.points.owns(key)
    }

    /// Writes the rows of the grid point `key`, all at once (a point is the unit `--resume`
    /// keeps or measures again). A point written twice in one run is an error.
    pub fn write_point<'r, F: Serialize + 'r>(
        &mut self,
        key: &PointKey,
        rows: impl IntoIterator<Item = &'r Row<F>>,
    ) -> Result<()> {
        self.points.written(key)?;
        let rows: Vec<&Row<F>> = rows.into_iter().collect();
        let point = PointCols {
            point: key.to_string(),
            point_rows: rows.len(),
        };
        match self.writer.as_mut() {
            Some(w) => w.write_point(&point, &rows),
            None => Ok(()),
        }
    }

    /// A progress bar for a run of `rows` rows over the whole grid (a shard's share of them).
    pub fn progress_bar(&mut self, rows: usize) -> ProgressBar {
        self.rows_hint = rows;
        match self.points.role {
            Role::Whole => progress_bar(rows),
            Role::Shard(shard) => {
                progress_bar(rows.div_ceil(shard.count).saturating_sub(self.rows_before))
            }
            Role::Plan(_) => ProgressBar::hidden(),
        }
    }

    /// Marks the run finished, renders the report through the family's `render` and prints
    /// it (or the rows as JSON); exit code 1 on failures. A shard records its points and
    /// leaves the report to `harness merge`; `harness plan` prints the plan.
    pub fn finish(
        mut self,
        spec: &ExperimentSpec,
        format: Format,
        failures: usize,
        render: RenderFn,
    ) -> Result<i32> {
        let failures = failures + self.failures_before;
        let rows = self.writer.as_ref().map_or(0, |w| w.rows);
        self.prov.status = "finished".into();
        self.prov.finished_at = Some(machine::now_rfc3339());
        if let Some(warning) = crate::machine_load::at_end(&mut self.prov.load) {
            eprintln!("{warning}");
        }
        self.prov.rows = rows;
        match self.points.role {
            Role::Plan(count) => {
                let plan = Plan::new(
                    &spec.name,
                    &self.run_id,
                    self.points.seen(),
                    self.rows_hint,
                    count,
                    spec.limits.seconds_per_point,
                );
                println!("{}", plan.render(format));
                return Ok(0);
            }
            Role::Shard(shard) => {
                let (seen, owned) = (self.points.seen().to_vec(), self.points.owned());
                if let Some(rec) = self.prov.sweep.as_mut() {
                    rec.points = seen;
                    rec.owned = owned;
                    if let Some(s) = rec.sessions.last_mut() {
                        s.finished_at = self.prov.finished_at.clone();
                    }
                }
                self.prov.write(&self.json_path)?;
                eprintln!(
                    "shard {shard} of sweep {}: {owned} points ({} complete before), {rows} rows in {}; `harness merge {}` once every shard has finished",
                    self.run_id,
                    self.points.done(),
                    self.csv_path.display(),
                    self.run_id
                );
            }
            Role::Whole => {
                self.prov.write(&self.json_path)?;
                let report = render::render_run(spec, &self.csv_path, &self.prov, render)?;
                match format {
                    Format::Table => println!("{}", report.tables),
                    Format::Json => println!("{}", serde_json::to_string_pretty(&report.rows)?),
                }
                eprintln!(
                    "wrote {rows} rows: {} (+ .json, .md, .svg)",
                    self.csv_path.display()
                );
            }
        }
        if failures > 0 {
            eprintln!("{failures} row(s) disagree with the reference: see status=fail in the CSV");
        }
        Ok(if failures > 0 { 1 } else { 0 })
    }
}

/// Provenance of a run of `spec` named `run_id`, starting now.
fn provenance(
    opts: &ExpOptions,
    spec: &ExperimentSpec,
    spec_path: &Path,
    grid: BTreeMap<String, Vec<String>>,
    run_id: &str,
    roof: Roofline,
) -> Provenance {
    let mut prov = Provenance::start(
        run_id,
        &spec.name,
        spec_path,
        &spec.claims,
        &opts.device.to_string(),
        opts.quick,
        opts.seed,
        grid,
        roof,
    );
    let budget = &opts.mem_budget;
    prov.inputs.insert(
        "mem_budget".into(),
        format!(
            "{} ({})",
            crate::mem_guard::human(budget.bytes),
            budget.origin
        ),
    );
    prov
}

/// The roofline of this run's device, measured now.
fn measure_roofline(opts: &ExpOptions) -> Result<Roofline> {
    match opts.device {
        Device::Cuda(n) => {
            eprintln!(
                "measuring {}'s copy bandwidth and bf16 GEMM rate for this run",
                opts.device
            );
            Ok(roofline::measure_cuda_and_record(&opts.results_dir, n)?.0)
        }
        Device::Cpu => {
            eprintln!("measuring this machine's roofline for this run (a few seconds)");
            roofline::measure_and_record(&opts.results_dir)
        }
    }
}

/// What shards of one sweep share: the spec file, the resolved grid and the options that
/// change what is measured (not threads or the ISA cap: those are the machine's, recorded
/// per session).
fn definition(
    opts: &ExpOptions,
    spec_path: &Path,
    grid: &BTreeMap<String, Vec<String>>,
) -> Result<Definition> {
    let text = std::fs::read(spec_path)
        .map_err(HarnessError::io(format!("reading {}", spec_path.display())))?;
    let options = serde_json::json!({
        "grid": grid,
        "variants": opts.variants,
        "peers": opts.peers,
        "reps": opts.reps,
        "seed": opts.seed,
        "device": opts.device.to_string(),
        "quick": opts.quick,
    });
    Ok(Definition::of(&text, &options))
}

/// The shard's files if they exist: refused without `--resume`, and refused when they
/// belong to another spec or sweep.
fn existing_shard(
    csv: &Path,
    json: &Path,
    spec: &ExperimentSpec,
    def: &Definition,
    shard: Shard,
    resume: bool,
) -> Result<Option<Resumed>> {
    if !csv.exists() && !json.exists() {
        return Ok(None);
    }
    let usage = |why: String| HarnessError::Usage(format!("--resume: {} {why}", csv.display()));
    if !resume {
        return Err(HarnessError::Usage(format!(
            "{} exists: --resume continues that shard, another --sweep-id starts a new sweep",
            csv.display()
        )));
    }
    let prov =
        Provenance::read(json).map_err(|e| usage(format!("has no readable provenance ({e})")))?;
    let Some(rec) = &prov.sweep else {
        return Err(usage("is not a shard of a sweep".into()));
    };
    if prov.experiment != spec.name || rec.spec_digest != def.spec_digest {
        return Err(usage(format!(
            "is a shard of another spec (experiment '{}', spec digest {}; this spec's is {})",
            prov.experiment, rec.spec_digest, def.spec_digest
        )));
    }
    if rec.definition != def.digest || (rec.shard, rec.shards) != (shard.index, shard.count) {
        return Err(usage(
            "is a shard of another sweep of this spec: its grid, variants, peers, reps, seed, device or shard differ".into(),
        ));
    }
    let csv = match csv.exists() {
        true => Some(shard_csv::read(csv)?),
        false => None,
    };
    Ok(Some(Resumed { prov, csv }))
}

/// Rows of a shard CSV's complete points that count as failures.
fn failures_in(csv: &ShardCsv) -> usize {
    let (Some(status), Some(note)) = (csv.column("status"), csv.column("note")) else {
        return 0;
    };
    csv.points
        .iter()
        .flat_map(|p| &p.rows)
        .filter(|r| counts_as_failure(&r[status], &r[note]))
        .count()
}
