//! `harness exp` for the decode family (claims C1, C27): decode tokens/s of a model at batch
//! 1..32 per weight format against the bandwidth roofline — one step must read every weight
//! once plus each sequence's K/V, so it takes at least (weight bytes + KV bytes) / the read
//! bandwidth measured at the start of the run — and the time of one long prompt (prefill,
//! the time to first token). Each batched step is checked against batch-1 logits of the same
//! sequence. Decode runs in passes over the batch list (`rounds`), each batch then each peer
//! at it once a pass, so every batch's samples span the whole run. With `verify_tokens`, also
//! the k-token forward step of one sequence (a speculative verification pass, all k logits)
//! against the 1-token step: its cost in decode steps beside the roofline's prediction
//! (experiment verify_cost), each checked against the same tokens decoded one at a time.

use crate::error::{HarnessError, Result};
use crate::family::{listed, one_of, ExpFamily, Family};
use crate::measure::Timing;
use crate::model_source::resolve_model;
use crate::provenance::Provenance;
use crate::render::{report, Rendered};
use crate::run_files::{ExpRequest, GridValues, RunFiles};
use crate::spec::ExperimentSpec;
use crate::sweep::PointKey;
use kernel_quant::{MatVecVariant, WeightFormat};
use models::speculative::cost::ScratchStep;
use models::{argmax, load, KvPools, Llama, LoadOptions, SeqChunk, Session};
use peers::{DecodePeers, PeerPoint};
pub use rows::{DecodeCols, DecodeRow};
use rows::{Phase, RowCtx};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// The check of a decode peer's greedy tokens against our model.
mod peer_check;
/// Peers of decode experiments: llama.cpp's llama-bench.
mod peers;
/// The rows of decode experiments.
pub mod rows;

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
        peers: true,
    }),
    cuda: &[],
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
    (
        "kv_cache",
        "the KV cache's format, one per run, as `harness generate --kv-cache`: f32 (default), f16 (what llama.cpp stores by default), bf16, int8, fp8, ...",
    ),
    ("context", "prompt tokens before the timed steps"),
    ("steps", "timed decode steps per pass"),
    (
        "rounds",
        "passes over the batch list, one per run (default 3 where a peer runs, else 1): each pass times every batch once (then the peers at it), so a batch's samples come from every pass and drift on a shared machine falls on all batches alike",
    ),
    (
        "prefill_tokens",
        "prompt length of the prefill (time to first token) row",
    ),
    (
        "verify_tokens",
        "tokens k of one sequence's multi-token step after the context (a verification pass); 1 must be among them (the plain decode step; each k > 1 step is costed against 1-token steps timed beside it)",
    ),
];

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
            verify: false,
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
                verify: false,
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

