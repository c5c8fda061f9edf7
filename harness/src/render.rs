//! Reports regenerated from a run's CSV and provenance: `<run-id>.md` (context, one table per
//! mode, speed-ups over the spec's baseline variant, skipped/unsupported counts) and
//! `<run-id>.svg` (plotters: one panel per `plot.panel` value, a line per `plot.series`
//! value, the roofline as a dashed line). `harness render CSV` rewrites both.

use crate::error::{HarnessError, Result};
use crate::exp_quant::QuantRow;
use crate::output::{read_rows, ExpRow, Provenance};
use crate::spec::{ExperimentSpec, PlotSpec};
use plotters::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// What rendering produced.
pub struct Report {
    /// The markdown tables of ok rows, also printed by `harness exp`.
    pub summary: String,
}

/// A row's column by its CSV name, as text ("" when empty).
pub fn column<R: Serialize>(row: &R, name: &str) -> String {
    match serde_json::to_value(row)
        .ok()
        .and_then(|v| v.get(name).cloned())
    {
        Some(serde_json::Value::String(s)) => s,
        Some(serde_json::Value::Null) | None => String::new(),
        Some(v) => v.to_string(),
    }
}

fn num<R: Serialize>(row: &R, name: &str) -> Option<f64> {
    column(row, name).parse().ok()
}

/// `v` with `digits` decimals, or – when absent.
pub(crate) fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |x| format!("{x:.digits$}"))
}

/// `v` as `1.2e-7`, or – when absent.
pub(crate) fn fmt_err(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{x:.1e}"))
}

/// Writes the .md and .svg beside `csv` and returns the summary.
pub fn render_run(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Report> {
    let (summary, nrows) = if spec.family == "quant" {
        let rows: Vec<QuantRow> = read_rows(csv)?;
        plots(spec, &rows, prov, csv)?;
        (crate::exp_quant::tables(&rows), rows.len())
    } else if spec.family == "kv" {
        let rows: Vec<crate::exp_kv::KvRow> = read_rows(csv)?;
        plots(spec, &rows, prov, csv)?;
        (crate::exp_kv::tables(&rows), rows.len())
    } else if spec.family == "kv_alloc" {
        let rows: Vec<crate::exp_kv_alloc::KvAllocRow> = read_rows(csv)?;
        plots(spec, &rows, prov, csv)?;
        (crate::exp_kv_alloc::tables(&rows), rows.len())
    } else if spec.family == "serving" {
        let rows: Vec<crate::exp_serving::ServingRow> = read_rows(csv)?;
        plots(spec, &rows, prov, csv)?;
        (crate::exp_serving::tables(&rows), rows.len())
    } else if spec.family == "spec" {
        let rows: Vec<crate::exp_spec::SpecRow> = read_rows(csv)?;
        plots(spec, &rows, prov, csv)?;
        (crate::exp_spec::tables(&rows), rows.len())
    } else if spec.family == "decode" {
        let rows: Vec<crate::exp_decode::DecodeRow> = read_rows(csv)?;
        plots(spec, &rows, prov, csv)?;
        (crate::exp_decode::tables(&rows), rows.len())
    } else if spec.family == "moe" {
        let rows: Vec<crate::exp_moe::MoeRow> = read_rows(csv)?;
        plots(spec, &rows, prov, csv)?;
        (crate::exp_moe::tables(&rows), rows.len())
    } else {
        let rows: Vec<ExpRow> = read_rows(csv)?;
        plots(spec, &rows, prov, csv)?;
        (tables(spec, &rows), rows.len())
    };
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
        nrows,
        prov.started_at,
        prov.finished_at.as_deref().unwrap_or("–")
    );
    md.push_str(&summary);
    let md_path = csv.with_extension("md");
    std::fs::write(&md_path, md)
        .map_err(HarnessError::io(format!("writing {}", md_path.display())))?;
    Ok(Report { summary })
}

/// `<run-id>.svg` from `plot`, `<run-id>-2.svg`, ... from `extra_plots`.
fn plots<R: Serialize>(
    spec: &ExperimentSpec,
    rows: &[R],
    prov: &Provenance,
    csv: &Path,
) -> Result<()> {
    plot(&spec.plot, rows, prov, &csv.with_extension("svg"))?;
    let stem = csv.with_extension("");
    for (i, p) in spec.extra_plots.iter().enumerate() {
        let path = stem.with_file_name(format!(
            "{}-{}.svg",
            stem.file_name()
                .map_or("run".into(), |n| n.to_string_lossy()),
            i + 2
        ));
        plot(p, rows, prov, &path)?;
    }
    Ok(())
}

