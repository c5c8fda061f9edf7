//! `harness exp` for the serving family (claims C23, C25): static vs dynamic vs continuous
//! batching (`models::serve::scheduler`) on a real model and a preset, under Poisson arrivals at
//! several offered loads. Load is relative: each model is first run with every request queued
//! at once under continuous batching, which gives its saturated capacity (requests/s) on this
//! machine; the rates are fractions and multiples of it. Step times are measured, the clock
//! between steps is virtual (no idle waiting), every request generates its drawn output length
//! greedily. Reported: throughput, TTFT and TPOT p50/p99, latency, batch size, preemptions.

use crate::error::{HarnessError, Result};
use crate::family::{listed, one_of, ExpFamily, Family};
use crate::provenance::Provenance;
use crate::render::{report, Rendered};
use crate::row::{Head, Row};
use crate::run_files::{ExpRequest, GridValues, RunFiles};
use crate::spec::ExperimentSpec;
use crate::sweep::PointKey;
use models::serve::workload::Workload;
use models::{load, BatchingMode, Engine, Finished, LoadOptions, SchedulerConfig};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

pub const FAMILY: Family = Family {
    name: "serving",
    about: "static, dynamic and continuous batching of a real model under Poisson load",
    variants: || listed("serving", VARIANTS),
    check: None,
    exp: Some(ExpFamily {
        grid_keys: GRID_KEYS,
        variant: |v| one_of("serving", VARIANTS, v),
        run,
        render,
        peers: false,
    }),
    replay: None,
};

/// The variants of this family's experiments.
pub const VARIANTS: &[kernel_common::VariantInfo] = &[kernel_common::VariantInfo::cpu(
    "engine",
    "the continuous-batching engine over the paged KV cache (modes in the grid)",
)];

/// Grid keys a serving (batching) experiment understands.
pub const GRID_KEYS: &[(&str, &str)] = &[
    (
        "model",
        "smollm2 (the fetched GGUF) | a preset | a checkpoint path",
    ),
    (
        "mode",
        "static | dynamic:<window ms> | continuous | continuous-chunked",
    ),
    (
        "load",
        "offered rate as a fraction of the model's saturated capacity",
    ),
    ("requests", "requests per run"),
    ("prompt_mean", "mean prompt tokens (log-normal)"),
    ("output_mean", "mean output tokens (log-normal)"),
    ("max_new", "output length cap"),
    ("max_batch", "sequences per step at most"),
    ("token_budget", "tokens per step (continuous)"),
    ("block_size", "KV block size"),
    ("kv_blocks", "KV blocks in the pool"),
];

/// One model × mode × load. Column names are stable.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ServingCols {
    pub model: String,
    pub mode: String,
    /// Offered rate / saturated capacity.
    pub load: f64,
    pub rate_rps: f64,
    pub capacity_rps: f64,
    pub requests: usize,
    pub max_batch: usize,
    pub token_budget: usize,
    pub generated_tokens: usize,
    pub throughput_tok_s: f64,
    pub completed_rps: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub tpot_p50_ms: f64,
    pub tpot_p99_ms: f64,
    pub latency_mean_ms: f64,
    /// Time-weighted mean of running sequences.
    pub mean_batch: f64,
    pub preemptions: usize,
    pub steps: usize,
    /// Real seconds the run took (step times summed).
    pub busy_s: f64,
}

/// A row: the shared head, these columns, the note.
pub type ServingRow = Row<ServingCols>;

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

struct Summary {
    throughput: f64,
    completed_rps: f64,
    ttft: (f64, f64),
    tpot: (f64, f64),
    latency: f64,
    generated: usize,
    makespan: f64,
}

fn summarise(done: &[Finished]) -> Summary {
    let start = done.iter().map(|f| f.arrival).fold(f64::INFINITY, f64::min);
    let end = done.iter().map(|f| f.done).fold(0.0, f64::max);
    let generated: usize = done.iter().map(|f| f.generated.len()).sum();
    let mut ttft: Vec<f64> = done.iter().map(|f| f.ttft() * 1e3).collect();
    let mut tpot: Vec<f64> = done
        .iter()
        .filter_map(|f| f.tpot())
        .map(|t| t * 1e3)
        .collect();
    let makespan = end - start;
    Summary {
        throughput: generated as f64 / makespan,
        completed_rps: done.len() as f64 / makespan,
        ttft: (percentile(&mut ttft, 0.5), percentile(&mut ttft, 0.99)),
        tpot: (percentile(&mut tpot, 0.5), percentile(&mut tpot, 0.99)),
        latency: done.iter().map(|f| (f.done - f.arrival) * 1e3).sum::<f64>() / done.len() as f64,
        generated,
        makespan,
    }
}

