//! `harness exp` for the accuracy family (claims C17, C18, C19): what each weight format
//! costs a real model in quality and buys in decode speed, measured the way llama.cpp's
//! `llama-perplexity --kl-divergence` does — perplexity over a text's windows, KL divergence
//! and top-1 agreement against the f32 model — beside batch-1 decode tokens/s; then which
//! layers and projection kinds are most sensitive to quantisation (one at a time, simulated,
//! ranked by the KL they add), and a mixed-precision plan that keeps the most sensitive
//! layers in the high format.

use crate::error::{HarnessError, Result};
use crate::family::{listed, one_of, ExpFamily, Family};
use crate::model_source::resolve_model;
use crate::provenance::Provenance;
use crate::render::{report, Rendered};
use crate::run_files::{ExpRequest, GridValues, RunFiles};
use crate::spec::ExperimentSpec;
use crate::sweep::PointKey;
use crate::texts::Text;
use bench::{Bench, Formats, Windows};
use indicatif::ProgressBar;
use kernel_quant::WeightFormat;
use models::eval::perplexity::windows;
use models::{load, LlamaConfig, LoadOptions, Proj};
use rows::{AccuracyCols, AccuracyRow, RowCtx, Subject};
use std::path::Path;

/// Loading, evaluating and timing one model configuration against the f32 reference.
mod bench;
/// The formats of the sensitivity scans, their ranking and the mixed plan.
mod plan;
/// The rows and tables.
pub mod rows;

pub const FAMILY: Family = Family {
    name: "accuracy",
    about: "model quality per weight format: perplexity, KL and top-1 vs f32, decode speed, layer sensitivity",
    variants: || listed("accuracy", VARIANTS),
    check: None,
    exp: Some(ExpFamily {
        grid_keys: GRID_KEYS,
        variant: |v| one_of("accuracy", VARIANTS, v),
        run,
        render,
        peers: false,
    }),
    cuda: &[],
    replay: None,
};

/// The variants of this family's experiments.
pub const VARIANTS: &[kernel_common::VariantInfo] = &[kernel_common::VariantInfo::cpu(
    "model",
    "the generation pipeline's forward pass (weights in the grid's formats)",
)];

/// The studies a spec may list.
const STUDIES: &[&str] = &["formats", "layers", "projections", "plan"];

/// Grid keys an accuracy experiment understands.
pub const GRID_KEYS: &[(&str, &str)] = &[
    (
        "model",
        "smollm2 (the fetched GGUF) | a GGUF or checkpoint path (one value; it needs a tokenizer)",
    ),
    (
        "text",
        "gpl3 | licenses | rust | seeds | a UTF-8 file (one value)",
    ),
    (
        "matmul",
        "the product of every projection: packed | fused | fused:act=q8 (one value)",
    ),
    ("study", "formats | layers | projections | plan"),
    (
        "format",
        "formats study: f32 | f16 | q8_0 | q4_0 | q4_1 | sym4g32 | asym3g64 ...",
    ),
    (
        "ctx",
        "tokens per window of the formats and plan studies (llama.cpp chunks, second half scored)",
    ),
    ("windows", "windows of the formats and plan studies"),
    (
        "sens_format",
        "layers and projections studies: the format each scan simulates (sym4g32, sym3g32, ...)",
    ),
    ("sens_ctx", "tokens per window of the sensitivity scans"),
    ("sens_windows", "windows of the sensitivity scans"),
    (
        "layers",
        "layers the layer scan (and so the plan's ranking) covers: all | indices",
    ),
    (
        "plan_low",
        "plan: the format of every matrix not kept high (real, one value)",
    ),
    (
        "plan_high",
        "plan: the format of the most sensitive layers (real, one value)",
    ),
    (
        "plan_top",
        "plan: how many of the most sensitive layers stay high",
    ),
    (
        "decode_context",
        "prompt tokens before the timed decode steps",
    ),
    (
        "decode_steps",
        "timed batch-1 decode steps (the median is reported)",
    ),
];

