//! The markdown of an attention run: one table per mode of the measured rows (time, GB/s,
//! GFLOP/s, % of roofline, scratch memory, error), speed-ups over the spec's `report.baseline`
//! variant at each point, and the count of rows not measured or not passing, by reason.

use super::cols::{AttentionCols, ExpRow};
use crate::error::Result;
use crate::provenance::Provenance;
use crate::render::{fmt_err, fmt_opt, report, Rendered};
use crate::spec::ExperimentSpec;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// The attention family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<AttentionCols>(spec, csv, prov, tables)
}

/// Markdown tables: measured rows per mode, speed-ups over the baseline, and what did not run.
pub fn tables(spec: &ExperimentSpec, rows: &[ExpRow]) -> String {
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
            .filter(|r| r.mode == mode && (r.head.status == "ok" || r.head.status == "fail"))
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
                r.head.variant,
                fmt_opt(r.head.median_ms, 3),
                fmt_opt(r.head.p10_ms, 3),
                fmt_opt(r.head.p90_ms, 3),
                fmt_opt(r.gbps, 1),
                fmt_opt(r.gflops, 1),
                fmt_opt(r.pct_roofline, 0),
                fmt_opt(r.scratch_mib, 1),
                fmt_err(r.rel_l2_err),
                r.head.status
            );
        }
        md.push('\n');
    }
    if let Some(base) = &spec.report.baseline {
        md.push_str(&speedups(rows, base));
    }
    if let Some(peer) = &spec.report.peer {
        if rows
            .iter()
            .any(|r| r.head.variant == *peer && r.head.status == "ok")
        {
            md.push_str(&speedups(rows, peer));
        }
    }
    let mut counts: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.head.status != "ok") {
        *counts
            .entry((r.head.status.clone(), r.note.clone()))
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
    for r in rows.iter().filter(|r| r.head.status == "ok") {
        if !variants.contains(&r.head.variant) {
            variants.push(r.head.variant.clone());
        }
        let k = key(r);
        if !order.contains(&k) {
            order.push(k.clone());
        }
        table
            .entry(k)
            .or_default()
            .insert(r.head.variant.clone(), r.head.median_ms.unwrap_or(f64::NAN));
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
