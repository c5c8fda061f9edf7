//! `harness replay FILE...`: runs every variant that supports a captured case on its exact
//! tensors, compares each output with the stored one (when the file has `out`) and with the
//! f64 reference under the tolerance table `harness check` uses (packed quantised bytes compare
//! exactly), times it, and prints one row per variant. A first row per file rates the stored
//! output itself against the reference. Exit 0 when every supporting variant agrees with the
//! stored output, 1 when one disagrees, 2 when a file is malformed (all files are parsed and
//! validated before anything runs).

use crate::case_file::CaseFile;
use crate::case_job::{Expect, Job, Output, Prepared};
use crate::error::{HarnessError, Result};
use crate::families;
use crate::measure::{time_reps, CacheFlusher, Timing};
use crate::row::{Heads, Row};
use crate::Format;
use kernel_common::{Device, ErrorStats};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;

/// What `harness replay` was asked to do.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub files: Vec<PathBuf>,
    pub device: Device,
    pub variants: Vec<String>,
    pub reps: usize,
    pub format: Format,
}

/// A replay row's own columns: one variant on one case file (the head's status is agree |
/// disagree | unsupported | error | info, the last for the stored output's own row).
#[derive(Debug, Clone, Serialize)]
pub struct ReplayCols {
    pub file: String,
    pub family: String,
    pub case: String,
    pub vs_stored_rel_l2: Option<f64>,
    pub vs_stored_max_abs: Option<f64>,
    pub vs_ref_rel_l2: Option<f64>,
    pub vs_ref_max_abs: Option<f64>,
}

/// One variant on one case file.
pub type ReplayRow = Row<ReplayCols>;

/// Runs `job` once (the output that is checked), then times `reps` more calls; the job's
/// preparation (an attention kernel's `prepare`) stays outside the timing.
fn execute(
    job: &dyn Job,
    reps: usize,
    flusher: &mut CacheFlusher,
) -> kernel_common::error::Result<(Output, Timing)> {
    let mut call = job.start()?;
    call.run()?;
    let first = call.output();
    let t = time_reps(reps, 2.0, flusher, || call.run())?;
    Ok((first, t))
}

