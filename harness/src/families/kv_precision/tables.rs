//! The markdown tables of a kv_precision run: per quality point, each format's bytes per
//! token, perplexity, ΔPPL, KL and top-1 agreement against the f32 cache and its storage
//! error; per decode point, each format's paged decode time, GB/s and speed-up over the f32
//! cache with its error against the reference of the cache as stored; then what failed.

use super::cols::KvPrecisionRow;
use crate::render::{fmt_err, fmt_opt};
use crate::spec::ExperimentSpec;
use std::fmt::Write as _;

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("–".into(), |x| x.to_string())
}

/// Distinct values of `key` over `rows`, in order of first appearance.
fn groups<'r, K: PartialEq + Clone>(
    rows: &[&'r KvPrecisionRow],
    key: impl Fn(&KvPrecisionRow) -> K,
) -> Vec<(K, Vec<&'r KvPrecisionRow>)> {
    let mut out: Vec<(K, Vec<&KvPrecisionRow>)> = vec![];
    for &r in rows {
        let k = key(r);
        match out.iter_mut().find(|(g, _)| *g == k) {
            Some((_, v)) => v.push(r),
            None => out.push((k, vec![r])),
        }
    }
    out
}

/// The run's tables.
pub fn tables(_spec: &ExperimentSpec, rows: &[KvPrecisionRow]) -> String {
    let mut md = String::new();
    let quality: Vec<&KvPrecisionRow> = rows.iter().filter(|r| r.part == "quality").collect();
    let by_point = |r: &KvPrecisionRow| {
        (
            r.model.clone(),
            r.text.clone(),
            r.ctx,
            r.windows,
            r.prefill_chunk,
        )
    };
    for ((model, text, ctx, wins, chunk), rs) in groups(&quality, by_point) {
        let _ = writeln!(
            md,
            "## Quality: {model} on {text}, {} windows of {} tokens, prefilled {} at a time\n\nKL divergence and top-1 agreement against the f32 cache's next-token distributions on the same windows; bytes per token over all layers at the window length; storage error of the model's own K/V (first window, every layer).\n\n| kv_cache | bytes/token | × f32 | PPL | ΔPPL | KL (nats) | top-1 | store rel L2 | store SNR dB | tokens/s | note |\n|---|---|---|---|---|---|---|---|---|---|---|",
            opt(wins),
            opt(ctx),
            opt(chunk)
        );
        for r in rs {
            let _ = writeln!(
                md,
                "| {} | {:.0} | {:.3} | {} ± {} | {} | {} ± {} | {} | {} | {} | {} | {} |",
                r.kv_cache,
                r.kv_bytes_per_token,
                r.bytes_vs_f32,
                fmt_opt(r.ppl, 4),
                fmt_opt(r.ppl_stderr, 3),
                r.delta_ppl.map_or("–".into(), |d| format!("{d:+.4}")),
                fmt_err(r.kl_mean),
                fmt_err(r.kl_stderr),
                r.top1_agreement
                    .map_or("–".into(), |t| format!("{:.2}%", 100.0 * t)),
                fmt_err(r.store_rel_l2),
                fmt_opt(r.store_snr_db, 1),
                fmt_opt(r.tokens_per_s, 1),
                r.note
            );
        }
        md.push('\n');
    }
    let decode: Vec<&KvPrecisionRow> = rows.iter().filter(|r| r.part == "decode").collect();
    let by_shape = |r: &KvPrecisionRow| (r.shape.clone(), r.block_size, r.isa.clone());
    for ((shape, bs, isa), rs) in groups(&decode, by_shape) {
        let _ = writeln!(
            md,
            "## Paged decode {shape}, blocks of {}, ISA {isa}\n\nOne new token per sequence; GB/s of what a call reads (q, the K/V as stored — codes and scales —, the tables, the output); error against the f64 reference of the cache as stored; storage error of the Gaussian K/V written.\n\n| kv_cache | bytes/token | × f32 | MB read | median ms | GB/s | % read BW | speed-up vs f32 | rel L2 err | store rel L2 | store SNR dB | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|",
            opt(bs)
        );
        for r in rs {
            let _ = writeln!(
                md,
                "| {} | {:.1} | {:.3} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.kv_cache,
                r.kv_bytes_per_token,
                r.bytes_vs_f32,
                fmt_opt(r.bytes.map(|b| b / 1e6), 1),
                fmt_opt(r.head.median_ms, 3),
                fmt_opt(r.gbps, 1),
                r.pct_read_bw.map_or("–".into(), |p| format!("{p:.0}%")),
                r.speedup_vs_f32.map_or("–".into(), |s| format!("{s:.2}×")),
                fmt_err(r.rel_l2_err),
                fmt_err(r.store_rel_l2),
                fmt_opt(r.store_snr_db, 1),
                r.head.status
            );
        }
        md.push('\n');
    }
    let failed: Vec<&KvPrecisionRow> = rows.iter().filter(|r| r.head.status != "ok").collect();
    if !failed.is_empty() {
        md.push_str("## Rows that failed\n\n| part | kv_cache | point | status | note |\n|---|---|---|---|---|\n");
        for r in failed {
            let _ = writeln!(
                md,
                "| {} | {} | {}{} | {} | {} |",
                r.part, r.kv_cache, r.model, r.shape, r.head.status, r.note
            );
        }
        md.push('\n');
    }
    md
}