/// Markdown tables: measured rows per mode, speed-ups over the baseline, and what did not run.
fn tables(spec: &ExperimentSpec, rows: &[ExpRow]) -> String {
    let mut md = String::new();
    let mut modes: Vec<&str> = rows.iter().map(|r| r.mode.as_str()).collect();
    modes.dedup();
    modes.sort();
    modes.dedup();
    for mode in modes {
        let _ = writeln!(md, "## {mode}\n");
        let _ = writeln!(md, "| dtype | batch | heads q/kv | q_len | kv_len | causal | variant | median ms | p10–p90 ms | GB/s | GFLOP/s | % roof | scratch MiB | rel L2 err | status |");
        let _ = writeln!(
            md,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in rows
            .iter()
            .filter(|r| r.mode == mode && (r.status == "ok" || r.status == "fail"))
        {
            let _ = writeln!(
                md,
                "| {} | {} | {}/{} | {} | {} | {} | {} | {} | {}–{} | {} | {} | {} | {} | {} | {} |",
                r.dtype,
                r.batch,
                r.q_heads,
                r.kv_heads,
                r.q_len,
                r.kv_len,
                if r.causal { "yes" } else { "no" },
                r.variant,
                fmt_opt(r.median_ms, 3),
                fmt_opt(r.p10_ms, 3),
                fmt_opt(r.p90_ms, 3),
                fmt_opt(r.gbps, 1),
                fmt_opt(r.gflops, 1),
                fmt_opt(r.pct_roofline, 0),
                fmt_opt(r.scratch_mib, 1),
                fmt_err(r.rel_l2_err),
                r.status
            );
        }
        md.push('\n');
    }
    if let Some(base) = &spec.report.baseline {
        md.push_str(&speedups(rows, base));
    }
    let mut counts: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.status != "ok") {
        *counts
            .entry((r.status.clone(), r.note.clone()))
            .or_default() += 1;
    }
    if !counts.is_empty() {
        let _ = writeln!(
            md,
            "## Rows not measured or not passing\n\n| status | rows | why |\n|---|---|---|"
        );
        for ((status, note), n) in counts {
            let _ = writeln!(md, "| {status} | {n} | {note} |");
        }
        md.push('\n');
    }
    md
}

/// Speed-up of every variant over `base` at each point where both ran: base time / time.
fn speedups(rows: &[ExpRow], base: &str) -> String {
    let key = |r: &ExpRow| {
        format!(
            "{} {} b{} h{}/{} q{} kv{}{}",
            r.mode,
            r.dtype,
            r.batch,
            r.q_heads,
            r.kv_heads,
            r.q_len,
            r.kv_len,
            if r.causal { " causal" } else { "" }
        )
    };
    let mut variants: Vec<String> = vec![];
    let mut table: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut order: Vec<String> = vec![];
    for r in rows.iter().filter(|r| r.status == "ok") {
        if !variants.contains(&r.variant) {
            variants.push(r.variant.clone());
        }
        let k = key(r);
        if !order.contains(&k) {
            order.push(k.clone());
        }
        table
            .entry(k)
            .or_default()
            .insert(r.variant.clone(), r.median_ms.unwrap_or(f64::NAN));
    }
    let Some(base_name) = variants
        .iter()
        .find(|v| v.split(':').next() == Some(base))
        .cloned()
    else {
        return format!("(baseline '{base}' has no measured row)\n\n");
    };
    let others: Vec<&String> = variants.iter().filter(|v| **v != base_name).collect();
    let mut md =
        format!("## Speed-up over {base_name} (its median time / the variant's)\n\n| point |");
    for v in &others {
        let _ = write!(md, " {v} |");
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(others.len()));
    md.push('\n');
    for k in order {
        let cells = &table[&k];
        let Some(b) = cells.get(&base_name) else {
            continue;
        };
        let _ = write!(md, "| {k} |");
        for v in &others {
            let _ = write!(
                md,
                " {} |",
                cells
                    .get(*v)
                    .map_or("–".into(), |t| format!("{:.2}×", b / t))
            );
        }
        md.push('\n');
    }
    md.push('\n');
    md
}

fn plot_err(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Usage(format!("plotting failed: {e}"))
}

