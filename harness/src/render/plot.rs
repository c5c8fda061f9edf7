//! The SVG of a run (plotters): one panel per value of `plot.panel`, a line per value of
//! `plot.series`, `x` horizontally and the panel's metric vertically, the roofline as a dashed
//! line where the metric has one. Reads rows by column name, whatever their family.

use crate::error::{HarnessError, Result};
use crate::provenance::Provenance;
use crate::report::table::{key_columns, point_of, Table};
use crate::spec::PlotSpec;
use plotters::prelude::*;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::path::Path;

fn plot_err(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Usage(format!("plotting failed: {e}"))
}

/// Panels per row of the figure.
const PANELS_PER_ROW: usize = 3;

/// The SVG at `path` (written atomically): panels × series, with the roofline where the
/// metric has one.
pub(super) fn plot(p: &PlotSpec, table: &Table, prov: &Provenance, path: &Path) -> Result<()> {
    let mut svg = String::new();
    draw(p, table, prov, &mut svg)?;
    crate::atomic::write(path, svg)
}

/// Values compared as numbers where both are, as text otherwise (`128` before `1024`).
fn by_value(a: &[String], b: &[String]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let o = match (x.parse::<f64>(), y.parse::<f64>()) {
            (Ok(x), Ok(y)) => x.total_cmp(&y),
            _ => x.cmp(y),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

/// A tick label: integers plainly, other values with two decimals.
fn tick(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

/// One panel: the values of the panel keys, and per series its (x, y) points.
struct Panel {
    values: Vec<String>,
    series: BTreeMap<String, Vec<(f64, f64)>>,
    metric: String,
}

/// The panels: one per value of `plot.panel` and of every other key that varies among the
/// plotted rows (never a value picked silently), less panels with fewer than two x values.
fn panels(p: &PlotSpec, t: &Table) -> (Vec<String>, Vec<Panel>) {
    let rows: Vec<&[String]> = t
        .rows
        .iter()
        .map(Vec::as_slice)
        .filter(|r| {
            t.get(r, "status") == "ok"
                && p.filter
                    .iter()
                    .all(|(k, v)| v.split('|').any(|alt| same_value(t.get(r, k), alt)))
        })
        .collect();
    let metrics: Vec<&str> = p.y.values().map(String::as_str).collect();
    let apart = [p.x.as_str(), p.series.as_str(), p.panel.as_str()];
    let mut keys = vec![p.panel.clone()];
    // A key each of whose values sits at one x is a label of the x position (a format at its
    // bits per weight), not a panel: splitting by it would leave one point per panel.
    keys.extend(
        key_columns(&[(t, rows.clone())], &apart, &metrics)
            .into_iter()
            .filter(|k| !labels_x(t, &rows, k, &p.x, &p.panel)),
    );
    let mut grouped: BTreeMap<String, (Vec<String>, Vec<&[String]>)> = BTreeMap::new();
    for r in &rows {
        let values: Vec<String> = keys.iter().map(|k| t.get(r, k).to_string()).collect();
        grouped
            .entry(point_of(t, r, &keys))
            .or_insert_with(|| (values, vec![]))
            .1
            .push(r);
    }
    let mut out: Vec<Panel> = grouped
        .into_values()
        .map(|(values, rows)| {
            let metric =
                p.y.get(&values[0])
                    .or_else(|| p.y.get("*"))
                    .cloned()
                    .unwrap_or_else(|| "median_ms".into());
            let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
            for r in rows {
                if let (Some(x), Some(y)) = (t.number(r, &p.x), t.number(r, &metric)) {
                    if !p.log_y || y > 0.0 {
                        series
                            .entry(t.get(r, &p.series).to_string())
                            .or_default()
                            .push((x, y));
                    }
                }
            }
            Panel {
                values,
                series,
                metric,
            }
        })
        .filter(|panel| {
            let mut xs: Vec<f64> = panel.series.values().flatten().map(|pt| pt.0).collect();
            xs.sort_by(f64::total_cmp);
            xs.dedup();
            xs.len() >= 2
        })
        .collect();
    out.sort_by(|a, b| by_value(&a.values, &b.values));
    (keys, out)
}

/// Whether, within each value of `panel`, every value of `key` among `rows` occurs at a
/// single value of `x`.
fn labels_x(t: &Table, rows: &[&[String]], key: &str, x: &str, panel: &str) -> bool {
    let mut at: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    rows.iter().all(|r| {
        let x_here = t.get(r, x);
        *at.entry((t.get(r, panel), t.get(r, key))).or_insert(x_here) == x_here
    })
}

/// A filter value matches a cell: the same text, or the same number (`0` and `0.0`).
fn same_value(cell: &str, want: &str) -> bool {
    cell == want || matches!((cell.parse::<f64>(), want.parse::<f64>()), (Ok(a), Ok(b)) if a == b)
}

fn draw(p: &PlotSpec, table: &Table, prov: &Provenance, svg: &mut String) -> Result<()> {
    let (keys, mut panels) = panels(p, table);
    if panels.is_empty() {
        panels.push(Panel {
            values: vec!["(no panel with two or more x values)".into()],
            series: BTreeMap::new(),
            metric: p.y.get("*").cloned().unwrap_or_else(|| "median_ms".into()),
        });
    }
    let cols = panels.len().min(PANELS_PER_ROW);
    let grid_rows = panels.len().div_ceil(PANELS_PER_ROW);
    let root = SVGBackend::with_string(svg, (560 * cols as u32, 440 * grid_rows as u32))
        .into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let areas = root.split_evenly((grid_rows, cols));
    for (area, panel) in areas.iter().zip(panels) {
        let Panel {
            values,
            series,
            metric,
        } = panel;
        let mut xs: Vec<f64> = series.values().flatten().map(|pt| pt.0).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
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
        // Log axes get ticks at the grid's values (at most ten, evenly spread); linear ones
        // plotters' round numbers.
        let step = xs.len().div_ceil(10).max(1);
        let ticks: Vec<f64> = xs.iter().copied().step_by(step).collect();
        let (lx0, lx1) = (x0 / 1.15, x1 * 1.15);
        let pad = (x1 - x0) * 0.03;
        let small = y1 < 20.0;
        // Multi-valued filters (a|b|c) pick the series; the caption names single values only.
        let mut named: Vec<String> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        named.extend(
            p.filter
                .iter()
                .filter(|(_, v)| !v.contains('|'))
                .map(|(k, v)| format!("{k}={v}")),
        );
        let caption = named.join(" ");
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
                    .x_labels(ticks.len().max(2))
                    .x_label_formatter(&|x| tick(*x))
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
                .build_cartesian_2d(
                    (lx0..lx1).log_scale().with_key_points(ticks.clone()),
                    0.0..y1 * 1.1
                )
                .map_err(plot_err)?),
            (false, false) => draw!(b
                .build_cartesian_2d((x0 - pad)..(x1 + pad), 0.0..y1 * 1.1)
                .map_err(plot_err)?),
            (true, true) => draw!(b
                .build_cartesian_2d(
                    (lx0..lx1).log_scale().with_key_points(ticks.clone()),
                    y_log.log_scale()
                )
                .map_err(plot_err)?),
            (false, true) => draw!(b
                .build_cartesian_2d((x0 - pad)..(x1 + pad), y_log.log_scale())
                .map_err(plot_err)?),
        }
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::table::table_from_text as table;

    fn spec(x: &str, panel: &str, series: &str, y: &str, filter: &[(&str, &str)]) -> PlotSpec {
        PlotSpec {
            x: x.into(),
            panel: panel.into(),
            series: series.into(),
            y: [("*".to_string(), y.to_string())].into(),
            filter: filter
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log_x: false,
            log_y: false,
            legend: "upper_left".into(),
        }
    }

    /// The run shapes that drew empty figures: a float x (`load`) with the grid point's text
    /// column and integer measurements beside it (serving), a format at its bits per weight
    /// (quant), and a filter `temperature = "0"` over cells written `0.0` (spec).
    #[test]
    fn float_coordinates_labels_of_x_and_numeric_filters_keep_the_points() {
        let t = table(
            "run_id,variant,status,point,model,mode,load,steps,tps\n\
             r,e,ok,model=a load=0.5 mode=s,a,s,0.5,17,1.0\n\
             r,e,ok,model=a load=1.0 mode=s,a,s,1.0,23,2.0\n\
             r,e,ok,model=a load=0.5 mode=c,a,c,0.5,19,1.5\n\
             r,e,ok,model=a load=1.0 mode=c,a,c,1.0,29,2.5\n",
        );
        let (keys, got) = panels(&spec("load", "model", "mode", "tps", &[]), &t);
        assert_eq!(keys, ["model"], "point and steps are not panel keys");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].series.values().map(Vec::len).sum::<usize>(), 4);

        let t = table(
            "run_id,variant,status,format,bits_per_weight,shape,temperature,speedup\n\
             r,fused,ok,q4_0,4.5,a,0.0,3.0\n\
             r,fused,ok,sym4g32,4.5,a,0.0,2.8\n\
             r,fused,ok,q8_0,8.5,a,0.0,2.0\n\
             r,fused,ok,f32,32,a,0.0,1.0\n",
        );
        let p = spec(
            "bits_per_weight",
            "shape",
            "variant",
            "speedup",
            &[("temperature", "0")],
        );
        let (keys, got) = panels(&p, &t);
        assert_eq!(keys, ["shape"], "format labels the x position");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].series["fused"].len(), 4);
        assert!(same_value("0.0", "0") && !same_value("0.1", "0") && same_value("a", "a"));
    }
}