/// Runs a serving experiment.
pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, spec_path, grid) = (req.opts, req.spec, req.spec_path, req.grid.clone());
    let g = GridValues(&grid);
    let model_names = g.strings("model", &["tiny-gqa"]);
    let modes: Vec<(String, BatchingMode)> = g
        .strings(
            "mode",
            &["static", "dynamic:100", "continuous", "continuous-chunked"],
        )
        .into_iter()
        .map(|m| m.parse::<BatchingMode>().map(|b| (m, b)))
        .collect::<std::result::Result<_, _>>()?;
    let loads = g.parsed("load", &["0.5", "1.0", "1.5"], "a load > 0", |x: f64| {
        x > 0.0
    })?;
    let requests = g.one("requests", "48", "a positive integer", |n: usize| n > 0)?;
    let prompt_mean = g.one("prompt_mean", "48", "a mean ≥ 1", |x: f64| x >= 1.0)?;
    let output_mean = g.one("output_mean", "48", "a mean ≥ 1", |x: f64| x >= 1.0)?;
    let max_new = g.one("max_new", "128", "a positive integer", |n: usize| n > 0)?;
    let max_batch = g.one("max_batch", "8", "a positive integer", |n: usize| n > 0)?;
    let token_budget = g.one("token_budget", "256", "a positive integer", |n: usize| {
        n > 0
    })?;
    let block_size = g.one("block_size", "16", "a positive integer", |n: usize| n > 0)?;
    let kv_blocks = g.one("kv_blocks", "512", "a positive integer", |n: usize| n > 0)?;
    let opts_load = LoadOptions {
        attention: "paged".into(),
        ..LoadOptions::default()
    };
    let workload = |rate: f64, vocab: usize| Workload {
        requests,
        prompt_mean,
        output_mean,
        sigma: 0.8,
        max_new,
        system_prompt: 0,
        max_prompt: 4 * prompt_mean.ceil() as usize,
        rate,
        vocab,
        seed: opts.seed,
    };
    let cfg = |mode| SchedulerConfig {
        mode,
        max_batch,
        token_budget,
        num_blocks: kv_blocks,
        block_size,
        prefix_sharing: false,
    };
    // Every model loads and accepts the workload before results/ is touched; a model whose
    // engine would hold more than the memory budget keeps its note instead (its points are
    // skipped), and no engine of it is built.
    let mut loaded = vec![];
    for name in &model_names {
        let model = load(&crate::model_source::resolve_model(name)?, &opts_load)?.model;
        let w = workload(0.0, model.cfg.vocab);
        w.validate().map_err(HarnessError::Usage)?;
        let over = engine_over_budget(&model, &w, cfg(modes[0].1), &opts.mem_budget);
        if over.is_none() {
            Engine::new(&model, cfg(modes[0].1))?.submit(w.requests())?;
        }
        loaded.push((name, model, over));
    }
    let mut run = RunFiles::start(opts, spec, spec_path, grid.clone())?;
    let bar = run.progress_bar(model_names.len() * (1 + modes.len() * loads.len()));
    for (name, model, over) in &loaded {
        let key = |load: f64, mode: &str| {
            PointKey::of(&[("model", name), ("load", &load), ("mode", &mode)])
        };
        let mut keys = loads
            .iter()
            .flat_map(|&load| modes.iter().map(move |(mode, _)| (load, mode)));
        if !keys.any(|(load, mode)| run.owns(&key(load, mode))) {
            continue;
        }
        if let Some(note) = over {
            bar.inc(1);
            for &load in &loads {
                for (label, _) in &modes {
                    if !run.owns(&key(load, label)) {
                        continue;
                    }
                    let row = Row {
                        head: Head {
                            status: "skipped".into(),
                            ..Head::new(
                                &run.run_id,
                                &spec.name,
                                "engine",
                                &opts.device.to_string(),
                                opts.seed,
                            )
                        },
                        cols: ServingCols {
                            model: name.to_string(),
                            mode: label.clone(),
                            load,
                            requests,
                            max_batch,
                            token_budget,
                            ..ServingCols::default()
                        },
                        note: note.clone(),
                    };
                    run.write_point(&key(load, label), [&row])?;
                    bar.inc(1);
                }
            }
            continue;
        }
        let serve = |mode, rate: f64| -> Result<(Engine, f64)> {
            let mut e = Engine::new(model, cfg(mode))?;
            e.submit(workload(rate, model.cfg.vocab).requests())?;
            let t = Instant::now();
            e.run(|_| {})?;
            Ok((e, t.elapsed().as_secs_f64()))
        };
        bar.set_message(format!("{name}: saturated capacity"));
        let (burst, _) = serve(
            BatchingMode::Continuous {
                chunked_prefill: false,
            },
            0.0,
        )?;
        let capacity = summarise(&burst.finished).completed_rps;
        bar.inc(1);
        for &load in &loads {
            for (label, mode) in &modes {
                if !run.owns(&key(load, label)) {
                    continue;
                }
                bar.set_message(format!("{name} {label} load {load}"));
                let rate = load * capacity;
                let (e, busy) = serve(*mode, rate)?;
                let s = summarise(&e.finished);
                let time: f64 = e.steps.iter().map(|st| st.seconds).sum();
                let weighted: f64 = e
                    .steps
                    .iter()
                    .map(|st| st.seconds * (st.running as f64))
                    .sum();
                let row = Row {
                    head: Head {
                        status: if s.makespan > 0.0 { "ok" } else { "fail" }.into(),
                        ..Head::new(
                            &run.run_id,
                            &spec.name,
                            "engine",
                            &opts.device.to_string(),
                            opts.seed,
                        )
                    },
                    cols: ServingCols {
                        model: name.to_string(),
                        mode: label.clone(),
                        load,
                        rate_rps: rate,
                        capacity_rps: capacity,
                        requests,
                        max_batch,
                        token_budget,
                        generated_tokens: s.generated,
                        throughput_tok_s: s.throughput,
                        completed_rps: s.completed_rps,
                        ttft_p50_ms: s.ttft.0,
                        ttft_p99_ms: s.ttft.1,
                        tpot_p50_ms: s.tpot.0,
                        tpot_p99_ms: s.tpot.1,
                        latency_mean_ms: s.latency,
                        mean_batch: weighted / time.max(1e-12),
                        preemptions: e.preemptions,
                        steps: e.steps.len(),
                        busy_s: busy,
                    },
                    note: String::new(),
                };
                run.write_point(&key(load, label), [&row])?;
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, 0, render)
}

/// The memory guard's note when an engine over `model` would hold more than `budget`: the
/// weights (loaded), the paged K/V pool in the model's cache format, the requests' tokens
/// (prompt and output), and a step's activations and logits for up to `token_budget` tokens.
fn engine_over_budget(
    model: &models::Llama,
    w: &Workload,
    cfg: SchedulerConfig,
    budget: &crate::mem_guard::MemBudget,
) -> Option<String> {
    use crate::mem_guard::{human, product};
    let weights = model.held_bytes() as u64;
    let pool = models::KvPools::planned_bytes(model, cfg.num_blocks, cfg.block_size);
    let c = &model.cfg;
    let tokens = cfg.token_budget.max(cfg.max_batch);
    let step = product(&[tokens, c.vocab + 2 * c.d_ff + 8 * c.d_model, 4]);
    let requests = product(&[w.requests, w.max_prompt.saturating_add(w.max_new), 8]);
    let need = weights
        .saturating_add(pool)
        .saturating_add(step)
        .saturating_add(requests);
    let what = format!(
        "weights {}, K/V pool of {} blocks {}, a step's logits and activations {}",
        human(weights),
        cfg.num_blocks,
        human(pool),
        human(step)
    );
    budget.refuse(need, &what)
}

/// This family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<ServingCols>(spec, csv, prov, |_, rows| tables(rows))
}

/// The markdown table of a serving run.
pub fn tables(rows: &[ServingRow]) -> String {
    let mut md = String::from("## Batching modes under Poisson arrivals\n\n| model | load | rate req/s | mode | tokens/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | mean latency ms | mean batch | preemptions |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {:.2} | {:.2} | {} | {:.1} | {:.0} / {:.0} | {:.1} / {:.1} | {:.0} | {:.2} | {} |",
            r.model,
            r.load,
            r.rate_rps,
            r.mode,
            r.throughput_tok_s,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            r.tpot_p50_ms,
            r.tpot_p99_ms,
            r.latency_mean_ms,
            r.mean_batch,
            r.preemptions
        );
    }
    md.push('\n');
    md
}
