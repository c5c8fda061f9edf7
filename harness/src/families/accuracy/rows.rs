//! The accuracy family's rows (`AccuracyCols`: one model load of one study — a weight
//! format, a layer or projection kind quantised alone, a mixed-precision plan — with its
//! perplexity, KL divergence and top-1 agreement against f32 and its decode speed) and the
//! report's tables: formats side by side, layers and projections ranked by the KL they add,
//! the plan beside uniform low and high precision.

use super::bench::Measured;
use crate::row::{Head, Heads, Row};
use crate::spec::ExperimentSpec;
use kernel_quant::WeightFormat;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One measurement. Column names are stable.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AccuracyCols {
    pub model: String,
    pub text: String,
    /// formats | layers | projections | plan
    pub study: String,
    /// The format studied (formats, layers, projections) or the plan's label (plan).
    pub format: String,
    /// all | the layer's index | the projection kind (q_proj, ...) | the layers kept high.
    pub target: String,
    /// dense | ggml | sym g32 | ... | mixed
    pub scheme: String,
    /// Stored bits per weight of the projection matrices.
    pub bits_per_weight: Option<f64>,
    pub weight_mb: Option<f64>,
    pub ctx: usize,
    pub windows: usize,
    pub scored_tokens: Option<usize>,
    pub ppl: Option<f64>,
    pub ppl_ci_lo: Option<f64>,
    pub ppl_ci_hi: Option<f64>,
    /// This perplexity minus the f32 model's on the same windows.
    pub delta_ppl: Option<f64>,
    /// Mean KL(f32 ‖ this) per scored token, nats.
    pub kl_mean: Option<f64>,
    pub kl_stderr: Option<f64>,
    /// Scored tokens whose most likely next token is the f32 model's.
    pub top1_agreement: Option<f64>,
    /// Batch-1 decode (formats and plan studies).
    pub decode_tokens_per_s: Option<f64>,
    /// Over the f32 model's decode tokens/s in the same run.
    pub speedup_vs_f32: Option<f64>,
    /// By KL within the study and format, 1 = the most sensitive (layers, projections).
    pub rank: Option<usize>,
}

/// A row: the shared head, these columns, the note.
pub type AccuracyRow = Row<AccuracyCols>;

/// What every row of a run shares.
pub struct RowCtx<'a> {
    /// The run's id, experiment and device.
    pub heads: &'a Heads,
    pub seed: u64,
    pub model: &'a str,
    pub text: &'a str,
}

/// What one row is of.
pub struct Subject<'a> {
    pub study: &'a str,
    pub format: &'a str,
    pub target: String,
    pub scheme: String,
    pub ctx: usize,
    pub windows: usize,
}

impl RowCtx<'_> {
    /// A measured row; `decode`: its tokens/s and the f32 model's.
    pub fn measured(&self, s: Subject, m: &Measured, decode: Option<(f64, f64)>) -> AccuracyRow {
        let (lo, hi) = m.ppl.ppl_ci95();
        let mut row = self.empty(s, "ok");
        row.cols = AccuracyCols {
            bits_per_weight: Some(m.projection_bits),
            weight_mb: Some(m.weight_bytes as f64 / 1e6),
            scored_tokens: Some(m.ppl.nll.count),
            ppl: Some(m.ppl.ppl()),
            ppl_ci_lo: Some(lo),
            ppl_ci_hi: Some(hi),
            delta_ppl: Some(m.ppl.ppl() - m.ref_ppl),
            kl_mean: Some(m.kl.kl.mean()),
            kl_stderr: Some(m.kl.kl.stderr()),
            top1_agreement: Some(m.kl.top1_agreement()),
            decode_tokens_per_s: decode.map(|d| d.0),
            speedup_vs_f32: decode.map(|(ours, f32)| ours / f32),
            ..row.cols
        };
        row
    }

    /// A row the memory guard skipped, its note saying why.
    pub fn skipped(&self, s: Subject, note: &str) -> AccuracyRow {
        let mut r = self.empty(s, "skipped");
        r.note = note.into();
        r
    }

    /// A row with no measurement (status unsupported, and why in the note).
    pub fn empty(&self, s: Subject, status: &str) -> AccuracyRow {
        Row {
            head: Head {
                status: status.into(),
                ..self.heads.head("model", self.seed)
            },
            cols: AccuracyCols {
                model: self.model.into(),
                text: self.text.into(),
                study: s.study.into(),
                format: s.format.into(),
                target: s.target,
                scheme: s.scheme,
                bits_per_weight: None,
                weight_mb: None,
                ctx: s.ctx,
                windows: s.windows,
                scored_tokens: None,
                ppl: None,
                ppl_ci_lo: None,
                ppl_ci_hi: None,
                delta_ppl: None,
                kl_mean: None,
                kl_stderr: None,
                top1_agreement: None,
                decode_tokens_per_s: None,
                speedup_vs_f32: None,
                rank: None,
            },
            note: String::new(),
        }
    }
}

