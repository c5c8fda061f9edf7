//! `harness replay FILE...`: runs every variant that supports a captured case on its exact
//! tensors, compares each output with the stored one (when the file has `out`) and with the
//! f64 reference under the tolerance table `harness check` uses (packed quantised bytes compare
//! exactly), times it, and prints one row per variant. A first row per file rates the stored
//! output itself against the reference. Exit 0 when every supporting variant agrees with the
//! stored output, 1 when one disagrees, 2 when a file is malformed (all files are parsed and
//! validated before anything runs).

use crate::case_file::CaseFile;
use crate::error::{HarnessError, Result};
use crate::measure::{time_reps, CacheFlusher, Timing};
use crate::Format;
use attention_kernels::{AttentionInputs, AttentionKernel, AttentionShape};
use kernel_common::{Buffer, DType, Device, ErrorStats, Tolerance};
use moe_kernels::{ExpertVariant, MoeConfig, MoeWeights};
use paged_kernels::{KvPool, PagedBatch, PagedDecodeShape, SplitKv};
use quant_kernels::{MatVecVariant, QuantMatrix, WeightFormat};
use serde::Serialize;
use std::path::PathBuf;

/// Per-family case builders.
mod prepare;
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

/// One variant on one case file.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayRow {
    pub file: String,
    pub family: String,
    pub case: String,
    pub variant: String,
    /// agree | disagree | unsupported | error | info (the stored output's own row)
    pub status: String,
    pub vs_stored_rel_l2: Option<f64>,
    pub vs_stored_max_abs: Option<f64>,
    pub vs_ref_rel_l2: Option<f64>,
    pub vs_ref_max_abs: Option<f64>,
    pub median_ms: Option<f64>,
    pub reps: usize,
    pub note: String,
}

/// A variant's output, ready to compare.
enum Output {
    Floats(Vec<f32>),
    Bytes(Vec<u8>),
}

/// What a variant's output is compared with: the stored output (if the file has one) and the
/// f64 reference (if the family has one), under `tol`.
struct Expect {
    tol: Tolerance,
    reference: Option<Vec<f64>>,
    stored: Option<Output>,
}

/// What one variant does, with everything it needs owned (prepared per run in `execute`).
enum Job {
    Attention {
        kernel: Box<dyn AttentionKernel>,
        shape: AttentionShape,
        inputs: Arc<AttentionInputs>,
        dtype: DType,
    },
    Paged {
        shape: PagedDecodeShape,
        batch: Arc<PagedBatch>,
        pool: Arc<KvPool>,
        q: Arc<Buffer>,
        split: SplitKv,
        dtype: DType,
    },
    Quantize {
        format: WeightFormat,
        rows: usize,
        cols: usize,
        x: Arc<Vec<f32>>,
    },
    Dequantize(Arc<QuantMatrix>),
    Moe {
        cfg: MoeConfig,
        weights: Arc<MoeWeights>,
        x: Arc<Vec<f32>>,
        variant: ExpertVariant,
    },
    Product {
        w: Arc<QuantMatrix>,
        act: Arc<Vec<f32>>,
        batch: usize,
        variant: MatVecVariant,
    },
}

/// One variant to run: its name, its job (or why it is unsupported), what it must match.
struct Run {
    name: String,
    job: std::result::Result<Job, String>,
    expect: Arc<Expect>,
}

/// Runs `job` once (the output that is checked), then times `reps` more calls; attention
/// kernels are prepared once, outside the timing.
fn execute(
    job: &Job,
    reps: usize,
    flusher: &mut CacheFlusher,
) -> kernel_common::error::Result<(Output, Timing)> {
    if let Job::Attention {
        kernel,
        shape,
        inputs,
        dtype,
    } = job
    {
        let mut p = kernel.prepare(shape, inputs)?;
        let mut out = Buffer::poisoned(*dtype, shape.q_elems());
        p.run(&mut out)?;
        let first = Output::Floats(out.to_f32());
        let t = time_reps(reps, 2.0, flusher, || p.run(&mut out))?;
        return Ok((first, t));
    }
    let call = || -> kernel_common::error::Result<Output> {
        Ok(match job {
            Job::Paged {
                shape,
                batch,
                pool,
                q,
                split,
                dtype,
            } => {
                let mut out = Buffer::poisoned(*dtype, shape.q_elems(batch.len()));
                paged_kernels::paged_decode(shape, batch, pool, q, &mut out, *split)?;
                Output::Floats(out.to_f32())
            }
            Job::Quantize {
                format,
                rows,
                cols,
                x,
            } => Output::Bytes(
                QuantMatrix::quantize(*format, *rows, *cols, x)?
                    .bytes()
                    .to_vec(),
            ),
            Job::Dequantize(m) => Output::Floats(m.dequantize()),
            Job::Moe {
                cfg,
                weights,
                x,
                variant,
            } => {
                let mut out = vec![f32::NAN; x.len()];
                moe_kernels::moe_forward(cfg, weights, x, *variant, &mut out)?;
                Output::Floats(out)
            }
            Job::Product {
                w,
                act,
                batch,
                variant,
            } => {
                let mut out = vec![f32::NAN; batch * w.rows];
                quant_kernels::matmul(w, act, *batch, &mut out, *variant)?;
                Output::Floats(out)
            }
            Job::Attention { .. } => unreachable!("handled above"),
        })
    };
    let first = call()?;
    let t = time_reps(reps, 2.0, flusher, || call().map(|_| ()))?;
    Ok((first, t))
}

/// A parsed, validated case file, ready to run.
struct Prepared {
    label: String,
    runs: Vec<Run>,
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
        .map(|f| CaseFile::load(f))
        .collect::<Result<Vec<_>>>()?;
    let prepared = cases
        .iter()
        .map(|c| prepare::prepare(c, &opts.variants))
        .collect::<Result<Vec<_>>>()?;
    let mut rows = vec![];
    let mut flusher = CacheFlusher::new();
    for (case, p) in cases.iter().zip(prepared.iter()) {
        replay_case(case, p, opts.reps, &mut flusher, &mut rows);
    }
    let disagree = rows.iter().filter(|r| r.status == "disagree").count();
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
    let row = |variant: &str, status: &str| ReplayRow {
        file: case.path.display().to_string(),
        family: case.family.clone(),
        case: p.label.clone(),
        variant: variant.into(),
        status: status.into(),
        vs_stored_rel_l2: None,
        vs_stored_max_abs: None,
        vs_ref_rel_l2: None,
        vs_ref_max_abs: None,
        median_ms: None,
        reps: 0,
        note: String::new(),
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
                r.status = "unsupported".into();
                r.note = why.clone();
                rows.push(r);
                continue;
            }
            Ok(j) => j,
        };
        let (out, timing) = match execute(job, reps, flusher) {
            Ok(o) => o,
            Err(e) => {
                r.status = "error".into();
                r.note = e.to_string();
                rows.push(r);
                continue;
            }
        };
        r.median_ms = Some(timing.median() * 1e3);
        r.reps = timing.samples.len();
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
        r.status = if agrees { "agree" } else { "disagree" }.into();
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
            r.variant,
            r.status,
            fmt(r.vs_stored_rel_l2),
            fmt(r.vs_stored_max_abs),
            fmt(r.vs_ref_rel_l2),
            fmt(r.vs_ref_max_abs),
            r.median_ms.map_or("–".into(), |m| format!("{m:.3}")),
            r.note
        );
    }
}
