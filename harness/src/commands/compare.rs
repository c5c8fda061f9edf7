//! `harness compare A B`: two runs of one experiment side by side, row by row (rows joined on
//! grid point and variant, as llama.cpp's `compare-llama-bench.py` and tritonbench's A/B mode
//! do): B's speed-up over A by median, the change in error, and a regression flag that needs
//! both a clear gap — the p10–p90 ranges do not overlap — and a change above `--threshold`.
//! Exit 1 on a regression, so a CI can gate on it; 2 on inputs that cannot be compared.

use crate::error::{HarnessError, Result};
use crate::report::table::{key_columns, newest_run_csv, point_of, Table};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// How `compare` prints its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompareFormat {
    Table,
    Csv,
    Json,
}

/// What `harness compare` was asked to do.
pub struct CompareOptions {
    pub before: String,
    pub after: String,
    /// Percent a median must move (beyond non-overlapping p10–p90) to count.
    pub threshold_pct: f64,
    pub format: CompareFormat,
    pub results_dir: PathBuf,
}

/// The error columns, in the order the first present in both runs is reported.
const ERROR_COLUMNS: &[&str] = &["rel_l2_err", "out_rel_err", "max_abs_err"];
const TIMING_COLUMNS: &[&str] = &["median_ms", "p10_ms", "p90_ms"];

/// One joined row.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Compared {
    pub point: String,
    pub before_ms: f64,
    pub after_ms: f64,
    /// before / after: above 1 when B is faster.
    pub speedup: f64,
    pub ranges_overlap: bool,
    /// `slower` (a regression), `faster`, or `same`.
    pub verdict: &'static str,
    pub error_column: Option<String>,
    pub before_err: Option<f64>,
    pub after_err: Option<f64>,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub before: String,
    pub after: String,
    pub threshold_pct: f64,
    pub rows: Vec<Compared>,
    /// Rows of one run with no partner in the other (or not `ok` in either).
    pub unmatched: usize,
    pub regressions: usize,
}

fn usage(text: String) -> HarnessError {
    HarnessError::Usage(text)
}

/// Compares; exit code 1 when a row regressed.
pub fn run(opts: &CompareOptions) -> Result<i32> {
    if !(opts.threshold_pct.is_finite() && opts.threshold_pct >= 0.0) {
        return Err(usage(format!(
            "--threshold {}: give a percentage >= 0",
            opts.threshold_pct
        )));
    }
    let before = Table::read(&resolve(&opts.before, &opts.results_dir)?)?;
    let after = Table::read(&resolve(&opts.after, &opts.results_dir)?)?;
    let cmp = compare(&before, &after, opts.threshold_pct)?;
    print!("{}", render(&cmp, opts.format)?);
    Ok(if cmp.regressions > 0 { 1 } else { 0 })
}

/// A CSV path, a folder (its newest run CSV) or a run id (under the results folder).
fn resolve(input: &str, results_dir: &Path) -> Result<PathBuf> {
    let path = Path::new(input);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    if path.is_dir() {
        return newest_run_csv(path)?
            .ok_or_else(|| usage(format!("{input}: no run CSV (<run-id>.csv) in this folder")));
    }
    let found: Vec<PathBuf> = std::fs::read_dir(results_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join(format!("{input}.csv")))
        .filter(|p| p.is_file())
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(usage(format!(
            "{input}: not a CSV, a folder, or a run id under {}",
            results_dir.display()
        ))),
        _ => Err(usage(format!(
            "run id {input} is in several experiments under {}; give the CSV path",
            results_dir.display()
        ))),
    }
}

/// The rows of `t` that ran and were timed.
fn timed_rows(t: &Table) -> Vec<&[String]> {
    t.rows
        .iter()
        .map(Vec::as_slice)
        .filter(|r| t.get(r, "status") == "ok" && t.number(r, "median_ms").is_some())
        .collect()
}

/// The experiments a table's rows name.
fn experiments(t: &Table) -> BTreeSet<&str> {
    t.rows.iter().map(|r| t.get(r, "experiment")).collect()
}