/// The family of a format, for the plot's lines: dense, ggml, sym g32, asym g64.
pub fn scheme(f: WeightFormat) -> String {
    match f {
        WeightFormat::F32 | WeightFormat::F16 => "dense".into(),
        WeightFormat::Sym { group, .. } => format!("sym g{group}"),
        WeightFormat::Asym { group, .. } => format!("asym g{group}"),
        _ => "ggml".into(),
    }
}

fn f(v: Option<f64>, digits: usize) -> String {
    crate::render::fmt_opt(v, digits)
}

fn kl(r: &AccuracyRow) -> String {
    match (r.kl_mean, r.kl_stderr) {
        (Some(m), Some(e)) => format!("{m:.5} ± {e:.5}"),
        _ => "–".into(),
    }
}

fn ppl(r: &AccuracyRow) -> String {
    match (r.ppl, r.ppl_ci_lo, r.ppl_ci_hi) {
        (Some(p), Some(lo), Some(hi)) => format!("{p:.3} ({lo:.2}–{hi:.2})"),
        _ => "–".into(),
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{:.2}%", 100.0 * x))
}

/// The markdown tables of a run.
pub fn tables(_spec: &ExperimentSpec, rows: &[AccuracyRow]) -> String {
    let mut md = String::new();
    let of =
        |study: &str| -> Vec<&AccuracyRow> { rows.iter().filter(|r| r.study == study).collect() };
    let formats = of("formats");
    if !formats.is_empty() {
        md.push_str("## Weight formats against f32 (perplexity with its 95% interval, KL(f32 ‖ format) per token, decode at batch 1)\n\n| format | scheme | bits/weight | PPL (95% CI) | ΔPPL | KL mean ± se | top-1 | decode tok/s | speed-up vs f32 | status |\n|---|---|---|---|---|---|---|---|---|---|\n");
        for r in &formats {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.format,
                r.scheme,
                f(r.bits_per_weight, 2),
                ppl(r),
                f(r.delta_ppl, 3),
                kl(r),
                pct(r.top1_agreement),
                f(r.decode_tokens_per_s, 1),
                r.speedup_vs_f32.map_or("–".into(), |s| format!("{s:.2}×")),
                if r.head.status == "ok" {
                    "ok".to_string()
                } else {
                    format!("{}: {}", r.head.status, r.note)
                }
            );
        }
        md.push('\n');
    }
    for (study, what) in [("layers", "layer"), ("projections", "projection")] {
        let scans = of(study);
        let mut fmts: Vec<&str> = vec![];
        for r in &scans {
            if !fmts.contains(&r.format.as_str()) {
                fmts.push(&r.format);
            }
        }
        for fmt in fmts {
            let mut ranked: Vec<&&AccuracyRow> = scans.iter().filter(|r| r.format == fmt).collect();
            ranked.sort_by_key(|r| r.rank.unwrap_or(usize::MAX));
            let _ = write!(
                md,
                "## Sensitivity: one {what} at a time in {fmt} (simulated, the rest f32), ranked by the KL it adds\n\n| rank | {what} | KL mean ± se | ΔPPL | top-1 |\n|---|---|---|---|---|\n"
            );
            for r in ranked {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} |",
                    r.rank.map_or("–".into(), |k| k.to_string()),
                    r.target,
                    kl(r),
                    f(r.delta_ppl, 4),
                    pct(r.top1_agreement)
                );
            }
            md.push('\n');
        }
    }
    let plan = of("plan");
    if !plan.is_empty() {
        md.push_str("## Mixed precision: the most sensitive layers kept high, against uniform low and high\n\n| plan | layers kept high | bits/weight | weight MB | PPL (95% CI) | ΔPPL | KL mean ± se | top-1 | decode tok/s | speed-up vs f32 |\n|---|---|---|---|---|---|---|---|---|---|\n");
        for r in &plan {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.format,
                r.target,
                f(r.bits_per_weight, 2),
                f(r.weight_mb, 1),
                ppl(r),
                f(r.delta_ppl, 3),
                kl(r),
                pct(r.top1_agreement),
                f(r.decode_tokens_per_s, 1),
                r.speedup_vs_f32.map_or("–".into(), |s| format!("{s:.2}×"))
            );
        }
        md.push('\n');
    }
    md
}
