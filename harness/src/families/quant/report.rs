//! The markdown of a quant run: the quantisation error per format, every timed product with
//! its speed-ups over f32 and f16 weights (and over the spec's `report.peer`, its time /
//! ours, when the run has its rows), our quantiser beside the quantiser peers, and the rows
//! not passing.

use super::cols::{QuantCols, QuantRow};
use crate::error::Result;
use crate::provenance::Provenance;
use crate::render::{fmt_err, fmt_opt, report, Rendered};
use crate::spec::ExperimentSpec;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// The quant family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<QuantCols>(spec, csv, prov, tables)
}

/// The markdown tables of a quant run: errors per format, the batch-1 GEMV, speed-ups over
/// f32 weights by batch size (and over the report's peer), and the quantisers.
pub fn tables(spec: &ExperimentSpec, rows: &[QuantRow]) -> String {
    let mut md = String::new();
    let ok: Vec<&QuantRow> = rows
        .iter()
        .filter(|r| r.op != "quantize" && (r.head.status == "ok" || r.head.status == "fail"))
        .collect();
    let peer = spec
        .report
        .peer
        .as_deref()
        .and_then(|p| peer_label(rows, p));
    let point = |r: &QuantRow| (r.shape.clone(), r.weights.clone(), r.batch);
    let peer_ms: BTreeMap<(String, String, usize), f64> = ok
        .iter()
        .filter(|r| Some(&r.head.variant) == peer.as_ref() && r.head.status == "ok")
        .filter_map(|r| Some((point(r), r.head.median_ms?)))
        .collect();
    let first_batch = ok.iter().map(|r| r.batch).min().unwrap_or(1);
    let _ = writeln!(
        md,
        "## Quantisation error (per format; output error at batch {first_batch})\n"
    );
    let _ = writeln!(md, "| shape | weights | format | bits/weight | weight RMSE | max abs | SNR dB | output rel err |\n|---|---|---|---|---|---|---|---|");
    for r in ok
        .iter()
        .filter(|r| r.batch == first_batch && r.head.variant == ok[0].head.variant)
    {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.3} | {:.2e} | {:.2e} | {:.1} | {} |",
            r.shape,
            r.weights,
            r.format,
            r.bits_per_weight,
            r.w_rmse,
            r.w_max_abs,
            r.w_snr_db,
            r.out_rel_err.map_or("–".into(), |e| format!("{e:.2e}"))
        );
    }
    let _ = writeln!(md, "\n## Timing\n");
    let peer_col = peer.as_ref().map_or(String::new(), |p| format!(" × {p} |"));
    let _ = writeln!(md, "| shape | weights | batch | format | variant | median ms | p10–p90 ms | GB/s | % read BW | GFLOP/s | × f32 | × f16 |{peer_col} rel L2 vs ref | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|{}---|---|", if peer.is_some() { "---|" } else { "" });
    for r in &ok {
        let vs_peer = match (&peer, r.head.median_ms) {
            (Some(_), Some(ms)) => {
                format!(" {} |", fmt_opt(peer_ms.get(&point(r)).map(|p| p / ms), 2))
            }
            (Some(_), None) => " – |".into(),
            (None, _) => String::new(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {}–{} | {} | {} | {} | {} | {} |{} {} | {} |",
            r.shape,
            r.weights,
            r.batch,
            r.format,
            r.head.variant,
            fmt_opt(r.head.median_ms, 3),
            fmt_opt(r.head.p10_ms, 3),
            fmt_opt(r.head.p90_ms, 3),
            fmt_opt(r.gbps, 1),
            fmt_opt(r.pct_read_bw, 0),
            fmt_opt(r.gflops, 1),
            fmt_opt(r.speedup_vs_f32, 2),
            fmt_opt(r.speedup_vs_f16, 2),
            vs_peer,
            fmt_err(r.rel_l2_err),
            r.head.status
        );
    }
    md.push_str(&quantisers(rows));
    let bad: Vec<&QuantRow> = rows.iter().filter(|r| r.head.status != "ok").collect();
    if !bad.is_empty() {
        let _ = writeln!(
            md,
            "\n## Rows not passing\n\n| format | shape | batch | status | why |\n|---|---|---|---|---|"
        );
        for r in bad {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                r.format, r.shape, r.batch, r.head.status, r.note
            );
        }
    }
    md.push('\n');
    md
}

/// The label of the report's peer among the rows: exactly `name`, else the first whose base
/// name (before `:`) is `name`.
fn peer_label(rows: &[QuantRow], name: &str) -> Option<String> {
    let labels: Vec<&String> = rows
        .iter()
        .filter(|r| !r.head.peer_version.is_empty() || r.head.variant.starts_with(name))
        .map(|r| &r.head.variant)
        .collect();
    labels
        .iter()
        .find(|l| l.as_str() == name)
        .or_else(|| labels.iter().find(|l| l.split(':').next() == Some(name)))
        .map(|l| l.to_string())
}

/// Our quantiser beside the quantiser peers (rows with op = quantize): time per matrix, and
/// each peer's time over ours.
fn quantisers(rows: &[QuantRow]) -> String {
    let q: Vec<&QuantRow> = rows.iter().filter(|r| r.op == "quantize").collect();
    if q.is_empty() {
        return String::new();
    }
    let ours: BTreeMap<(String, String, String), f64> = q
        .iter()
        .filter(|r| r.head.variant == "quantize")
        .filter_map(|r| {
            let key = (r.shape.clone(), r.weights.clone(), r.format.clone());
            Some((key, r.head.median_ms?))
        })
        .collect();
    let mut md = String::from(
        "\n## Quantisers: f32 weights → format, ours beside the peers\n\n| shape | weights | format | quantiser | threads | median ms | p10–p90 ms | GB/s | its time / ours | weight RMSE | status | note |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in q {
        let key = (r.shape.clone(), r.weights.clone(), r.format.clone());
        let ratio = match (r.head.variant.as_str(), r.head.median_ms, ours.get(&key)) {
            ("quantize", _, _) => "1 (ours)".to_string(),
            (_, Some(ms), Some(o)) => format!("{:.2}", ms / o),
            _ => "–".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {}–{} | {} | {} | {:.2e} | {} | {} |",
            r.shape,
            r.weights,
            r.format,
            r.head.variant,
            r.head.threads,
            fmt_opt(r.head.median_ms, 2),
            fmt_opt(r.head.p10_ms, 2),
            fmt_opt(r.head.p90_ms, 2),
            fmt_opt(r.gbps, 2),
            ratio,
            r.w_rmse,
            r.head.status,
            r.note
        );
    }
    md
}
