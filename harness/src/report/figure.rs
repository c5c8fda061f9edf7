//! The claims figure of `paper/` (`claims.svg`): every tested check of `claims.toml` as one
//! line, its measured values divided by the number the claim states — the range min–max as a
//! bar, the judged statistic (the median, or the check's `max`/`min`/`median`) as a dot — on a
//! log axis where 1 is the claim's number, its tolerance band (`~ x`) or interval
//! (`between x y`) shaded, coloured by the check's verdict (grey for a check not in regime:
//! the CPU values drawn are evidence on the mechanism, not the claim's verdict). One picture answers "by how much
//! is each claim off?", which the table says in numbers. Checks whose number is 0 or whose
//! values are not all positive cannot sit on a log axis and are counted in the caption.

use crate::error::{HarnessError, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One check to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct FigureCheck {
    /// `C8 · the part of the claim` (the check's `what`).
    pub label: String,
    /// The check's verdict word (`Verdict::word`).
    pub verdict: &'static str,
    /// The number the claim states (the rule's `x`).
    pub number: f64,
    /// The band that passes, in units of `number` (`>= x`: (1, 1); `~ x` within t: (1 − t,
    /// 1 + t); `between x y`: (1, y / x)).
    pub band: (f64, f64),
    /// Every measured value.
    pub values: Vec<f64>,
    /// The judged statistic (the median of `values` when the rule applies to each).
    pub marker: f64,
}

impl FigureCheck {
    /// Whether it can be drawn on a log axis.
    pub fn drawable(&self) -> bool {
        self.number > 0.0
            && !self.values.is_empty()
            && self.values.iter().all(|v| *v > 0.0 && v.is_finite())
            && self.marker > 0.0
    }
}

fn plot_err(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Usage(format!("plotting the claims figure failed: {e}"))
}

fn colour(verdict: &str) -> RGBColor {
    match verdict {
        "holds" => RGBColor(0x1b, 0x9e, 0x77),
        "holds, stronger than claimed" => RGBColor(0x0b, 0x5e, 0x47),
        "refuted" => RGBColor(0xd9, 0x5f, 0x02),
        "tie (within noise)" => RGBColor(0xe6, 0xab, 0x02),
        "not in regime" => RGBColor(0x99, 0x99, 0x99),
        "untested" => RGBColor(0x33, 0x33, 0x33),
        _ => RGBColor(0x75, 0x70, 0xb3),
    }
}

/// The legend's entries: the word drawn and the verdict it colours.
const LEGEND: [(&str, &str); 6] = [
    ("holds", "holds"),
    ("stronger than claimed", "holds, stronger than claimed"),
    ("refuted", "refuted"),
    ("depends", "depends"),
    ("tie", "tie (within noise)"),
    ("not in regime (CPU evidence)", "not in regime"),
];

/// Labels longer than this are cut with an ellipsis.
const LABEL_CHARS: usize = 72;

fn short(label: &str) -> String {
    if label.chars().count() <= LABEL_CHARS {
        label.to_string()
    } else {
        let cut: String = label.chars().take(LABEL_CHARS - 1).collect();
        format!("{cut}…")
    }
}

/// The SVG text of the figure.
pub fn claims_svg(checks: &[FigureCheck]) -> Result<String> {
    let drawn: Vec<&FigureCheck> = checks.iter().filter(|c| c.drawable()).collect();
    let left_out = checks.len() - drawn.len();
    let row_px = 24u32;
    let (width, height) = (1300u32, 120 + row_px * drawn.len().max(1) as u32);
    let ratio = |c: &FigureCheck, v: f64| v / c.number;
    let (mut lo, mut hi) = (0.5f64, 2.0f64);
    for c in &drawn {
        for &v in &c.values {
            lo = lo.min(ratio(c, v));
            hi = hi.max(ratio(c, v));
        }
        lo = lo.min(c.band.0);
        hi = hi.max(c.band.1);
    }
    let (lo, hi) = (lo / 1.3, hi * 1.3);
    let ticks: Vec<f64> = [
        1e-4, 1e-3, 0.01, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0, 100.0, 1e3, 1e4,
    ]
    .into_iter()
    .filter(|t| (lo..=hi).contains(t))
    .collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let caption = format!(
            "Measured ÷ claimed, per check ({} drawn{})",
            drawn.len(),
            if left_out > 0 {
                format!("; {left_out} with a claimed 0 or values ≤ 0 not drawn")
            } else {
                String::new()
            }
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(580)
            .build_cartesian_2d(
                (lo..hi).log_scale().with_key_points(ticks.clone()),
                0.0..drawn.len().max(1) as f64,
            )
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .x_labels(ticks.len().max(2))
            .x_label_formatter(&|x| {
                if *x >= 1.0 {
                    format!("{x:.0}×")
                } else {
                    format!("{x}×")
                }
            })
            .x_desc("measured ÷ the claim's number (log; 1 = the claim)")
            .draw()
            .map_err(plot_err)?;
        for (i, c) in drawn.iter().enumerate() {
            // Top to bottom in the declarations' order.
            let y = (drawn.len() - 1 - i) as f64 + 0.5;
            let col = colour(c.verdict);
            if c.band.1 > c.band.0 {
                chart
                    .draw_series([Rectangle::new(
                        [(c.band.0, y - 0.4), (c.band.1, y + 0.4)],
                        RGBColor(0xcc, 0xcc, 0xcc).mix(0.6).filled(),
                    )])
                    .map_err(plot_err)?;
            }
            let (vlo, vhi) = c
                .values
                .iter()
                .map(|&v| ratio(c, v))
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                    (a.min(v), b.max(v))
                });
            chart
                .draw_series([PathElement::new(
                    vec![(vlo, y), (vhi, y)],
                    col.stroke_width(4),
                )])
                .map_err(plot_err)?;
            chart
                .draw_series([Circle::new((ratio(c, c.marker), y), 5, col.filled())])
                .map_err(plot_err)?;
            let (px, py) = chart.backend_coord(&(lo, y));
            let style = ("sans-serif", 15)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Right, VPos::Center));
            root.draw(&Text::new(short(&c.label), (px - 8, py), style))
                .map_err(plot_err)?;
        }
        chart
            .draw_series(DashedLineSeries::new(
                vec![(1.0, 0.0), (1.0, drawn.len().max(1) as f64)],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(plot_err)?;
        for (k, (word, verdict)) in LEGEND.into_iter().enumerate() {
            let x = 20 + 190 * k as i32;
            let y = height as i32 - 14;
            root.draw(&Circle::new((x, y), 5, colour(verdict).filled()))
                .map_err(plot_err)?;
            root.draw(&Text::new(
                word,
                (x + 10, y),
                ("sans-serif", 15)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(plot_err)?;
        }
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(label: &str, verdict: &'static str, number: f64, values: &[f64]) -> FigureCheck {
        FigureCheck {
            label: label.into(),
            verdict,
            number,
            band: (1.0, 1.0),
            values: values.to_vec(),
            marker: values[0],
        }
    }

    #[test]
    fn every_drawable_check_is_a_labelled_line_and_the_rest_are_counted() {
        let checks = [
            check("C8 · flash2 at 4096", "refuted", 2.3, &[1.18, 1.89]),
            check("C3 · bytes", "holds", 2.0, &[2.0]),
            check("C19 · delta", "depends", 0.0, &[0.1]),
            check("C20 · negative", "depends", 1.0, &[-0.2, 0.3]),
        ];
        let svg = claims_svg(&checks).unwrap();
        assert!(svg.contains("C8 · flash2 at 4096") && svg.contains("C3 · bytes"));
        assert!(!svg.contains("C19 · delta") && !svg.contains("C20 · negative"));
        assert!(svg.contains("2 drawn; 2 with a claimed 0"), "{svg}");
        // Same input, same bytes (paper --check compares them).
        assert_eq!(svg, claims_svg(&checks).unwrap());
        assert_eq!(short(&"x".repeat(100)).chars().count(), LABEL_CHARS);
    }
}
