//! Reports regenerated from a run's CSV and provenance: `<run-id>.md` (the question, claims,
//! machine, roofline and command, then the family's tables) and `<run-id>.svg` (`plot.rs`).
//! A family supplies only its tables (a `RenderFn`, usually `report::<ItsColumns>` with its
//! table writer); `harness render CSV` rewrites both files of a finished or interrupted run.

use crate::error::Result;
use crate::provenance::Provenance;
use crate::row::{read_rows, Row};
use crate::spec::ExperimentSpec;
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// The SVG writer.
mod plot;

/// What a family's report of one run gives: its markdown tables (also printed by
/// `harness exp`), its rows as JSON (`--format json`) and how many there are.
pub struct Rendered {
    pub tables: String,
    pub rows: serde_json::Value,
    pub count: usize,
}

/// A family's report: reads the CSV, writes the plots, returns the tables.
pub type RenderFn = fn(&ExperimentSpec, &Path, &Provenance) -> Result<Rendered>;

/// `v` with `digits` decimals, or – when absent.
pub fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |x| format!("{x:.digits$}"))
}

/// `v` as `1.2e-7`, or – when absent.
pub fn fmt_err(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{x:.1e}"))
}

/// The usual `RenderFn` body: rows of family columns `F` read from `csv`, the spec's plots
/// written beside it, and `tables` of the rows.
pub fn report<F: DeserializeOwned + Serialize>(
    spec: &ExperimentSpec,
    csv: &Path,
    prov: &Provenance,
    tables: impl Fn(&ExperimentSpec, &[Row<F>]) -> String,
) -> Result<Rendered> {
    let rows: Vec<Row<F>> = read_rows(csv)?;
    plots(spec, &crate::report::table::Table::read(csv)?, prov, csv)?;
    Ok(Rendered {
        tables: tables(spec, &rows),
        rows: serde_json::to_value(&rows)?,
        count: rows.len(),
    })
}

/// Writes the .md (and, through `render`, the .svg) beside `csv`; returns what `render` gave.
pub fn render_run(
    spec: &ExperimentSpec,
    csv: &Path,
    prov: &Provenance,
    render: RenderFn,
) -> Result<Rendered> {
    let rendered = render(spec, csv, prov)?;
    let mut md = String::new();
    let _ = writeln!(md, "# {} — run {}\n", spec.name, prov.run_id);
    let _ = writeln!(md, "**Question.** {}\n", spec.question.trim());
    let _ = writeln!(md, "**Claims.** {}\n", spec.claims.join(", "));
    let _ = writeln!(
        md,
        "**Machine.** {} ({} logical cores), {} threads, device {}{}; rustc {}; git {}{}.\n",
        prov.cpu_model,
        prov.logical_cores,
        prov.threads,
        prov.device,
        // Runs before the ISA layer recorded no tier: their .md stays as it was.
        if prov.isa.is_empty() {
            String::new()
        } else {
            format!(
                ", CPU kernels at ISA {} (this CPU has {})",
                prov.isa, prov.isa_detected
            )
        },
        prov.rustc,
        prov.git_sha,
        if prov.git_dirty { " (dirty)" } else { "" }
    );
    let _ = writeln!(
        md,
        "**Roofline** (measured at the start of the run, {}): read {:.1} GB/s, f32 FMA peak {:.1} GFLOP/s ({}). `% roof` = roofline time / measured median.\n",
        prov.roofline.read_measured_at, prov.roofline.read_gbps, prov.roofline.fma_gflops, prov.roofline.fma_isa
    );
    let _ = writeln!(
        md,
        "**Command.** `{}` — status {}, {} rows, {} → {}.\n",
        prov.command_line,
        prov.status,
        rendered.count,
        prov.started_at,
        prov.finished_at.as_deref().unwrap_or("–")
    );
    if let Some(m) = &prov.merged {
        md.push_str(&shards_table(m));
    }
    md.push_str(&rendered.tables);
    let md_path = csv.with_extension("md");
    crate::atomic::write(&md_path, md)?;
    Ok(rendered)
}

/// A merged sweep's shards, one line per session (a start or a `--resume`).
fn shards_table(m: &crate::provenance::MergeRecord) -> String {
    let mut md = format!(
        "**Shards** of sweep `{}`{} (each row's `% roof` is against its own session's roofline; the plot's line is the best of them):\n\n| shard | host | CPU | ISA | threads | commit | read GB/s | FMA GFLOP/s | start → end | points before |\n|---|---|---|---|---|---|---|---|---|---|\n",
        m.sweep_id,
        if m.mixed.is_empty() {
            String::new()
        } else {
            format!(", mixed {}", m.mixed.join(" and "))
        }
    );
    for shard in &m.shards {
        for s in &shard.sessions {
            let _ = writeln!(
                md,
                "| {}/{} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {} → {} | {} |",
                shard.shard,
                m.shards.len(),
                s.host,
                s.cpu_model,
                s.isa,
                s.threads,
                s.commit(),
                s.roofline.read_gbps,
                s.roofline.fma_gflops,
                s.started_at,
                s.finished_at.as_deref().unwrap_or("–"),
                s.points_before
            );
        }
    }
    md.push('\n');
    md
}

/// `<run-id>.svg` from `plot`, `<run-id>-2.svg`, ... from `extra_plots`.
fn plots(
    spec: &ExperimentSpec,
    rows: &crate::report::table::Table,
    prov: &Provenance,
    csv: &Path,
) -> Result<()> {
    plot::plot(&spec.plot, rows, prov, &csv.with_extension("svg"))?;
    let stem = csv.with_extension("");
    for (i, p) in spec.extra_plots.iter().enumerate() {
        let path = stem.with_file_name(format!(
            "{}-{}.svg",
            stem.file_name()
                .map_or("run".into(), |n| n.to_string_lossy()),
            i + 2
        ));
        plot::plot(p, rows, prov, &path)?;
    }
    Ok(())
}
