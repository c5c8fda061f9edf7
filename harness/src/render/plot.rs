//! The SVG of a run (plotters): one panel per value of `plot.panel`, a line per value of
//! `plot.series`, `x` horizontally and the panel's metric vertically, the roofline as a dashed
//! line where the metric has one. Reads rows by column name, whatever their family.

use crate::error::{HarnessError, Result};
use crate::provenance::Provenance;
use crate::row::Columns;
use crate::spec::PlotSpec;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

fn num<R: Columns>(row: &R, name: &str) -> Option<f64> {
    row.column(name).parse().ok()
}

fn plot_err(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Usage(format!("plotting failed: {e}"))
}

/// The SVG at `path` (written atomically): panels × series, with the roofline where the
/// metric has one.
pub(super) fn plot<R: Columns>(
    p: &PlotSpec,
    rows: &[R],
    prov: &Provenance,
    path: &Path,
) -> Result<()> {
    let mut svg = String::new();
    draw(p, rows, prov, &mut svg)?;
    crate::atomic::write(path, svg)
}

fn draw<R: Columns>(p: &PlotSpec, rows: &[R], prov: &Provenance, svg: &mut String) -> Result<()> {
    let rows: Vec<&R> = rows
        .iter()
        .filter(|r| {
            r.column("status") == "ok"
                && p.filter
                    .iter()
                    .all(|(k, v)| v.split('|').any(|alt| r.column(k) == alt))
        })
        .collect();
    let mut panels: Vec<String> = rows.iter().map(|r| r.column(&p.panel)).collect();
    panels.sort();
    panels.dedup();
    if panels.is_empty() {
        panels.push("(no measured rows)".into());
    }
    let root = SVGBackend::with_string(svg, (560 * panels.len() as u32, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let areas = root.split_evenly((1, panels.len()));
    for (area, panel) in areas.iter().zip(&panels) {
        let metric =
            p.y.get(panel)
                .or_else(|| p.y.get("*"))
                .cloned()
                .unwrap_or_else(|| "median_ms".into());
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for r in rows.iter().filter(|r| r.column(&p.panel) == *panel) {
            if let (Some(x), Some(y)) = (num(*r, &p.x), num(*r, &metric)) {
                if !p.log_y || y > 0.0 {
                    series.entry(r.column(&p.series)).or_default().push((x, y));
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