/// Why `f` cannot store every matrix of `cfg`, if it cannot.
fn unfit(f: WeightFormat, cfg: &LlamaConfig) -> Option<String> {
    [cfg.d_model, cfg.q_dim(), cfg.d_ff]
        .into_iter()
        .find_map(|cols| f.validate(cols).err())
        .map(|e| e.to_string())
}

fn format(name: &str, key: &str) -> Result<WeightFormat> {
    WeightFormat::parse(name).map_err(|e| HarnessError::Usage(format!("{key} '{name}': {e}")))
}

/// A format every matrix must take (sensitivity and plan formats): else one line.
fn fitting(name: &str, key: &str, cfg: &LlamaConfig, model: &str) -> Result<WeightFormat> {
    let f = format(name, key)?;
    match unfit(f, cfg) {
        Some(why) => Err(HarnessError::Usage(format!(
            "{key} '{name}' for {model}: {why}"
        ))),
        None => Ok(f),
    }
}

/// Runs an accuracy experiment.
pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, spec_path, grid) = (req.opts, req.spec, req.spec_path, req.grid.clone());
    let g = GridValues(&grid);
    let model_name = g.one_string("model", "smollm2")?;
    let text_name = g.one_string("text", "gpl3")?;
    let matmul = crate::load_flags::matmul(&g.one_string("matmul", "packed")?)?;
    let studies = g.strings("study", STUDIES);
    if let Some(s) = studies.iter().find(|s| !STUDIES.contains(&s.as_str())) {
        return Err(HarnessError::Usage(format!(
            "study '{s}' is not one of {}",
            STUDIES.join(", ")
        )));
    }
    let has = |s: &str| studies.iter().any(|x| x == s);
    let format_names = g.strings("format", &["f32", "q8_0", "q4_0"]);
    let ctx = g.one("ctx", "256", "a token count ≥ 4", |n: usize| n >= 4)?;
    let n_windows = g.one("windows", "4", "a positive integer", |n: usize| n > 0)?;
    let sens_names = g.strings("sens_format", &["sym4g32"]);
    let sens_ctx = g.one("sens_ctx", "256", "a token count ≥ 4", |n: usize| n >= 4)?;
    let sens_windows = g.one("sens_windows", "2", "a positive integer", |n: usize| n > 0)?;
    let plan_low = g.one_string("plan_low", "sym4g32")?;
    let plan_high = g.one_string("plan_high", "sym8g32")?;
    let tops = g.parsed("plan_top", &["4"], "a layer count", |_: usize| true)?;
    let decode_context = g.one("decode_context", "64", "a positive integer", |n: usize| {
        n > 0
    })?;
    let decode_steps = g.one("decode_steps", "16", "a positive integer", |n: usize| n > 0)?;

    let formats = format_names
        .iter()
        .map(|n| format(n, "format"))
        .collect::<Result<Vec<_>>>()?;
    let named = sens_names.iter().map(|n| (n, "sens_format"));
    for (n, key) in named.chain([(&plan_low, "plan_low"), (&plan_high, "plan_high")]) {
        format(n, key)?;
    }
    // Everything is checked before results/ is touched: the model, its tokenizer, the text's
    // length against every window, every format against every matrix.
    let path = resolve_model(&model_name)?;
    let loaded = load(&path, &LoadOptions::default())?;
    let cfg = loaded.model.cfg;
    let tokenizer = loaded.tokenizer.ok_or_else(|| {
        HarnessError::Usage(format!(
            "model {model_name}: it has no tokenizer (a preset); accuracy needs a real model and text"
        ))
    })?;
    let f32_bytes = loaded.model.f32_weight_bytes() as u64;
    drop(loaded.model);
    let text = Text::resolve(&text_name, opts.experiments_dir.parent())?;
    let tokens = tokenizer.encode(&text.content)?;
    for (c, what) in [(ctx, "ctx"), (sens_ctx, "sens_ctx")] {
        if c > cfg.context {
            return Err(HarnessError::Usage(format!(
                "{what} {c} is beyond {model_name}'s context of {}",
                cfg.context
            )));
        }
    }
    let long = windows(tokens.len(), ctx, ctx, Some(n_windows)).map_err(HarnessError::Usage)?;
    let short = windows(tokens.len(), sens_ctx, sens_ctx, Some(sens_windows))
        .map_err(HarnessError::Usage)?;
    for (want, got, what) in [
        (n_windows, long.len(), "windows"),
        (sens_windows, short.len(), "sens_windows"),
    ] {
        if got < want {
            return Err(HarnessError::Usage(format!(
                "{what} {want}: text {text_name} has {} tokens, room for {got}",
                tokens.len()
            )));
        }
    }
    if decode_context + decode_steps + 1 > cfg.context.min(tokens.len()) {
        return Err(HarnessError::Usage(format!(
            "decode_context {decode_context} + {decode_steps} steps exceed the context ({}) or the text ({} tokens)",
            cfg.context,
            tokens.len()
        )));
    }
    let sens = sens_names
        .iter()
        .map(|n| fitting(n, "sens_format", &cfg, &model_name))
        .collect::<Result<Vec<_>>>()?;
    let low = fitting(&plan_low, "plan_low", &cfg, &model_name)?;
    let high = fitting(&plan_high, "plan_high", &cfg, &model_name)?;
    let layers: Vec<usize> = match &g.strings("layers", &["all"])[..] {
        [all] if all == "all" => (0..cfg.layers).collect(),
        given => given
            .iter()
            .map(|v| match v.parse::<usize>() {
                Ok(l) if l < cfg.layers => Ok(l),
                _ => Err(HarnessError::Usage(format!(
                    "layers '{v}' is not 'all' nor a layer index below {}",
                    cfg.layers
                ))),
            })
            .collect::<Result<_>>()?,
    };
    if let Some(t) = tops.iter().find(|&&t| t > layers.len()) {
        return Err(HarnessError::Usage(format!(
            "plan_top {t} is more than the {} layers scanned",
            layers.len()
        )));
    }

    // The memory guard: the run holds the f32 model and the f32 references' log-probabilities
    // (kept for every point) while a model under test is loaded; over the budget, every point
    // is skipped with the note.
    let uses_long = has("formats") || has("plan");
    let uses_short = has("layers") || has("projections") || has("plan");
    let over = run_over_budget(
        &cfg,
        f32_bytes,
        [
            (uses_long, n_windows, ctx),
            (uses_short, sens_windows, sens_ctx),
        ],
        &opts.mem_budget,
    );
    let mut run = RunFiles::start(opts, spec, spec_path, grid.clone())?;
    run.prov.inputs.insert(
        format!("text {}", text.name),
        format!("sha256:{}", text.sha256),
    );
    if let Some(sha) = file_sha256(&path)? {
        run.prov.inputs.insert(format!("model {model_name}"), sha);
    }
    let mut bench = Bench::new(
        path,
        text.sha256.clone(),
        tokens,
        long,
        short,
        matmul,
        (decode_context, decode_steps),
    );
    let total = usize::from(has("formats")) * formats.len()
        + usize::from(has("layers")) * sens.len() * layers.len()
        + usize::from(has("projections")) * sens.len() * Proj::ALL.len()
        + usize::from(has("plan")) * (2 + tops.len());
    let bar = run.progress_bar(total);
    let heads = run.heads.clone();
    let rc = RowCtx {
        heads: &heads,
        seed: opts.seed,
        model: &model_name,
        text: &text.name,
    };
    let key = |study: &str, name: &str, value: &str| {
        PointKey::of(&[
            ("model", &model_name),
            ("text", &text.name),
            ("study", &study),
            (name, &value),
        ])
    };
    // The layer scan in the plan's low format, when this run makes it: the plan's ranking.
    let mut low_kls: Option<Vec<f64>> = None;
    if has("formats") {
        for (name, &f) in format_names.iter().zip(&formats) {
            let k = key("formats", "format", name);
            if !run.owns(&k) {
                continue;
            }
            bar.set_message(format!("format {name}"));
            let s = Subject {
                study: "formats",
                format: name,
                target: "all".into(),
                scheme: rows::scheme(f),
                ctx,
                windows: n_windows,
            };
            let row = match (unfit(f, &cfg), &over) {
                (Some(why), _) => {
                    let mut r = rc.empty(s, "unsupported");
                    r.note = why;
                    r
                }
                (None, Some(note)) => rc.skipped(s, note),
                (None, None) => point_row(&mut bench, &rc, s, &Formats::uniform(f), &bar)?,
            };
            run.write_point(&k, &[row])?;
            bar.inc(1);
        }
    }
    // The scans: a point is one study in one format, every target of it.
    for study in ["layers", "projections"].into_iter().filter(|s| has(s)) {
        for (name, &f) in sens_names.iter().zip(&sens) {
            let k = key(study, "format", name);
            if !run.owns(&k) {
                continue;
            }
            let targets: Vec<(String, Formats)> = if study == "layers" {
                layers
                    .iter()
                    .map(|&l| (l.to_string(), plan::one_layer(l, f)))
                    .collect()
            } else {
                Proj::ALL
                    .iter()
                    .map(|&p| (p.name().to_string(), plan::one_projection(p, f)))
                    .collect()
            };
            let mut rows = vec![];
            for (target, formats) in targets {
                if let Some(note) = &over {
                    rows.push(rc.skipped(scan_subject(study, name, target, f, &bench), note));
                    bar.inc(1);
                    continue;
                }
                bar.set_message(format!("{study}: {target} in {name}"));
                let m = bench.load(&formats)?;
                let measured = bench.measure(&m, Windows::Short, &bar)?;
                let s = scan_subject(study, name, target, f, &bench);
                rows.push(rc.measured(s, &measured, None));
                bar.inc(1);
            }
            if over.is_some() {
                run.write_point(&k, &rows)?;
                continue;
            }
            rank_rows(&mut rows);
            if study == "layers" && f == low {
                low_kls = Some(rows.iter().map(|r| r.kl_mean.unwrap_or(0.0)).collect());
            }
            run.write_point(&k, &rows)?;
        }
    }
    if has("plan") {
        let label = format!("{plan_low}+{plan_high}");
        let k = key("plan", "formats", &label);
        if let (true, Some(note)) = (run.owns(&k), &over) {
            let mut skipped = vec![];
            for (name, f) in [(&plan_low, low), (&plan_high, high)] {
                let s = plan_subject(
                    name,
                    "none (uniform)".into(),
                    rows::scheme(f),
                    ctx,
                    n_windows,
                );
                skipped.push(rc.skipped(s, note));
            }
            for &t in &tops {
                let name = format!("{plan_low} + top {t} in {plan_high}");
                let s = plan_subject(&name, String::new(), "mixed".into(), ctx, n_windows);
                skipped.push(rc.skipped(s, note));
            }
            bar.inc(skipped.len() as u64);
            run.write_point(&k, &skipped)?;
        } else if run.owns(&k) {
            // The ranking: this run's layer scan in the low format, or one made now.
            let kls = match low_kls.take() {
                Some(kls) => kls,
                None => {
                    let mut kls = vec![];
                    for &l in &layers {
                        bar.set_message(format!("ranking: layer {l} in {plan_low}"));
                        let m = bench.load(&plan::one_layer(l, low))?;
                        kls.push(bench.measure(&m, Windows::Short, &bar)?.kl.kl.mean());
                    }
                    kls
                }
            };
            let ranked: Vec<usize> = plan::rank_by_kl(&kls)
                .into_iter()
                .map(|i| layers[i])
                .collect();
            let mut rows = vec![];
            for (name, f) in [(&plan_low, low), (&plan_high, high)] {
                bar.set_message(format!("plan: uniform {name}"));
                let s = plan_subject(
                    name,
                    "none (uniform)".into(),
                    rows::scheme(f),
                    ctx,
                    n_windows,
                );
                rows.push(point_row(&mut bench, &rc, s, &Formats::uniform(f), &bar)?);
                bar.inc(1);
            }
            for &t in &tops {
                bar.set_message(format!("plan: top {t} layers in {plan_high}"));
                let (formats, kept) = plan::mixed(&ranked, t, low, high);
                let kept: Vec<String> = kept.iter().map(usize::to_string).collect();
                let name = format!("{plan_low} + top {t} in {plan_high}");
                let s = plan_subject(&name, kept.join(","), "mixed".into(), ctx, n_windows);
                rows.push(point_row(&mut bench, &rc, s, &formats, &bar)?);
                bar.inc(1);
            }
            run.write_point(&k, &rows)?;
        }
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, 0, render)
}