/// The SVG: panels × series, with the roofline where the metric has one.
fn plot<R: Serialize>(p: &PlotSpec, rows: &[R], prov: &Provenance, path: &Path) -> Result<()> {
    let rows: Vec<&R> = rows
        .iter()
        .filter(|r| {
            column(*r, "status") == "ok"
                && p.filter
                    .iter()
                    .all(|(k, v)| v.split('|').any(|alt| column(*r, k) == alt))
        })
        .collect();
    let mut panels: Vec<String> = rows.iter().map(|r| column(r, &p.panel)).collect();
    panels.sort();
    panels.dedup();
    if panels.is_empty() {
        panels.push("(no measured rows)".into());
    }
    let root = SVGBackend::new(path, (560 * panels.len() as u32, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let areas = root.split_evenly((1, panels.len()));
    for (area, panel) in areas.iter().zip(&panels) {
        let metric =
            p.y.get(panel)
                .or_else(|| p.y.get("*"))
                .cloned()
                .unwrap_or_else(|| "median_ms".into());
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for r in rows.iter().filter(|r| column(**r, &p.panel) == *panel) {
            if let (Some(x), Some(y)) = (num(*r, &p.x), num(*r, &metric)) {
                if !p.log_y || y > 0.0 {
                    series
                        .entry(column(*r, &p.series))
                        .or_default()
                        .push((x, y));
                }
            }
        }
        let roof = match metric.as_str() {
            "gbps" => Some(("read bandwidth", prov.roofline.read_gbps)),
            "gflops" => Some(("FMA peak", prov.roofline.fma_gflops)),
            "pct_roofline" | "pct_read_bw" => Some(("roofline", 100.0)),
            _ => None,
        };
        let pts = series.values().flatten();
        let (mut x0, mut x1, mut y1) =
            (f64::INFINITY, f64::NEG_INFINITY, roof.map_or(0.0, |r| r.1));
        let mut y0 = f64::INFINITY;
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
            y0 = y0.min(y);
        }
        if !x0.is_finite() {
            (x0, x1, y1, y0) = (1.0, 2.0, 1.0, 0.1);
        }
        if x1 <= x0 {
            x1 = x0 * 2.0;
        }
        let small = y1 < 20.0;
        // Multi-valued filters (a|b|c) pick the series; the caption names single values only.
        let filter: Vec<String> = p
            .filter
            .iter()
            .filter(|(_, v)| !v.contains('|'))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let caption = if filter.is_empty() {
            format!("{} {panel}", p.panel)
        } else {
            format!("{} {panel} ({})", p.panel, filter.join(" "))
        };
        let mut b = ChartBuilder::on(area);
        b.caption(caption, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56);
        macro_rules! draw {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc(p.x.as_str())
                    .y_desc(metric.as_str())
                    .x_labels(8)
                    .x_label_formatter(&|x| {
                        if x1 - x0 < 10.0 {
                            format!("{x:.2}")
                        } else {
                            format!("{x:.0}")
                        }
                    })
                    .y_label_formatter(&|y| {
                        if p.log_y {
                            format!("{y:.0e}")
                        } else if small {
                            format!("{y:.1}")
                        } else {
                            format!("{y:.0}")
                        }
                    })
                    .draw()
                    .map_err(plot_err)?;
                for (i, (name, mut pts)) in series.into_iter().enumerate() {
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    let color = Palette99::pick(i).to_rgba();
                    chart
                        .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                        .map_err(plot_err)?
                        .label(name)
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                        });
                    chart
                        .draw_series(pts.into_iter().map(|pt| Circle::new(pt, 3, color.filled())))
                        .map_err(plot_err)?;
                }
                if let Some((label, level)) = roof {
                    chart
                        .draw_series(DashedLineSeries::new(
                            vec![(x0, level), (x1, level)],
                            6,
                            4,
                            BLACK.stroke_width(1),
                        ))
                        .map_err(plot_err)?
                        .label(format!("{label} {level:.1}"))
                        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK));
                }
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .position(match p.legend.as_str() {
                        "upper_right" => SeriesLabelPosition::UpperRight,
                        "lower_left" => SeriesLabelPosition::LowerLeft,
                        "lower_right" => SeriesLabelPosition::LowerRight,
                        _ => SeriesLabelPosition::UpperLeft,
                    })
                    .draw()
                    .map_err(plot_err)?;
            }};
        }
        let y_log = (y0 * 0.8)..(y1 * 1.25);
        match (p.log_x, p.log_y) {
            (true, false) => draw!(b
                .build_cartesian_2d((x0..x1).log_scale(), 0.0..y1 * 1.1)
                .map_err(plot_err)?),
            (false, false) => draw!(b
                .build_cartesian_2d(x0..x1, 0.0..y1 * 1.1)
                .map_err(plot_err)?),
            (true, true) => draw!(b
                .build_cartesian_2d((x0..x1).log_scale(), y_log.log_scale())
                .map_err(plot_err)?),
            (false, true) => draw!(b
                .build_cartesian_2d(x0..x1, y_log.log_scale())
                .map_err(plot_err)?),
        }
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// `harness render CSV`: rewrites the .md and .svg of a finished (or interrupted) run.
pub fn rerender(csv: &Path, experiments_dir: &Path) -> Result<String> {
    let prov = Provenance::read(&csv.with_extension("json"))?;
    let (spec, _) = ExperimentSpec::load(experiments_dir, &prov.experiment)?;
    Ok(render_run(&spec, csv, &prov)?.summary)
}
