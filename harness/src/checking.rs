//! What every family's `harness check` shares: the request (`CheckOptions`), the check row's
//! own columns (`CheckCols`, after the shared head), and `Ctx`, through which a family records
//! each (case, variant, dtype) outcome judged against the tolerance table — written to
//! results/check/<run-id>.csv as it happens — plus the per-variant summary printed at the end.

use crate::error::Result;
use crate::row::{Heads, Row, RowWriter};
use crate::Format;
use kernel_common::{tolerance, DType, Device, ErrorStats, Tolerance};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What `harness check` was asked to do.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    pub families: Vec<String>,
    pub device: Device,
    pub cases: usize,
    pub seed: u64,
    pub dtypes: Vec<DType>,
    pub format: Format,
    pub results_dir: PathBuf,
}

/// A check row's own columns: one variant on one case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckCols {
    pub family: String,
    pub case: usize,
    pub dtype: String,
    pub shape: String,
    pub max_abs_err: Option<f64>,
    pub rel_l2_err: Option<f64>,
    pub nmse: Option<f64>,
    pub tol_rel_l2: f64,
    pub tol_max_abs: f64,
    /// The CPU kernels' ISA tier of the run (`--isa`); a quant variant that names its own
    /// (`fused:isa=avx2`) says so in `variant`.
    #[serde(default)]
    pub isa: String,
}

/// A check row: head (status pass | fail | unsupported) + `CheckCols` + note.
pub type CheckRow = Row<CheckCols>;

/// The check in progress: options, the CSV and every row so far.
pub struct Ctx<'a> {
    pub opts: &'a CheckOptions,
    pub run_id: String,
    pub writer: RowWriter,
    pub rows: Vec<CheckRow>,
}

impl Ctx<'_> {
    /// Records one row judged against the tolerance of `dtype`.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        family: &str,
        case: usize,
        variant: &str,
        dtype: DType,
        shape: String,
        seed: u64,
        outcome: std::result::Result<ErrorStats, String>,
    ) -> Result<()> {
        self.record_with(
            family,
            case,
            variant,
            dtype,
            tolerance(dtype),
            shape,
            seed,
            outcome,
        )
    }

    /// Records one row judged against `tol`: an error starting `device error:` (a launch, a
    /// fault, a compile) fails; any other error is the variant refusing the case.
    #[allow(clippy::too_many_arguments)]
    pub fn record_with(
        &mut self,
        family: &str,
        case: usize,
        variant: &str,
        dtype: DType,
        tol: Tolerance,
        shape: String,
        seed: u64,
        outcome: std::result::Result<ErrorStats, String>,
    ) -> Result<()> {
        let (status, stats, note) = match outcome {
            Ok(s) if s.passes(&tol) => ("pass", Some(s), String::new()),
            Ok(s) => (
                "fail",
                Some(s),
                if s.non_finite > 0 {
                    format!("{} non-finite outputs", s.non_finite)
                } else {
                    String::new()
                },
            ),
            // A device that failed (launch, fault, compile) is a failure, not a refusal.
            Err(why) if why.starts_with("device error:") => ("fail", None, why),
            Err(why) => ("unsupported", None, why),
        };
        let head = Heads::new(&self.run_id, "check", &self.opts.device.to_string())
            .with_status(variant, seed, status);
        let mut row = Row::new(
            head,
            CheckCols {
                family: family.into(),
                case,
                dtype: dtype.to_string(),
                shape,
                max_abs_err: stats.map(|s| s.max_abs),
                rel_l2_err: stats.map(|s| s.rel_l2),
                nmse: stats.map(|s| s.nmse),
                tol_rel_l2: tol.rel_l2,
                tol_max_abs: tol.max_abs,
                isa: crate::machine::isa(),
            },
        );
        row.note = note;
        self.writer.write(&row)?;
        self.rows.push(row);
        Ok(())
    }
}

/// Rows, passes, unsupported and worst errors of one (family, variant, dtype) group.
#[derive(Default)]
struct Group {
    rows: usize,
    pass: usize,
    unsupported: usize,
    worst_rel_l2: f64,
    worst_abs: f64,
}

/// One line per (family, variant base name with +split / +pipe, dtype): cases, passes,
/// worst errors.
pub fn print_summary(rows: &[CheckRow]) {
    let mut groups: BTreeMap<(String, String, String), Group> = BTreeMap::new();
    for r in rows {
        let v = &r.head.variant;
        let mut name = v.split(':').next().unwrap_or("").to_string();
        for (param, tag) in [("split=", "+split"), ("pipe=1", "+pipe")] {
            if v.contains(param) {
                name.push_str(tag);
            }
        }
        let g = groups
            .entry((r.family.clone(), name, r.dtype.clone()))
            .or_default();
        g.rows += 1;
        match r.head.status.as_str() {
            "pass" => g.pass += 1,
            "unsupported" => g.unsupported += 1,
            _ => {}
        }
        g.worst_rel_l2 = g.worst_rel_l2.max(r.rel_l2_err.unwrap_or(0.0));
        g.worst_abs = g.worst_abs.max(r.max_abs_err.unwrap_or(0.0));
    }
    println!(
        "{:<10} {:<20} {:<5} {:>5} {:>5} {:>6} {:>6} {:>11} {:>11}",
        "family", "variant", "dtype", "rows", "pass", "FAIL", "unsup", "worst relL2", "worst |err|"
    );
    for ((family, variant, dtype), g) in &groups {
        println!(
            "{family:<10} {variant:<20} {dtype:<5} {:>5} {:>5} {:>6} {:>6} {:>11.2e} {:>11.2e}",
            g.rows,
            g.pass,
            g.rows - g.pass - g.unsupported,
            g.unsupported,
            g.worst_rel_l2,
            g.worst_abs
        );
    }
    for r in rows.iter().filter(|r| r.head.status == "fail") {
        println!(
            "FAIL {} case {} {} {} {}: rel L2 {:?}, max |err| {:?} {}",
            r.family, r.case, r.head.variant, r.dtype, r.shape, r.rel_l2_err, r.max_abs_err, r.note
        );
    }
}