fn scan_subject<'a>(
    study: &'a str,
    format: &'a str,
    target: String,
    f: WeightFormat,
    b: &Bench,
) -> Subject<'a> {
    Subject {
        study,
        format,
        target,
        scheme: rows::scheme(f),
        ctx: b.short[0].len,
        windows: b.window_count(Windows::Short),
    }
}

fn plan_subject(
    format: &str,
    target: String,
    scheme: String,
    ctx: usize,
    windows: usize,
) -> Subject<'_> {
    Subject {
        study: "plan",
        format,
        target,
        scheme,
        ctx,
        windows,
    }
}

/// The memory guard's note when the run would hold more than `budget`: the f32 model and one
/// model under test (at most f32's bytes), the f32 references' log-probabilities over each
/// window kind the studies use (`(used, windows, ctx)`), a window's K/V in f32 and its logits.
fn run_over_budget(
    cfg: &LlamaConfig,
    f32_bytes: u64,
    refs: [(bool, usize, usize); 2],
    budget: &crate::mem_guard::MemBudget,
) -> Option<String> {
    use crate::mem_guard::{human, product};
    let kept: u64 = refs
        .iter()
        .filter(|r| r.0)
        .map(|&(_, n, ctx)| product(&[n, ctx, cfg.vocab, 4]))
        .fold(0, u64::saturating_add);
    let ctx = refs.iter().map(|r| r.2).max().unwrap_or(0);
    let window = product(&[cfg.layers, ctx, cfg.kv_heads, cfg.head_dim, 2, 4])
        .saturating_add(product(&[ctx, cfg.vocab, 8]));
    let need = f32_bytes
        .saturating_mul(2)
        .saturating_add(kept)
        .saturating_add(window);
    let what = format!(
        "the f32 model and one under test {} each, the references' log-probabilities {}, a window's K/V and logits {}",
        human(f32_bytes),
        human(kept),
        human(window)
    );
    budget.refuse(need, &what)
}

