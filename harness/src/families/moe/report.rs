//! The moe experiment's report: per grid point the routing convention's drops, reroutes,
//! unserved tokens and output error against the same convention without a capacity limit
//! (one table, so conventions at the same skew and capacity read side by side), then the
//! timing of every variant and the rows that did not pass.

use super::cols::{MoeCols, MoeRow};
use crate::error::Result;
use crate::provenance::Provenance;
use crate::render::{fmt_err, fmt_opt, report, Rendered};
use crate::spec::ExperimentSpec;
use std::fmt::Write as _;
use std::path::Path;

/// This family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<MoeCols>(spec, csv, prov, |_, rows| tables(rows))
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or("–".into(), |v| v.to_string())
}

fn or_blank(s: &str) -> &str {
    if s.is_empty() {
        "–"
    } else {
        s
    }
}

/// The cells naming a row's convention: experts, k, skew, routing, policy, norm, capacity.
fn convention(r: &MoeRow) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} | {} |",
        r.experts,
        or_dash(r.top_k),
        r.skew,
        r.routing,
        or_blank(&r.policy),
        r.norm,
        r.capacity
    )
}

/// The markdown tables of a moe run.
pub fn tables(rows: &[MoeRow]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "## Routing conventions: drops, reroutes and accuracy\n");
    let _ = writeln!(md, "| experts | k | skew | routing | policy | norm | capacity | min | slots | drop rate | rerouted | unserved tokens | multi-served | experts/token | imbalance | top-20% share | out err vs dropless | active/total params |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let first = rows
        .first()
        .map(|r| r.head.variant.clone())
        .unwrap_or_default();
    for r in rows.iter().filter(|r| r.head.variant == first) {
        let _ = writeln!(
            md,
            "{} {} | {} | {:.3} | {} | {} | {} | {} | {:.2} | {:.3} | {} | {:.3} |",
            convention(r),
            r.min_capacity,
            or_dash(r.capacity_slots),
            r.drop_rate,
            r.rerouted,
            or_dash(r.unserved_tokens),
            or_dash(r.multi_served_tokens),
            r.experts_per_token
                .map_or("–".into(), |e| format!("{e:.2}")),
            r.imbalance,
            r.top20_share,
            r.out_rel_err_vs_dropless
                .map_or("–".into(), |e| format!("{e:.2e}")),
            r.active_ratio
        );
    }
    let _ = writeln!(md, "\n## Timing\n");
    let _ = writeln!(md, "CPU rows time the whole layer (router + experts); `cuda_grouped` rows the expert kernels alone.\n");
    let _ = writeln!(md, "| experts | k | skew | routing | policy | norm | capacity | variant | dtype | median ms | p10–p90 ms | GFLOP/s (active) | rel L2 vs ref | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            md,
            "{} {} | {} | {} | {}–{} | {} | {} | {} |",
            convention(r),
            r.head.variant,
            r.dtype,
            fmt_opt(r.head.median_ms, 2),
            fmt_opt(r.head.p10_ms, 2),
            fmt_opt(r.head.p90_ms, 2),
            fmt_opt(r.gflops, 1),
            fmt_err(r.rel_l2_err),
            r.head.status
        );
    }
    let bad: Vec<&MoeRow> = rows.iter().filter(|r| r.head.status != "ok").collect();
    if !bad.is_empty() {
        let _ = writeln!(md, "\n## Rows not passing\n\n| config | capacity | skew | policy | norm | variant | status | why |\n|---|---|---|---|---|---|---|---|");
        for r in bad {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.config,
                r.capacity,
                r.skew,
                or_blank(&r.policy),
                r.norm,
                r.head.variant,
                r.head.status,
                r.note
            );
        }
    }
    md.push('\n');
    md
}
