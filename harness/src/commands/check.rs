//! `harness check`: each asked family's check (from the family table) on random cases and the
//! DESIGN.md edge cases, outputs NaN-poisoned, compared with the f64 reference under the
//! per-dtype tolerance table; a summary on stdout, every row in results/check/<run-id>.csv as
//! it is recorded, exit 1 on any failure.

use crate::checking::{print_summary, CheckOptions, Ctx};
use crate::error::{HarnessError, Result};
use crate::families;
use crate::row::RowWriter;
use crate::{machine, Format};
use kernel_common::Device;

/// Families `check` runs when none is named: every family with a check, in table order.
pub fn default_families() -> Vec<String> {
    families::FAMILIES
        .iter()
        .filter(|f| f.check.is_some())
        .map(|f| f.name.to_string())
        .collect()
}

/// Runs the check; returns the exit code (1 when any row fails).
pub fn run(opts: &CheckOptions) -> Result<i32> {
    let checks = opts
        .families
        .iter()
        .map(|f| families::checked(f))
        .collect::<Result<Vec<_>>>()?;
    if opts.cases == 0 {
        return Err(HarnessError::Usage("--cases must be at least 1".into()));
    }
    // Driver, GPU and NVRTC first, each missing one named in one line; every family's
    // check then runs its tables' rows of this device.
    if let Device::Cuda(n) = opts.device {
        kernel_cuda::CudaRuntime::get(n)?;
    }
    let run_id = machine::run_id("check");
    let dir = opts.results_dir.join("check");
    std::fs::create_dir_all(&dir)
        .map_err(HarnessError::io(format!("creating {}", dir.display())))?;
    let writer = RowWriter::create(dir.join(format!("{run_id}.csv")))?;
    let mut ctx = Ctx {
        opts,
        run_id,
        writer,
        rows: vec![],
    };
    for family in checks {
        let check = family
            .check
            .expect("families::checked returns families with a check");
        check(&mut ctx)?;
    }
    let failed = ctx.rows.iter().filter(|r| r.head.status == "fail").count();
    match opts.format {
        Format::Table => print_summary(&ctx.rows),
        Format::Json => println!("{}", serde_json::to_string_pretty(&ctx.rows)?),
    }
    eprintln!(
        "{} rows, {failed} failed: {}",
        ctx.rows.len(),
        ctx.writer.path.display()
    );
    Ok(if failed > 0 { 1 } else { 0 })
}