/// One model load over the long windows, with its decode speed against f32's.
fn point_row(
    bench: &mut Bench,
    rc: &RowCtx,
    s: Subject,
    f: &Formats,
    bar: &ProgressBar,
) -> Result<AccuracyRow> {
    let m = bench.load(f)?;
    let measured = bench.measure(&m, Windows::Long, bar)?;
    let tps = bench.decode_tokens_per_s(&m)?;
    drop(m);
    let f32_tps = bench.f32_decode()?;
    Ok(rc.measured(s, &measured, Some((tps, f32_tps))))
}

/// The sha256 of a model file (None for a checkpoint directory, whose files the loader
/// names in its own errors).
fn file_sha256(path: &str) -> Result<Option<String>> {
    let p = Path::new(path);
    if !p.is_file() {
        return Ok(None);
    }
    let bytes = std::fs::read(p).map_err(|e| HarnessError::Usage(format!("model {path}: {e}")))?;
    Ok(Some(format!("sha256:{}", crate::texts::sha256_hex(&bytes))))
}

/// Fills each scan row's rank by its KL.
fn rank_rows(rows: &mut [AccuracyRow]) {
    let kls: Vec<f64> = rows.iter().map(|r| r.kl_mean.unwrap_or(0.0)).collect();
    for (r, k) in rows.iter_mut().zip(plan::ranks(&kls)) {
        r.cols.rank = Some(k);
    }
}

/// This family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<AccuracyCols>(spec, csv, prov, rows::tables)
}
