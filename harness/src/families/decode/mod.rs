//! `harness exp` for the decode family (claims C1, C27): decode tokens/s of a model at batch
//! 1..32 per weight format against the bandwidth roofline — one step must read every weight
//! once plus each sequence's K/V, so it takes at least (weight bytes + KV bytes) / the read
//! bandwidth measured at the start of the run — and the time of one long prompt (prefill,
//! the time to first token). Each batched step is checked against batch-1 logits of the same
//! sequence.

use crate::error::{HarnessError, Result};
use crate::family::{listed, one_of, ExpFamily, Family};
use crate::measure::Timing;
use crate::model_source::resolve_model;
use crate::provenance::Provenance;
use crate::render::{report, Rendered};
use crate::row::{Head, Row};
use crate::run_files::{ExpRequest, GridValues, RunFiles};
use crate::spec::ExperimentSpec;
use crate::sweep::PointKey;
use models::{argmax, load, KvPools, Llama, LoadOptions, SeqChunk, Session};
use quant_kernels::WeightFormat;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

pub const FAMILY: Family = Family {
    name: "decode",
    about: "model decode and prefill against the weight-bandwidth roofline",
    variants: || listed("decode", VARIANTS),
    check: None,
    exp: Some(ExpFamily {
        grid_keys: GRID_KEYS,
        variant: |v| one_of("decode", VARIANTS, v),
        run,
        render,
        peers: false,
    }),
    replay: None,
};

/// The variants of this family's experiments.
pub const VARIANTS: &[kernel_common::VariantInfo] = &[kernel_common::VariantInfo::cpu(
    "model",
    "the generation pipeline's forward pass (weights and product in the grid)",
)];

/// Grid keys a decode (roofline) experiment understands.
pub const GRID_KEYS: &[(&str, &str)] = &[
    (
        "model",
        "smollm2 (the fetched GGUF) | a preset | a checkpoint path",
    ),
    (
        "weights",
        "native | f32 | f16 | q8_0 | q4_0 | q4_1 | sym4g32 ...",
    ),
    (
        "matmul",
        "fused | fused:act=q8 (int8 activations; skipped for formats it does not take)",
    ),
    ("batch", "sequences decoded per step"),
    ("context", "prompt tokens before the timed steps"),
    ("steps", "timed decode steps"),
    (
        "prefill_tokens",
        "prompt length of the prefill (time to first token) row",
    ),
];

/// One model × weights × phase × batch. Column names are stable.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DecodeCols {
    pub model: String,
    pub weights: String,
    /// The projection product (fused, fused:act=q8). (Absent from the first runs: fused.)
    #[serde(default = "fused")]
    pub matmul: String,
    /// decode | prefill
    pub phase: String,
    pub batch: usize,
    /// Tokens in each sequence's context at the timed steps (decode), or the prompt (prefill).
    pub context: usize,
    pub weight_mb: f64,
    pub kv_mb: f64,
    /// Generated tokens per second (decode: batch / step time; prefill: prompt / time).
    pub tokens_per_s: f64,
    pub bandwidth_gbs: f64,
    /// (weight + KV bytes) / bandwidth.
    pub roofline_ms: f64,
    pub pct_of_roofline: f64,
    /// (weight + KV bytes) / measured time.
    pub effective_gbs: f64,
    pub gflops: f64,
    /// max |Δ| / max |logit| of sequence 0 against a batch-1 session (decode, batch > 1).
    pub rel_err_vs_batch1: Option<f64>,
}

/// A row: the shared head, these columns, the note.
pub type DecodeRow = Row<DecodeCols>;

fn fused() -> String {
    "fused".into()
}

fn prompt(seq: usize, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7919 + seq * 104_729 + 13) % vocab) as u32)
        .collect()
}

