//! The columns of a serving row and how a run's finished requests become them: throughput,
//! TTFT / TPOT / end-to-end latency percentiles (p50, p95, p99 by nearest rank on (n − 1)·p),
//! the inter-token gaps every request saw (their p95, and the share within a latency
//! objective), pauses and padding. Columns added after the first runs read from older CSVs
//! as empty.

use crate::row::Row;
use models::Finished;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One model × mode × load (× preemption × objective). Column names are stable.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ServingCols {
    pub model: String,
    pub mode: String,
    /// Offered rate / saturated capacity.
    pub load: f64,
    /// `off`, or `slo`: long sequences paused while the step-time p95 breaks the objective.
    #[serde(default)]
    pub preempt: String,
    /// The objective as a multiple of `step_median_ms` (empty without one).
    #[serde(default)]
    pub slo: Option<f64>,
    #[serde(default)]
    pub slo_ms: Option<f64>,
    /// Median step time of the saturated run (the objective's unit).
    #[serde(default)]
    pub step_median_ms: Option<f64>,
    pub rate_rps: f64,
    pub capacity_rps: f64,
    pub requests: usize,
    pub max_batch: usize,
    pub token_budget: usize,
    pub generated_tokens: usize,
    pub throughput_tok_s: f64,
    pub completed_rps: f64,
    pub ttft_p50_ms: f64,
    #[serde(default)]
    pub ttft_p95_ms: Option<f64>,
    pub ttft_p99_ms: f64,
    pub tpot_p50_ms: f64,
    #[serde(default)]
    pub tpot_p95_ms: Option<f64>,
    pub tpot_p99_ms: f64,
    pub latency_mean_ms: f64,
    #[serde(default)]
    pub latency_p95_ms: Option<f64>,
    #[serde(default)]
    pub latency_p99_ms: Option<f64>,
    /// p95 of every gap between two successive tokens of a request (paused gaps included).
    #[serde(default)]
    pub itl_p95_ms: Option<f64>,
    /// Share of those gaps within the objective (empty without one).
    #[serde(default)]
    pub slo_attainment: Option<f64>,
    /// Time-weighted mean of running sequences.
    pub mean_batch: f64,
    pub preemptions: usize,
    #[serde(default)]
    pub pauses: Option<usize>,
    /// Tokens run that no request asked for (prompt padding, finished members' slots) / all
    /// tokens run, %.
    #[serde(default)]
    pub padding_pct: Option<f64>,
    /// Prompt padding / prompt tokens run (padding included), %.
    #[serde(default)]
    pub prompt_padding_pct: Option<f64>,
    pub steps: usize,
    /// Real seconds the run took (step times summed).
    pub busy_s: f64,
    /// Speculation inside the engine: `off`, or the drafter and chain length
    /// (`ngram:3:k=4`; empty in runs from before the axis).
    #[serde(default)]
    pub spec: String,
    /// Draft tokens accepted / drafted (empty without speculation).
    #[serde(default)]
    pub spec_acceptance: Option<f64>,
    /// Where prompts come from: `random` tokens or a text's name (empty in runs from before
    /// the column: random).
    #[serde(default)]
    pub text: String,
    /// The projections' product (empty in runs from before the column: fused).
    #[serde(default)]
    pub matmul: String,
}

/// A row: the shared head, these columns, the note.
pub type ServingRow = Row<ServingCols>;

/// The `p` quantile by nearest rank on (n − 1)·p; NaN when empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// What a run's finished requests give.
pub struct Summary {
    pub throughput: f64,
    pub completed_rps: f64,
    /// p50, p95, p99 (ms).
    pub ttft: [f64; 3],
    pub tpot: [f64; 3],
    pub latency_mean: f64,
    /// p95, p99 (ms).
    pub latency: [f64; 2],
    pub itl_p95: f64,
    /// Share of inter-token gaps within `objective_s`.
    pub attainment: Option<f64>,
    pub generated: usize,
    pub makespan: f64,
}

/// The summary of `done`, with the share of gaps within `objective_s` when there is one.
pub fn summarise(done: &[Finished], objective_s: Option<f64>) -> Summary {
    let start = done.iter().map(|f| f.arrival).fold(f64::INFINITY, f64::min);
    let end = done.iter().map(|f| f.done).fold(0.0, f64::max);
    let generated: usize = done.iter().map(|f| f.generated.len()).sum();
    let ms = |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(|t| t * 1e3).collect() };
    let mut ttft = ms(done.iter().map(|f| f.ttft()).collect());
    let mut tpot = ms(done.iter().filter_map(|f| f.tpot()).collect());
    let mut latency = ms(done.iter().map(|f| f.done - f.arrival).collect());
    let mut gaps: Vec<f64> = done.iter().flat_map(|f| f.gaps()).collect();
    let attainment = objective_s
        .map(|o| gaps.iter().filter(|&&g| g <= o).count() as f64 / gaps.len().max(1) as f64);
    let makespan = end - start;
    let q3 = |v: &mut Vec<f64>| [percentile(v, 0.5), percentile(v, 0.95), percentile(v, 0.99)];
    Summary {
        throughput: generated as f64 / makespan,
        completed_rps: done.len() as f64 / makespan,
        ttft: q3(&mut ttft),
        tpot: q3(&mut tpot),
        latency_mean: latency.iter().sum::<f64>() / done.len() as f64,
        latency: [
            percentile(&mut latency, 0.95),
            percentile(&mut latency, 0.99),
        ],
        itl_p95: percentile(&mut gaps, 0.95) * 1e3,
        attainment,
        generated,
        makespan,
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |x| format!("{x:.digits$}"))
}