/// Times `reps` k-token forward steps of one sequence after a `context`-token prompt (every
/// token's logits, as a verification pass asks), rewriting the same positions each time, and
/// returns, for k > 1, max |Δ| / max |logit| of those logits against the same tokens decoded
/// one at a time and at how many of the k positions their top-1 tokens agree. For k > 1 each
/// k-token step follows a 1-token step at the same position, timed into `paired`: the unit
/// of the k-token step's cost is measured beside it, not minutes earlier (this shared VM's
/// speed drifts by ±20% between runs, and the k = 1 row's time was once the unit for all).
fn verify_times(
    m: &Llama,
    context: usize,
    k: usize,
    reps: usize,
    paired: &mut Vec<f64>,
) -> Result<(Timing, Option<(f64, usize)>)> {
    let bs = 16;
    let ids = prompt(0, context + k, m.cfg.vocab);
    let mut seq = ScratchStep::new(m, ids.clone(), context)?;
    let (mut samples, mut logits) = (vec![], vec![]);
    for _ in 0..reps {
        if k > 1 {
            paired.push(seq.step(1)?.0);
        }
        let (secs, l) = seq.step(k)?;
        samples.push(secs);
        logits = l;
    }
    let err = if k > 1 {
        let mut s = Session::new(m, context + k, bs)?;
        s.forward(&ids[..context])?;
        let (mut worst, mut same_top1) = (0.0f64, 0);
        for (i, &t) in ids[context..].iter().enumerate() {
            let r = s.forward(&[t])?;
            let got = &logits[i * m.cfg.vocab..(i + 1) * m.cfg.vocab];
            let scale = r.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let d = r
                .iter()
                .zip(got)
                .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
            worst = worst.max((d / scale) as f64);
            same_top1 += usize::from(argmax(&r) == argmax(got));
        }
        Some((worst, same_top1))
    } else {
        None
    };
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
    let rounds_set: Option<usize> = match grid.contains_key("rounds") {
        true => Some(g.one("rounds", "1", "a positive integer", |n: usize| n > 0)?),
        false => None,
    };
    let prefill = g.parsed("prefill_tokens", &["512"], "a token count", |_: usize| true)?;
    let kv_spec = g.one_string("kv_cache", "f32")?;
    let kv_format = kernel_paged::KvCacheFormat::parse(&kv_spec)
        .map_err(|e| HarnessError::Usage(format!("kv_cache '{kv_spec}': {e}")))?;
    let mut verify = g.parsed(
        "verify_tokens",
        &[],
        "a positive token count",
        |n: usize| n > 0,
    )?;
    verify.sort_unstable();
    verify.dedup();
    if !verify.is_empty() && verify[0] != 1 {
        return Err(HarnessError::Usage(
            "verify_tokens must include 1: the decode step the other steps are costed against"
                .into(),
        ));
    }
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
        if let Some(k) = verify.last().filter(|&&k| context + k > cfg.context) {
            return Err(HarnessError::Usage(format!(
                "context {context} + verify_tokens {k} exceed {name}'s context of {}",
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
    let mut peers = DecodePeers::start(req, &run.run_id)?;
    let (bw, fma) = (run.roof.read_gbps, run.roof.fma_gflops);
    let points = batches.len() + prefill.len() + verify.len();
    let native = weights.iter().filter(|w| *w == "native").count();
    let peer_rows = peers.len() * model_names.len() * native * points;
    let bar =
        run.progress_bar(model_names.len() * weights.len() * matmuls.len() * points + peer_rows);
    let mut failures = 0;
    let heads = run.heads.clone();
    for (name, path) in model_names.iter().zip(&paths) {
        for w in &weights {
            // A point is a (model, weights): every product and the peers' rounds beside them.
            let key = PointKey::of(&[("model", name), ("weights", w)]);
            if !run.owns(&key) {
                continue;
            }
            let mut rows = vec![];
            bar.set_message(format!("{name} {w}: loading"));
            let lopts = crate::load_flags::LoadFlags {
                attention: Some("paged".into()),
                weights: Some(w.to_string()),
                kv_cache: Some(kv_spec.clone()),
                ..Default::default()
            }
            .options()?;
            let loaded = load(path, &lopts)?;
            let (mut m, tokenizer) = (loaded.model, loaded.tokenizer);
            // K and V bytes per token of context over all layers, in the cache's format.
            let kv_token = m.cfg.layers as f64
                * kv_format.bytes_per_token(context, m.cfg.kv_heads, m.cfg.head_dim, 16);
            let ctx_for = |m: &Llama| {
                let wbytes = m.weight_bytes() as f64;
                RowCtx {
                    heads: &heads,
                    seed: opts.seed,
                    model: name,
                    weights: w,
                    wbytes,
                    bw,
                    flops_token: 2.0 * (wbytes / bytes_per_param(m)).max(1.0),
                }
            };
            let decode_phase = |b: usize| Phase {
                name: "decode",
                batch: b,
                context,
                tokens: b,
                kv_bytes: kv_token * (b * (context + steps / 2)) as f64,
            };
            let prefill_phase = |p: usize| Phase {
                name: "prefill",
                batch: 1,
                context: p,
                tokens: p,
                kv_bytes: kv_token * p as f64,
            };
            let verify_phase = |k: usize| Phase {
                name: "verify",
                batch: 1,
                context,
                tokens: k,
                kv_bytes: kv_token * (context + k) as f64,
            };
            // The peers run the file as shipped: they serve the native weights only.
            let mut slots = if w == "native" {
                bar.set_message(format!("{name}: asking the peers"));
                let pts: Vec<PeerPoint> = batches
                    .iter()
                    .map(|&b| PeerPoint::decode(b, context, steps))
                    .chain(prefill.iter().map(|&p| PeerPoint::prefill(p)))
                    .chain(verify.iter().map(|&k| PeerPoint::verify(k, context)))
                    .collect();
                peers.slots(path, &pts, (&mut m, tokenizer.as_ref()))
            } else {
                vec![]
            };
            // The model's weight formats (the products change their layout, not their format).
            let formats: std::collections::BTreeMap<String, WeightFormat> = m
                .layers
                .iter()
                .flat_map(|l| l.projections())
                .flat_map(|p| p.parts.iter().map(|w| w.format()))
                .map(|f| (f.to_string(), f))
                .collect();
            for (mname, variant) in &matmuls {
                // A product that takes none of the model's formats would only repeat `fused`:
                // its points are `skipped` rows that say so (a mix such as Q5_K_M's Q5_1 and
                // Q6_K runs where any layer's weights take it, the rest on their fallback).
                if !formats
                    .values()
                    .any(|&f| kernel_quant::supports(*variant, f).is_ok())
                {
                    let ctx = ctx_for(&m);
                    let names: Vec<&str> = formats.keys().map(String::as_str).collect();
                    let note = format!(
                        "{mname} takes none of this model's weight formats ({}); it would \
                         repeat their fallback product",
                        names.join(", ")
                    );
                    let phases = batches.iter().map(|&b| decode_phase(b));
                    let phases = phases
                        .chain(prefill.iter().map(|&p| prefill_phase(p)))
                        .chain(verify.iter().map(|&k| verify_phase(k)));
                    for phase in phases {
                        rows.push(ctx.skipped("model", mname, &phase, note.clone()));
                    }
                    bar.inc(points as u64);
                    continue;
                }
                m.set_matmul(*variant)?;
                let m = &m;
                let ctx = ctx_for(m);
                // Passes over the batch list: in each, every batch once, then each live peer
                // at it; a batch's row gathers its samples from every pass (the check is the
                // first pass's).
                let mut timed = vec![];
                for &b in &batches {
                    let phase = decode_phase(b);
                    match ctx.over_budget(&phase, m.cfg.vocab, &opts.mem_budget) {
                        Some(note) => rows.push(ctx.skipped("model", mname, &phase, note)),
                        None => timed.push((b, Timing { samples: vec![] }, None)),
                    }
                }
                bar.inc((batches.len() - timed.len()) as u64);
                let live = timed
                    .iter()
                    .any(|t| peers.live_at(&slots, &PeerPoint::decode(t.0, context, steps)));
                let rounds = rounds_set.unwrap_or(if live { 3 } else { 1 });
                for pass in 0..rounds {
                    for (b, t, err) in timed.iter_mut() {
                        bar.set_message(format!(
                            "{name} {w}: decode batch {b} (pass {}/{rounds})",
                            pass + 1
                        ));
                        let point = PeerPoint::decode(*b, context, steps);
                        let (one, check) = decode_times(m, *b, context, steps)?;
                        peers.time_round(&mut slots, path, &point);
                        t.samples.extend(one.samples);
                        if pass == 0 {
                            *err = check;
                        }
                    }
                }
                for (b, t, err) in timed {
                    let row = ctx.row("model", mname, &decode_phase(b), &t, err);
                    failures += usize::from(row.head.status == "fail");
                    rows.push(row);
                    bar.inc(1);
                }
                for &p in &prefill {
                    bar.set_message(format!("{name} {w}: prefill {p}"));
                    let phase = prefill_phase(p);
                    if let Some(note) = ctx.over_budget(&phase, m.cfg.vocab, &opts.mem_budget) {
                        rows.push(ctx.skipped("model", mname, &phase, note));
                        bar.inc(1);
                        continue;
                    }
                    let point = PeerPoint::prefill(p);
                    let rounds = if peers.live_at(&slots, &point) { 3 } else { 2 };
                    let ids = prompt(0, p, m.cfg.vocab);
                    let mut samples = vec![];
                    for _ in 0..rounds {
                        let mut s = Session::new(m, p, 16)?;
                        let t0 = Instant::now();
                        s.forward(&ids)?;
                        samples.push(t0.elapsed().as_secs_f64());
                        peers.time_round(&mut slots, path, &point);
                    }
                    let row = ctx.row("model", mname, &phase, &Timing { samples }, None);
                    rows.push(row);
                    bar.inc(1);
                }
                // The roofline's time of a step: its bytes at the read bandwidth or its
                // multiply-adds at the peak of the arithmetic the product does (the int8 MAC
                // peak for int8 activations, where it was measured; the f32 FMA peak
                // otherwise), whichever is longer.
                let int8 = run.roof.int8_gmacs > 0.0
                    && matches!(
                        variant,
                        MatVecVariant::Packed(_) | MatVecVariant::FusedQ8(_)
                    );
                let roof_s = |p: &Phase| {
                    let bytes = (ctx.wbytes + p.kv_bytes) / (bw * 1e9);
                    let compute = if int8 {
                        ctx.flops_token / 2.0 * p.tokens as f64 / (run.roof.int8_gmacs * 1e9)
                    } else {
                        ctx.flops_token * p.tokens as f64 / (fma * 1e9)
                    };
                    bytes.max(compute)
                };
                for &k in &verify {
                    bar.set_message(format!("{name} {w}: verify {k} tokens"));
                    let phase = verify_phase(k);
                    if let Some(note) = ctx.over_budget(&phase, m.cfg.vocab, &opts.mem_budget) {
                        rows.push(ctx.skipped("model", mname, &phase, note));
                        bar.inc(1);
                        continue;
                    }
                    let point = PeerPoint::verify(k, context);
                    // With a peer at the point, 5 rounds alternate ours (16 steps each) and
                    // one call of each peer; the check is the first round's.
                    let mut paired = vec![];
                    let (t, check) = peers.alternate(&mut slots, path, &point, 5, || {
                        verify_times(m, context, k, steps, &mut paired)
                    })?;
                    let med = t.median();
                    let one_step = if k == 1 {
                        med
                    } else {
                        Timing { samples: paired }.median()
                    };
                    let err = check.map(|(e, _)| e);
                    let mut row = ctx.row("model", mname, &phase, &t, err);
                    if let Some((e, same)) = check.filter(|&(e, _)| e > 1e-3) {
                        verify_int8_flips(&mut row, *variant, e, same, k);
                    }
                    row.cols.cost_steps = Some(med / one_step);
                    row.cols.roofline_steps = Some(roof_s(&phase) / roof_s(&verify_phase(1)));
                    failures += usize::from(row.head.status == "fail");
                    rows.push(row);
                    bar.inc(1);
                }
            }
            if w == "native" {
                let ctx = ctx_for(&m);
                let phases: Vec<Phase> = batches
                    .iter()
                    .map(|&b| decode_phase(b))
                    .chain(prefill.iter().map(|&p| prefill_phase(p)))
                    .chain(verify.iter().map(|&k| verify_phase(k)))
                    .collect();
                let mut theirs = peers.rows(slots, &ctx, &phases);
                peer_verify_costs(&mut theirs);
                for row in theirs {
                    rows.push(row);
                    bar.inc(1);
                }
            }
            run.write_point(&key, &rows)?;
        }
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, failures, render)
}

/// A peer's k-token steps in its own 1-token steps (its k = 1 row at the same point).
fn peer_verify_costs(rows: &mut [DecodeRow]) {
    let one: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.phase == "verify" && r.step_tokens == Some(1) && r.head.status == "ok")
        .filter_map(|r| Some((r.head.variant.clone(), r.head.median_ms?)))
        .collect();
    for r in rows.iter_mut().filter(|r| r.phase == "verify") {
        let base = one.iter().find(|(v, _)| *v == r.head.variant).map(|o| o.1);
        r.cols.cost_steps = base.zip(r.head.median_ms).map(|(b, m)| m / b);
    }
}

/// Bytes per parameter of the model's projections (parameters ≈ weight bytes / this; 2 FLOPs
/// per parameter and token).
fn bytes_per_param(m: &Llama) -> f64 {
    m.layers
        .first()
        .map_or(4.0, |l| l.wo.format().bits_per_weight() / 8.0)
}

/// The one-at-a-time check of a verify step with int8 activations, which is not bit-exact
/// once anything upstream of an activation's codes differs by an f32 rounding: a code on a
/// rounding boundary flips, and one flipped code moves the logits by up to the quantisation
/// step, amplified through the layers. Up to `INT8_FLIP_BOUND` with every top-1 token the
/// same, the row passes and says so; a real error (a wrong row, position or mask) is far
/// larger. Under paged attention a verification pass scores each token as its decode step
/// (`models::model::attention`), so the logits are bit-identical at every k and context
/// (before that: identical for k ≤ 15 at context 64, 2–5e-2 from k = 16, where one
/// multi-token call's partitions, or the contiguous kernel past 16 tokens, summed the
/// context in another order); the bound still serves contiguous attentions. The f32 product
/// stayed within 2e-6 at every k.
fn verify_int8_flips(row: &mut DecodeRow, variant: MatVecVariant, err: f64, same: usize, k: usize) {
    const INT8_FLIP_BOUND: f64 = 0.1;
    let int8 = matches!(
        variant,
        MatVecVariant::Packed(_) | MatVecVariant::FusedQ8(_)
    );
    if int8 && err <= INT8_FLIP_BOUND && same == k {
        row.head.status = "ok".into();
        row.note = format!(
            "int8 activations: {err:.1e} from one at a time (codes flipped by f32 rounding upstream; within {INT8_FLIP_BOUND}), every top-1 token the same"
        );
    } else {
        row.note = format!("{err:.1e} from one at a time; top-1 the same at {same} of {k}");
    }
}

/// This family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<DecodeCols>(spec, csv, prov, tables)
}

/// The markdown tables of a decode run: every measured row against the roofline, our
/// products against the report's peer at each point they share, and what did not run.
pub fn tables(spec: &ExperimentSpec, rows: &[DecodeRow]) -> String {
    let measured = |r: &&DecodeRow| r.head.status == "ok" || r.head.status == "fail";
    let mut md = String::from("## Decode and prefill against the bandwidth roofline\n\n| model | weights | matmul | phase | batch | context | weight MB | median ms | tokens/s | roofline ms | % of roofline | effective GB/s | rel err vs batch 1 |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows.iter().filter(measured).filter(|r| r.phase != "verify") {
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
    md.push_str(&verify_table(rows));
    if let Some(peer) = &spec.report.peer {
        md.push_str(&against_peer(rows, peer));
    }
    let skipped: Vec<&DecodeRow> = rows.iter().filter(|r| !measured(r)).collect();
    if !skipped.is_empty() {
        md.push_str("## Rows not measured\n\n| variant | model | weights | phase | batch | context | status | why |\n|---|---|---|---|---|---|---|---|\n");
        for r in skipped {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.head.variant,
                r.model,
                r.weights,
                r.phase,
                r.batch,
                r.context,
                r.head.status,
                r.note
            );
        }
        md.push('\n');
    }
    md
}

/// The verify rows: a k-token step's cost in 1-token steps, measured and as the roofline
/// predicts it.
fn verify_table(rows: &[DecodeRow]) -> String {
    let verify: Vec<&DecodeRow> = rows
        .iter()
        .filter(|r| r.phase == "verify" && r.head.status != "skipped")
        .collect();
    if verify.is_empty() {
        return String::new();
    }
    let mut md = String::from("## A k-token step of one sequence in 1-token steps (verification cost)\n\nThe median of a k-token forward step (all k logits) over the median of the 1-token steps timed alternately with it (same model, weights, product and position; the k = 1 row is the plain decode step); beside it the roofline's: max(bytes / read bandwidth, k × multiply-adds / peak) over the same at k = 1, the peak being the int8 MAC peak for the int8-activation products (packed, fused:act=q8) and the f32 FMA peak for fused. A speculative pass of k tokens wins when it accepts more than its cost in tokens.\n\n| model | weights | matmul | context | k | median ms | p10–p90 ms | cost (1-token steps) | roofline's cost | rel err vs one at a time |\n|---|---|---|---|---|---|---|---|---|---|\n");
    let f2 = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
    for r in verify {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} | {:.2}–{:.2} | {} | {} | {} |",
            r.model,
            r.weights,
            r.matmul,
            r.context,
            r.step_tokens.unwrap_or(0),
            r.head.median_ms.unwrap_or(f64::NAN),
            r.head.p10_ms.unwrap_or(f64::NAN),
            r.head.p90_ms.unwrap_or(f64::NAN),
            f2(r.cost_steps),
            f2(r.roofline_steps),
            crate::render::fmt_err(r.rel_err_vs_batch1)
        );
    }
    md.push('\n');
    md
}

