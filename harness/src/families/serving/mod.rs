//! `harness exp` for the serving family (claims C23, C25, C26): batching modes
//! (`models::serve::scheduler`: static, dynamic, continuous, its prefill-first ablation,
//! padded static batches FIFO or length-sorted) on a real model and a preset, under Poisson
//! arrivals at several offered loads, optionally with the latency objective that pauses long
//! sequences, and optionally with speculative decoding inside the engine (`spec`: each
//! decoding sequence's n-gram or suffix draft chain verified in the shared batch). Load is relative: each model is first run with every request queued at once
//! under continuous batching, which gives its saturated capacity (requests/s) and its median
//! step time on this machine; rates are fractions and multiples of the capacity, objectives
//! multiples of the step time. Step times are measured, the clock between steps is virtual (no
//! idle waiting), every request generates its drawn output length greedily. Reported:
//! throughput, TTFT / TPOT / latency percentiles, inter-token gaps and the share within the
//! objective, batch size, preemptions, pauses, padding.

/// The row columns and their summary of a run.
pub mod cols;

use crate::error::{HarnessError, Result};
use crate::family::{listed, one_of, ExpFamily, Family};
use crate::provenance::Provenance;
use crate::render::{report, Rendered};
use crate::row::{Head, Row};
use crate::run_files::{ExpRequest, GridValues, RunFiles};
use crate::spec::ExperimentSpec;
use crate::sweep::PointKey;
use crate::texts::Text;
use cols::{percentile, summarise, tables, ServingCols};
use models::serve::scheduler::SloPolicy;
use models::serve::workload::Workload;
use models::speculative::chain::EngineSpec;
use models::{load, BatchingMode, Engine, SchedulerConfig};
use std::collections::HashMap;
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
    cuda: &[],
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
        "static | dynamic:<window ms> | continuous | continuous-chunked | continuous-prefill-first | static-padded | static-sorted",
    ),
    (
        "preempt",
        "off | slo (pause sequences > 2x the batch mean while the step-time p95 breaks the objective)",
    ),
    (
        "slo",
        "the latency objective as a multiple of the saturated run's median step time",
    ),
    (
        "load",
        "offered rate as a fraction of the model's saturated capacity",
    ),
    (
        "spec",
        "off | ngram[:N][:k=K] | suffix[:D][:k=K][:global][:factor=F][:min_prob=P]: speculative decoding inside the engine, each decoding sequence's draft chain verified in the shared batch (global: SuffixDecoding's tree of finished requests' outputs too)",
    ),
    (
        "text",
        "random (random-token prompts) | gpl3 | licenses | rust | seeds | a UTF-8 file: prompts cut from the text's tokens at seeded offsets (one value per run)",
    ),
    (
        "matmul",
        "the projections' product: fused (default; f32 activations) | packed | fused:act=q8 (one value per run)",
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

/// Steps the objective's p95 is taken over, and the length factor of a long sequence.
const SLO_WINDOW: usize = 32;
const SLO_FACTOR: f64 = 2.0;

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
    // The objective's axes are keys of the point only when the grid names them (older
    // batching specs keep their point keys).
    let with_slo = grid.contains_key("preempt") || grid.contains_key("slo");
    let preempts = g.strings("preempt", &["off"]);
    if let Some(p) = preempts
        .iter()
        .find(|p| !["off", "slo"].contains(&p.as_str()))
    {
        return Err(HarnessError::Usage(format!(
            "preempt '{p}' is not off or slo"
        )));
    }
    let slos: Vec<Option<f64>> = if with_slo {
        g.parsed(
            "slo",
            &["2"],
            "a multiple > 0 of the step time",
            |x: f64| x > 0.0 && x.is_finite(),
        )?
        .into_iter()
        .map(Some)
        .collect()
    } else {
        vec![None]
    };
    // Speculation is a key of the point only when the grid names it (older specs keep theirs).
    let with_spec = grid.contains_key("spec");
    let specs: Vec<(String, Option<EngineSpec>)> = g
        .strings("spec", &["off"])
        .into_iter()
        .map(|s| match s.as_str() {
            "off" => Ok((s, None)),
            text => EngineSpec::parse(text)
                .map(|e| (e.label(), Some(e)))
                .map_err(|e| HarnessError::Usage(e.to_string())),
        })
        .collect::<Result<_>>()?;
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
    let text = g.one_string("text", "random")?;
    let matmul = g.one_string("matmul", "fused")?;
    let opts_load = crate::load_flags::LoadFlags {
        attention: Some("paged".into()),
        matmul: Some(matmul.clone()),
        ..Default::default()
    }
    .options()?;
    let text = match text.as_str() {
        "random" => None,
        name => Some(Text::resolve(
            name,
            crate::workspace::root().ok().as_deref(),
        )?),
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
        let l = load(&crate::model_source::resolve_model(name)?, &opts_load)?;
        // The text's tokens in the model's tokenizer (a preset without one: its bytes,
        // folded into the vocabulary, as kv_precision does).
        let corpus: Option<Vec<u32>> = match (&text, &l.tokenizer) {
            (None, _) => None,
            (Some(t), Some(tok)) => Some(tok.encode(&t.content)?),
            (Some(t), None) => Some(
                t.content
                    .bytes()
                    .map(|b| b as u32 % l.model.cfg.vocab as u32)
                    .collect(),
            ),
        };
        let model = l.model;
        let w = workload(0.0, model.cfg.vocab);
        w.validate().map_err(HarnessError::Usage)?;
        let over = engine_over_budget(&model, &w, cfg(modes[0].1), &opts.mem_budget);
        if over.is_none() {
            Engine::new(&model, cfg(modes[0].1))?.submit(w.requests_from(corpus.as_deref()))?;
        }
        loaded.push((name, model, over, corpus));
    }
    let text_name = text
        .as_ref()
        .map_or("random".to_string(), |t| t.name.clone());
    let mut points = vec![];
    for &load in &loads {
        for (label, mode) in &modes {
            for p in &preempts {
                for &slo in &slos {
                    for sp in &specs {
                        points.push((load, label.clone(), *mode, p.clone(), slo, sp.clone()));
                    }
                }
            }
        }
    }
    let mut run = RunFiles::start(opts, spec, spec_path, grid.clone())?;
    let bar = run.progress_bar(model_names.len() * (1 + points.len()));
    for (name, model, over, corpus) in &loaded {
        let key = |load: f64, mode: &str, preempt: &str, slo: Option<f64>, sp: &str| {
            let mut k: Vec<(&str, &dyn std::fmt::Display)> =
                vec![("model", name), ("load", &load), ("mode", &mode)];
            let x;
            if let (Some(v), true) = (slo, with_slo) {
                x = v;
                k.extend([("preempt", &preempt as &dyn std::fmt::Display), ("slo", &x)]);
            }
            if with_spec {
                k.push(("spec", &sp));
            }
            PointKey::of(&k)
        };
        if !points
            .iter()
            .any(|(l, m, _, p, s, sp)| run.owns(&key(*l, m, p, *s, &sp.0)))
        {
            continue;
        }
        let heads = run.heads.clone();
        let head = |status: &str| Head {
            status: status.into(),
            ..heads.head("engine", opts.seed)
        };
        if let Some(note) = over {
            bar.inc(1);
            for (load, label, _, preempt, slo, sp) in &points {
                let k = key(*load, label, preempt, *slo, &sp.0);
                if !run.owns(&k) {
                    continue;
                }
                let row = Row {
                    head: head("skipped"),
                    cols: ServingCols {
                        model: name.to_string(),
                        mode: label.clone(),
                        load: *load,
                        preempt: preempt.clone(),
                        slo: *slo,
                        requests,
                        max_batch,
                        token_budget,
                        spec: sp.0.clone(),
                        text: text_name.clone(),
                        matmul: matmul.clone(),
                        ..ServingCols::default()
                    },
                    note: note.clone(),
                };
                run.write_point(&k, [&row])?;
                bar.inc(1);
            }
            continue;
        }
        let serve = |mode, rate: f64, slo: Option<f64>, sp: Option<EngineSpec>| {
            let mut e = Engine::new(model, cfg(mode))?;
            if let Some(sp) = sp {
                e = e.with_speculation(sp.speculation(model.cfg.vocab))?;
            }
            if let Some(objective_s) = slo {
                e = e.with_slo(SloPolicy {
                    objective_s,
                    window: SLO_WINDOW,
                    factor: SLO_FACTOR,
                })?;
            }
            e.submit(workload(rate, model.cfg.vocab).requests_from(corpus.as_deref()))?;
            let t = Instant::now();
            e.run(|_| {})?;
            Result::Ok((e, t.elapsed().as_secs_f64()))
        };
        bar.set_message(format!("{name}: saturated capacity"));
        let (burst, _) = serve(
            BatchingMode::Continuous {
                chunked_prefill: false,
            },
            0.0,
            None,
            None,
        )?;
        let capacity = summarise(&burst.finished, None).completed_rps;
        let mut step_times: Vec<f64> = burst.steps.iter().map(|s| s.seconds).collect();
        let step_median = percentile(&mut step_times, 0.5);
        bar.inc(1);
        // A run without preemption does not depend on the objective: run once, judge per slo.
        let mut plain: HashMap<(String, u64, String), (Engine, f64)> = HashMap::new();
        for (load, label, mode, preempt, slo, sp) in &points {
            let k = key(*load, label, preempt, *slo, &sp.0);
            if !run.owns(&k) {
                continue;
            }
            bar.set_message(format!(
                "{name} {label} load {load} preempt {preempt} spec {}",
                sp.0
            ));
            let rate = load * capacity;
            let objective = slo.map(|x| x * step_median);
            let fresh;
            let (e, busy) = if preempt == "slo" {
                fresh = serve(*mode, rate, objective, sp.1)?;
                (&fresh.0, fresh.1)
            } else {
                let id = (label.clone(), load.to_bits(), sp.0.clone());
                if !plain.contains_key(&id) {
                    plain.insert(id.clone(), serve(*mode, rate, None, sp.1)?);
                }
                let (e, busy) = &plain[&id];
                (e, *busy)
            };
            let s = summarise(&e.finished, objective);
            let time: f64 = e.steps.iter().map(|st| st.seconds).sum();
            let weighted: f64 = e
                .steps
                .iter()
                .map(|st| st.seconds * (st.running as f64))
                .sum();
            let all_tokens: usize = e.steps.iter().map(|st| st.tokens).sum();
            let padded = e.padding.prefill + e.padding.decode;
            let row = Row {
                head: head(if s.makespan > 0.0 { "ok" } else { "fail" }),
                cols: ServingCols {
                    model: name.to_string(),
                    mode: label.clone(),
                    load: *load,
                    preempt: preempt.clone(),
                    slo: *slo,
                    slo_ms: objective.map(|o| o * 1e3),
                    step_median_ms: Some(step_median * 1e3),
                    rate_rps: rate,
                    capacity_rps: capacity,
                    requests,
                    max_batch,
                    token_budget,
                    generated_tokens: s.generated,
                    throughput_tok_s: s.throughput,
                    completed_rps: s.completed_rps,
                    ttft_p50_ms: s.ttft[0],
                    ttft_p95_ms: Some(s.ttft[1]),
                    ttft_p99_ms: s.ttft[2],
                    tpot_p50_ms: s.tpot[0],
                    tpot_p95_ms: Some(s.tpot[1]),
                    tpot_p99_ms: s.tpot[2],
                    latency_mean_ms: s.latency_mean,
                    latency_p95_ms: Some(s.latency[0]),
                    latency_p99_ms: Some(s.latency[1]),
                    itl_p95_ms: Some(s.itl_p95),
                    slo_attainment: s.attainment,
                    mean_batch: weighted / time.max(1e-12),
                    preemptions: e.preemptions,
                    pauses: Some(e.pauses),
                    padding_pct: Some(100.0 * padded as f64 / all_tokens.max(1) as f64),
                    prompt_padding_pct: Some({
                        let prompts: usize = e.finished.iter().map(|f| f.prompt_len).sum();
                        let pad = e.padding.prefill as f64;
                        100.0 * pad / (pad + prompts as f64).max(1.0)
                    }),
                    steps: e.steps.len(),
                    busy_s: busy,
                    spec: sp.0.clone(),
                    spec_acceptance: sp.1.map(|_| e.spec_stats.acceptance_rate()),
                    text: text_name.clone(),
                    matmul: matmul.clone(),
                },
                note: String::new(),
            };
            run.write_point(&k, [&row])?;
            bar.inc(1);
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