/// The markdown table of a serving run.
pub fn tables(rows: &[ServingRow]) -> String {
    let mut md = String::from("## Batching modes under Poisson arrivals\n\n");
    if let Some(r) = rows.first().filter(|r| !r.text.is_empty()) {
        let _ = writeln!(
            md,
            "Prompts: {}; the {} product.\n",
            if r.text == "random" {
                "random tokens".to_string()
            } else {
                format!("windows of the text `{}`", r.text)
            },
            r.matmul
        );
    }
    md.push_str("| model | load | mode | preempt (objective ms) | rate req/s | tokens/s | TTFT p50 / p95 / p99 ms | TPOT p50 / p95 / p99 ms | latency mean / p95 ms | inter-token p95 ms | within objective | mean batch | preemptions / pauses | padding % |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {:.2} | {} | {}{} | {:.2} | {:.1} | {:.0} / {} / {:.0} | {:.1} / {} / {:.1} | {:.0} / {} | {} | {} | {:.2} | {} / {} | {} |",
            r.model,
            r.load,
            match (r.spec.as_str(), r.spec_acceptance) {
                ("" | "off", _) => r.mode.clone(),
                (s, Some(a)) => format!("{} + spec {s} ({:.0}% accepted)", r.mode, 100.0 * a),
                (s, None) => format!("{} + spec {s}", r.mode),
            },
            if r.preempt.is_empty() { "off" } else { &r.preempt },
            r.slo_ms.map_or(String::new(), |o| format!(" ({o:.0})")),
            r.rate_rps,
            r.throughput_tok_s,
            r.ttft_p50_ms,
            opt(r.ttft_p95_ms, 0),
            r.ttft_p99_ms,
            r.tpot_p50_ms,
            opt(r.tpot_p95_ms, 1),
            r.tpot_p99_ms,
            r.latency_mean_ms,
            opt(r.latency_p95_ms, 0),
            opt(r.itl_p95_ms, 1),
            r.slo_attainment
                .map_or("–".into(), |a| format!("{:.1}%", 100.0 * a)),
            r.mean_batch,
            r.preemptions,
            r.pauses.map_or("–".into(), |p| p.to_string()),
            opt(r.padding_pct, 1)
        );
    }
    md.push('\n');
    md.push_str(&speculation_table(rows));
    md
}

/// Each speculative row against the row without speculation at the same model, load and
/// mode (same requests, same offered rate): throughput and TPOT p50 / p99 as ratios.
fn speculation_table(rows: &[ServingRow]) -> String {
    let plain = |r: &ServingRow| {
        rows.iter()
            .find(|o| o.spec == "off" && o.model == r.model && o.load == r.load && o.mode == r.mode)
    };
    let pairs: Vec<(&ServingRow, &ServingRow)> = rows
        .iter()
        .filter(|r| !r.spec.is_empty() && r.spec != "off" && r.head.status == "ok")
        .filter_map(|r| plain(r).map(|p| (r, p)))
        .collect();
    if pairs.is_empty() {
        return String::new();
    }
    let mut md = String::from("## Speculation inside the engine against the same engine without it\n\n| model | load | mode | spec | accepted | tokens/s × | TPOT p50 ÷ | TPOT p99 ÷ |\n|---|---|---|---|---|---|---|---|\n");
    for (r, p) in pairs {
        let _ = writeln!(
            md,
            "| {} | {:.2} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            r.model,
            r.load,
            r.mode,
            r.spec,
            r.spec_acceptance
                .map_or("–".into(), |a| format!("{:.0}%", 100.0 * a)),
            r.throughput_tok_s / p.throughput_tok_s,
            p.tpot_p50_ms / r.tpot_p50_ms,
            p.tpot_p99_ms / r.tpot_p99_ms
        );
    }
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(id: u64, arrival: f64, times: &[f64]) -> Finished {
        Finished {
            id,
            prompt_len: 4,
            generated: vec![1; times.len()],
            arrival,
            first_token: times[0],
            done: *times.last().unwrap(),
            preemptions: 0,
            token_times: times.to_vec(),
        }
    }

    #[test]
    fn percentiles_gaps_and_attainment() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&mut v, 0.5), 3.0);
        assert_eq!(percentile(&mut v, 0.95), 5.0);
        assert!(percentile(&mut [], 0.5).is_nan());
        let done = [
            finished(0, 0.0, &[0.1, 0.2, 0.3]),
            finished(1, 0.1, &[0.5, 0.9]),
        ];
        let s = summarise(&done, Some(0.15));
        // Gaps 0.1, 0.1, 0.4: two of three within 150 ms.
        assert!((s.attainment.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        assert!((s.itl_p95 - 400.0).abs() < 1e-9);
        assert_eq!(s.generated, 5);
        assert!((s.makespan - 0.9).abs() < 1e-12);
        assert!((s.ttft[0] - 400.0).abs() < 1e-9, "{:?}", s.ttft);
        assert!(summarise(&done, None).attainment.is_none());
    }
}