/// Times `steps` decode steps of `batch` sequences after a `context`-token prompt each.
fn decode_times(
    m: &Llama,
    batch: usize,
    context: usize,
    steps: usize,
) -> Result<(Timing, Option<f64>)> {
    let bs = 16;
    let per_seq = (context + steps + 1).div_ceil(bs);
    let mut kv = KvPools::new(m, batch * per_seq, bs)?;
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|s| prompt(s, context, m.cfg.vocab))
        .collect();
    let mut last: Vec<u32> = vec![];
    for (p, t) in prompts.iter().zip(&tables) {
        let chunk = SeqChunk {
            tokens: p,
            start: 0,
            table: t,
            all_logits: false,
            tree: None,
        };
        last.push(argmax(&m.forward(&mut kv, &[chunk])?[0]));
    }
    // Batch-1 reference for sequence 0's first decode step.
    let reference = if batch > 1 {
        let mut s = Session::new(m, context + 1, bs)?;
        s.forward(&prompts[0])?;
        Some(s.forward(&[last[0]])?)
    } else {
        None
    };
    let mut samples = vec![];
    let mut err = None;
    for step in 0..steps {
        let toks: Vec<[u32; 1]> = last.iter().map(|&t| [t]).collect();
        let chunks: Vec<SeqChunk> = toks
            .iter()
            .zip(&tables)
            .map(|(t, table)| SeqChunk {
                tokens: t,
                start: context + step,
                table,
                all_logits: false,
                tree: None,
            })
            .collect();
        let t0 = Instant::now();
        let logits = m.forward(&mut kv, &chunks)?;
        samples.push(t0.elapsed().as_secs_f64());
        if step == 0 {
            if let Some(r) = &reference {
                let scale = r.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let d = r
                    .iter()
                    .zip(&logits[0])
                    .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
                err = Some((d / scale) as f64);
            }
        }
        last = logits.iter().map(|l| argmax(l)).collect();
    }
    Ok((Timing { samples }, err))
}