/// Joins and judges; refuses (one line) runs of different experiments, runs without timing
/// columns or without the other's key columns, duplicate points, and runs with no point in
/// common.
pub fn compare(before: &Table, after: &Table, threshold_pct: f64) -> Result<Comparison> {
    before.require(TIMING_COLUMNS)?;
    after.require(TIMING_COLUMNS)?;
    let (eb, ea) = (experiments(before), experiments(after));
    if eb != ea {
        return Err(usage(format!(
            "{} is experiment {} and {} is {}: compare runs of one experiment",
            before.path.display(),
            eb.into_iter().collect::<Vec<_>>().join("+"),
            after.path.display(),
            ea.into_iter().collect::<Vec<_>>().join("+")
        )));
    }
    let (rb, ra) = (timed_rows(before), timed_rows(after));
    for (t, rows, other) in [(before, &rb, after), (after, &ra, before)] {
        let own = key_columns(&[(t, rows.clone())], &[], &[]);
        if let Some(k) = own.iter().find(|k| other.col(k).is_none()) {
            return Err(usage(format!(
                "{} has no column {k}, which the rows of {} differ by",
                other.path.display(),
                t.path.display()
            )));
        }
    }
    let keys = key_columns(&[(before, rb.clone()), (after, ra.clone())], &[], &[]);
    index(before, &rb, &keys)?;
    let index_a = index(after, &ra, &keys)?;
    let error_column = ERROR_COLUMNS
        .iter()
        .find(|c| before.col(c).is_some() && after.col(c).is_some())
        .map(|c| c.to_string());
    let threshold = threshold_pct / 100.0;
    let mut rows = vec![];
    for b in &rb {
        let point = point_of(before, b, &keys);
        let Some(a) = index_a.get(&point) else {
            continue;
        };
        let num = |t: &Table, r: &[String], c: &str| t.number(r, c).unwrap_or(f64::NAN);
        let (b_med, b_lo, b_hi) = (
            num(before, b, "median_ms"),
            num(before, b, "p10_ms"),
            num(before, b, "p90_ms"),
        );
        let (a_med, a_lo, a_hi) = (
            num(after, a, "median_ms"),
            num(after, a, "p10_ms"),
            num(after, a, "p90_ms"),
        );
        let speedup = b_med / a_med;
        let slower_gap = a_lo > b_hi;
        let faster_gap = a_hi < b_lo;
        let verdict = if slower_gap && a_med / b_med - 1.0 > threshold {
            "slower"
        } else if faster_gap && speedup - 1.0 > threshold {
            "faster"
        } else {
            "same"
        };
        let err = |t: &Table, r: &[String]| error_column.as_deref().and_then(|c| t.number(r, c));
        rows.push(Compared {
            point,
            before_ms: b_med,
            after_ms: a_med,
            speedup,
            ranges_overlap: !(slower_gap || faster_gap),
            verdict,
            error_column: error_column.clone(),
            before_err: err(before, b),
            after_err: err(after, a),
        });
    }
    if rows.is_empty() {
        return Err(usage(format!(
            "{} and {} have no timed grid point in common (keyed on {})",
            before.path.display(),
            after.path.display(),
            keys.join(", ")
        )));
    }
    let unmatched = before.rows.len() + after.rows.len() - 2 * rows.len();
    let regressions = rows.iter().filter(|r| r.verdict == "slower").count();
    Ok(Comparison {
        before: before.path.display().to_string(),
        after: after.path.display().to_string(),
        threshold_pct,
        rows,
        unmatched,
        regressions,
    })
}

/// Point → row (in a file's order of rows); a point twice is a refusal (the key would be
/// ambiguous).
fn index<'t>(
    t: &Table,
    rows: &[&'t [String]],
    keys: &[String],
) -> Result<BTreeMap<String, &'t [String]>> {
    let mut map = BTreeMap::new();
    for row in rows {
        let point = point_of(t, row, keys);
        if map.insert(point.clone(), *row).is_some() {
            return Err(usage(format!(
                "{}: two timed rows at [{point}]; compare runs with one row per point and variant",
                t.path.display()
            )));
        }
    }
    Ok(map)
}

fn fmt_err(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.2e}"))
}

/// The comparison as a table, CSV or JSON.
pub fn render(cmp: &Comparison, format: CompareFormat) -> Result<String> {
    let err_name = cmp
        .rows
        .first()
        .and_then(|r| r.error_column.clone())
        .unwrap_or_else(|| "error".into());
    Ok(match format {
        CompareFormat::Json => serde_json::to_string_pretty(cmp)? + "\n",
        CompareFormat::Csv => {
            let mut w = csv::Writer::from_writer(vec![]);
            w.write_record([
                "point",
                "before_ms",
                "after_ms",
                "speedup",
                "ranges_overlap",
                "verdict",
                &format!("before_{err_name}"),
                &format!("after_{err_name}"),
            ])?;
            for r in &cmp.rows {
                w.write_record([
                    r.point.clone(),
                    r.before_ms.to_string(),
                    r.after_ms.to_string(),
                    r.speedup.to_string(),
                    r.ranges_overlap.to_string(),
                    r.verdict.to_string(),
                    r.before_err.map_or(String::new(), |x| x.to_string()),
                    r.after_err.map_or(String::new(), |x| x.to_string()),
                ])?;
            }
            String::from_utf8(w.into_inner().map_err(|e| usage(format!("csv: {e}")))?)
                .map_err(|e| usage(format!("csv: {e}")))?
        }
        CompareFormat::Table => {
            let mut out = format!("A = {}\nB = {}\n\n", cmp.before, cmp.after);
            out += &format!(
                "| point | A ms | B ms | speed-up B/A | {err_name} A → B | verdict |\n|---|---|---|---|---|---|\n"
            );
            for r in &cmp.rows {
                out += &format!(
                    "| {} | {:.4} | {:.4} | {:.2}× | {} → {} | {} |\n",
                    r.point,
                    r.before_ms,
                    r.after_ms,
                    r.speedup,
                    fmt_err(r.before_err),
                    fmt_err(r.after_err),
                    r.verdict
                );
            }
            out += &format!(
                "\n{} rows compared, {} slower (p10–p90 apart and > {}%), {} faster, {} rows without a partner\n",
                cmp.rows.len(),
                cmp.regressions,
                cmp.threshold_pct,
                cmp.rows.iter().filter(|r| r.verdict == "faster").count(),
                cmp.unmatched
            );
            out
        }
    })
}