/// Runs the replay; returns the exit code.
pub fn run(opts: &ReplayOptions) -> Result<i32> {
    if opts.files.is_empty() {
        return Err(HarnessError::Usage(
            "replay needs at least one case file".into(),
        ));
    }
    if opts.reps == 0 {
        return Err(HarnessError::Usage("--reps must be at least 1".into()));
    }
    if let Device::Cuda(n) = opts.device {
        kernel_cuda::probe_cuda(n)?;
        return Err(HarnessError::Usage(format!(
            "{} is present, but replay drives the CPU variants only (the cuda_ variants run under check and exp); use --device cpu",
            opts.device
        )));
    }
    let cases = opts
        .files
        .iter()
        .map(|f| CaseFile::load(f, |family| families::replayable(family).map(|r| r.needs)))
        .collect::<Result<Vec<_>>>()?;
    let prepared = cases
        .iter()
        .map(|c| {
            let family = families::replayable(&c.family).map_err(|e| c.error(e))?;
            (family.prepare)(c, &opts.variants)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut rows = vec![];
    let mut flusher = CacheFlusher::new();
    for (case, p) in cases.iter().zip(prepared.iter()) {
        replay_case(case, p, opts.reps, &mut flusher, &mut rows);
    }
    let disagree = rows.iter().filter(|r| r.head.status == "disagree").count();
    match opts.format {
        Format::Table => print_table(&rows),
        Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
    }
    if disagree > 0 {
        eprintln!("{disagree} variant(s) disagree with the stored output or the reference");
    }
    Ok(if disagree > 0 { 1 } else { 0 })
}

fn stats_cols(s: Option<ErrorStats>) -> (Option<f64>, Option<f64>) {
    (s.map(|s| s.rel_l2), s.map(|s| s.max_abs))
}

fn replay_case(
    case: &CaseFile,
    p: &Prepared,
    reps: usize,
    flusher: &mut CacheFlusher,
    rows: &mut Vec<ReplayRow>,
) {
    let row = |variant: &str, status: &str| {
        let head =
            Heads::new("", "replay", &Device::Cpu.to_string()).with_status(variant, 0, status);
        Row::new(
            head,
            ReplayCols {
                file: case.path.display().to_string(),
                family: case.family.clone(),
                case: p.label.clone(),
                vs_stored_rel_l2: None,
                vs_stored_max_abs: None,
                vs_ref_rel_l2: None,
                vs_ref_max_abs: None,
            },
        )
    };
    let mut rated: Vec<*const Expect> = vec![];
    for run in &p.runs {
        let e = &run.expect;
        if rated.contains(&Arc::as_ptr(e)) {
            continue;
        }
        rated.push(Arc::as_ptr(e));
        if let (Some(Output::Floats(stored)), Some(reference)) = (&e.stored, &e.reference) {
            let s = ErrorStats::compare(stored, reference);
            let mut r = row("(stored out)", "info");
            (r.vs_ref_rel_l2, r.vs_ref_max_abs) = stats_cols(Some(s));
            r.note = format!(
                "the file's own output vs the f64 reference: {}",
                if s.passes(&e.tol) {
                    "within tolerance"
                } else {
                    "OUTSIDE tolerance"
                }
            );
            rows.push(r);
        }
    }
    for run in &p.runs {
        let mut r = row(&run.name, "");
        let job = match &run.job {
            Err(why) => {
                r.head.status = "unsupported".into();
                r.note = why.clone();
                rows.push(r);
                continue;
            }
            Ok(j) => j,
        };
        let (out, timing) = match execute(job.as_ref(), reps, flusher) {
            Ok(o) => o,
            Err(e) => {
                r.head.status = "error".into();
                r.note = e.to_string();
                rows.push(r);
                continue;
            }
        };
        r.head.set_timing(&timing);
        let expect = &run.expect;
        let agrees = match (&out, &expect.stored) {
            (Output::Bytes(got), Some(Output::Bytes(want))) => {
                let differ = got.iter().zip(want).filter(|(a, b)| a != b).count()
                    + got.len().abs_diff(want.len());
                r.note = if differ > 0 {
                    let first = got.iter().zip(want).position(|(a, b)| a != b);
                    format!(
                        "{differ} of {} bytes differ (first at byte {})",
                        want.len(),
                        first.map_or("end".into(), |i| i.to_string())
                    )
                } else {
                    format!("all {} bytes identical", want.len())
                };
                differ == 0
            }
            (Output::Floats(got), stored) => {
                let vs_ref = expect
                    .reference
                    .as_ref()
                    .map(|w| ErrorStats::compare(got, w));
                (r.vs_ref_rel_l2, r.vs_ref_max_abs) = stats_cols(vs_ref);
                match stored {
                    Some(Output::Floats(want)) => {
                        let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
                        let s = ErrorStats::compare(got, &want);
                        (r.vs_stored_rel_l2, r.vs_stored_max_abs) = stats_cols(Some(s));
                        s.passes(&expect.tol)
                    }
                    _ => vs_ref.is_some_and(|s| s.passes(&expect.tol)),
                }
            }
            (Output::Bytes(_), _) => true,
        };
        r.head.status = if agrees { "agree" } else { "disagree" }.into();
        rows.push(r);
    }
}

fn print_table(rows: &[ReplayRow]) {
    let fmt = |v: Option<f64>| v.map_or("–".to_string(), |x| format!("{x:.2e}"));
    let mut file = String::new();
    for r in rows {
        if r.file != file {
            file = r.file.clone();
            println!("\n{} — {} {}", r.file, r.family, r.case);
            println!(
                "  {:<30} {:<11} {:>10} {:>10} {:>10} {:>10} {:>9}  note",
                "variant", "status", "stored L2", "stored max", "ref L2", "ref max", "ms"
            );
        }
        println!(
            "  {:<30} {:<11} {:>10} {:>10} {:>10} {:>10} {:>9}  {}",
            r.head.variant,
            r.head.status,
            fmt(r.vs_stored_rel_l2),
            fmt(r.vs_stored_max_abs),
            fmt(r.vs_ref_rel_l2),
            fmt(r.vs_ref_max_abs),
            r.head.median_ms.map_or("–".into(), |m| format!("{m:.3}")),
            r.note
        );
    }
}