/// Runs a decode experiment.
pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, spec_path, grid) = (req.opts, req.spec, req.spec_path, req.grid.clone());
    let g = GridValues(&grid);
    let model_names = g.strings("model", &["tiny-gqa"]);
    let weights = g.strings("weights", &["f32"]);
    let matmuls = g
        .strings("matmul", &["fused"])
        .iter()
        .map(|v| crate::registry::quant_variant(v))
        .collect::<Result<Vec<_>>>()?;
    let batches = g.counts("batch", &["1", "8"])?;
    let context = g.one("context", "64", "a positive integer", |n: usize| n > 0)?;
    let steps = g.one("steps", "16", "a positive integer", |n: usize| n > 0)?;
    let prefill = g.parsed("prefill_tokens", &["512"], "a token count", |_: usize| true)?;
    let paths = model_names
        .iter()
        .map(|m| resolve_model(m))
        .collect::<Result<Vec<_>>>()?;
    // Every model, length and weight format is checked before results/ is touched.
    for (name, path) in model_names.iter().zip(&paths) {
        let cfg = load(path, &LoadOptions::default())?.model.cfg;
        if let Some(p) = prefill.iter().find(|&&p| p == 0 || p > cfg.context) {
            return Err(HarnessError::Usage(format!(
                "prefill_tokens {p} is outside 1..={} ({name}'s context)",
                cfg.context
            )));
        }
        if context + steps + 1 > cfg.context {
            return Err(HarnessError::Usage(format!(
                "context {context} + {steps} steps exceed {name}'s context of {}",
                cfg.context
            )));
        }
        for w in weights.iter().filter(|w| *w != "native") {
            let f = WeightFormat::parse(w)?;
            for cols in [cfg.d_model, cfg.q_dim(), cfg.d_ff] {
                f.validate(cols)
                    .map_err(|e| HarnessError::Usage(format!("weights {w} for {name}: {e}")))?;
            }
        }
    }
    let mut run = RunFiles::start(opts, spec, spec_path, grid.clone())?;
    let bw = run.roof.read_gbps;
    let total = model_names.len() * weights.len() * matmuls.len() * (batches.len() + prefill.len());
    let bar = run.progress_bar(total);
    let mut failures = 0;
    for (name, path) in model_names.iter().zip(&paths) {
        for w in &weights {
            let key = |matmul: &str| {
                PointKey::of(&[("model", name), ("weights", w), ("matmul", &matmul)])
            };
            if !matmuls.iter().any(|(mname, _)| run.owns(&key(mname))) {
                continue;
            }
            bar.set_message(format!("{name} {w}: loading"));
            let lopts = LoadOptions {
                attention: "paged".into(),
                weights: (w != "native")
                    .then(|| WeightFormat::parse(w))
                    .transpose()?,
                ..LoadOptions::default()
            };
            let mut m = load(path, &lopts)?.model;
            for (mname, variant) in &matmuls {
                if !run.owns(&key(mname)) {
                    continue;
                }
                // A product that takes none of the model's formats would only repeat `fused`.
                let format = m.layers[0].wo.format();
                if quant_kernels::supports(*variant, format).is_err() {
                    bar.inc((batches.len() + prefill.len()) as u64);
                    continue;
                }
                m.set_matmul(*variant)?;
                let m = &m;
                let wbytes = m.weight_bytes() as f64;
                let kv_token = 2.0 * (m.cfg.layers * m.cfg.kv_dim() * 4) as f64;
                let flops_token = 2.0 * (wbytes / bytes_per_param(m)).max(1.0);
                let mut rows = vec![];
                let mut row = |phase: &str,
                               batch: usize,
                               ctx: usize,
                               t: &Timing,
                               tokens: usize,
                               kv_bytes: f64,
                               err: Option<f64>|
                 -> Result<()> {
                    let med = t.median();
                    let roof = (wbytes + kv_bytes) / (bw * 1e9);
                    let ok = err.is_none_or(|e| e <= 1e-3);
                    failures += usize::from(!ok);
                    rows.push(Row {
                        head: Head {
                            reps: t.samples.len(),
                            median_ms: Some(med * 1e3),
                            p10_ms: Some(t.percentile(10.0) * 1e3),
                            p90_ms: Some(t.percentile(90.0) * 1e3),
                            status: if ok { "ok" } else { "fail" }.into(),
                            ..Head::new(
                                &run.run_id,
                                &spec.name,
                                "model",
                                &opts.device.to_string(),
                                opts.seed,
                            )
                        },
                        cols: DecodeCols {
                            model: name.clone(),
                            weights: w.clone(),
                            matmul: mname.clone(),
                            phase: phase.into(),
                            batch,
                            context: ctx,
                            weight_mb: wbytes / 1e6,
                            kv_mb: kv_bytes / 1e6,
                            tokens_per_s: tokens as f64 / med,
                            bandwidth_gbs: bw,
                            roofline_ms: roof * 1e3,
                            pct_of_roofline: 100.0 * roof / med,
                            effective_gbs: (wbytes + kv_bytes) / med / 1e9,
                            gflops: flops_token * tokens as f64 / med / 1e9,
                            rel_err_vs_batch1: err,
                        },
                        note: String::new(),
                    });
                    Ok(())
                };
                for &b in &batches {
                    bar.set_message(format!("{name} {w}: decode batch {b}"));
                    let (t, err) = decode_times(m, b, context, steps)?;
                    let kv = kv_token * (b * (context + steps / 2)) as f64;
                    row("decode", b, context, &t, b, kv, err)?;
                    bar.inc(1);
                }
                for &p in &prefill {
                    bar.set_message(format!("{name} {w}: prefill {p}"));
                    let ids = prompt(0, p, m.cfg.vocab);
                    let mut samples = vec![];
                    for _ in 0..2 {
                        let mut s = Session::new(m, p, 16)?;
                        let t0 = Instant::now();
                        s.forward(&ids)?;
                        samples.push(t0.elapsed().as_secs_f64());
                    }
                    row(
                        "prefill",
                        1,
                        p,
                        &Timing { samples },
                        p,
                        kv_token * p as f64,
                        None,
                    )?;
                    bar.inc(1);
                }
                run.write_point(&key(mname), &rows)?;
            }
        }
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, failures, render)
}

/// Bytes per parameter of the model's projections (parameters ≈ weight bytes / this; 2 FLOPs
/// per parameter and token).
fn bytes_per_param(m: &Llama) -> f64 {
    m.layers
        .first()
        .map_or(4.0, |l| l.wo.format().bits_per_weight() / 8.0)
}

/// This family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<DecodeCols>(spec, csv, prov, |_, rows| tables(rows))
}

/// The markdown table of a decode run.
pub fn tables(rows: &[DecodeRow]) -> String {
    let mut md = String::from("## Decode and prefill against the bandwidth roofline\n\n| model | weights | matmul | phase | batch | context | weight MB | median ms | tokens/s | roofline ms | % of roofline | effective GB/s | rel err vs batch 1 |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1}% | {:.1} | {} |",
            r.model,
            r.weights,
            r.matmul,
            r.phase,
            r.batch,
            r.context,
            r.weight_mb,
            r.head.median_ms.unwrap_or(f64::NAN),
            r.tokens_per_s,
            r.roofline_ms,
            r.pct_of_roofline,
            r.effective_gbs,
            crate::render::fmt_err(r.rel_err_vs_batch1)
        );
    }
    md.push('\n');
    md
}