/// Per point the peer measured (its label's base name is `peer`): its tokens/s, and each of
/// our products' tokens/s with the ratio ours / its (= its time / ours).
fn against_peer(rows: &[DecodeRow], peer: &str) -> String {
    let is_peer = |r: &DecodeRow| r.head.variant.split(':').next() == Some(peer);
    let key = |r: &DecodeRow| {
        (
            r.model.clone(),
            r.weights.clone(),
            r.phase.clone(),
            r.batch,
            r.context,
        )
    };
    let theirs: Vec<&DecodeRow> = rows
        .iter()
        .filter(|r| is_peer(r) && r.head.status == "ok")
        .collect();
    if theirs.is_empty() {
        return String::new();
    }
    let mut products: Vec<&str> = vec![];
    for r in rows.iter().filter(|r| !is_peer(r)) {
        if !products.contains(&r.matmul.as_str()) {
            products.push(&r.matmul);
        }
    }
    let mut md = format!(
        "## Against {peer} (tokens/s; in brackets ours / its, same point, alternating rounds)\n\n| model | weights | phase | batch | context | {peer} |"
    );
    for p in &products {
        let _ = write!(md, " {p} |");
    }
    md.push_str("\n|---|---|---|---|---|---|");
    md.push_str(&"---|".repeat(products.len()));
    md.push('\n');
    for t in theirs {
        let _ = write!(
            md,
            "| {} | {} | {} | {} | {} | {:.1} ({}) |",
            t.model, t.weights, t.phase, t.batch, t.context, t.tokens_per_s, t.head.variant
        );
        for p in &products {
            let ours = rows.iter().find(|r| {
                !is_peer(r) && r.matmul == *p && key(r) == key(t) && r.head.status == "ok"
            });
            match ours {
                Some(o) => {
                    let _ = write!(
                        md,
                        " {:.1} ({:.2}×) |",
                        o.tokens_per_s,
                        o.tokens_per_s / t.tokens_per_s
                    );
                }
                None => md.push_str(" – |"),
            }
        }
        md.push('\n');
    }
    md.push('\n');
    md
}
