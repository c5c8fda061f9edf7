//! `harness exp` for the kv_precision family (claim C20: progressive KV precision, FP16 →
//! FP8 → INT8 for distant tokens; C12: the KV cache is what long contexts pay for): the KV
//! cache in every format of the grid — f32, f16, bf16, FP8 E4M3 and int8 with per-block or
//! per-head scales, uniformly or progressively (recent tokens wide, aged blocks narrow) — as
//! the model's quality (perplexity, KL divergence and top-1 agreement against the f32 cache on
//! the same text and windows) and as the paged decode kernel's speed over a cache in it (GB/s
//! of the bytes as stored, at a few decode shapes and ISA tiers), each with its bytes per
//! token and storage error.

use crate::error::{HarnessError, Result};
use crate::family::{listed, one_of, ExpFamily, Family};
use crate::measure::CacheFlusher;
use crate::model_source::resolve_model;
use crate::provenance::Provenance;
use crate::render::{report, Rendered};
use crate::row::Head;
use crate::run_files::{ExpRequest, GridValues, RunFiles};
use crate::spec::ExperimentSpec;
use crate::sweep::PointKey;
use crate::texts::Text;
use kernel_cpu::Isa;
use kernel_paged::{KvCacheFormat, PoolLayout};
use models::eval::perplexity::windows;
use models::{load, Llama};
use std::path::Path;

/// The row columns.
pub mod cols;
/// The paged decode kernel over a cache in each format.
mod kernel;
/// The model's quality with its cache in each format.
mod quality;
/// The tables.
mod tables;

pub use cols::{KvPrecisionCols, KvPrecisionRow};

pub const FAMILY: Family = Family {
    name: "kv_precision",
    about: "the KV cache in f32/f16/bf16/FP8/int8, uniform or progressive: model quality and paged decode speed",
    variants: || listed("kv_precision", VARIANTS),
    check: None,
    exp: Some(ExpFamily {
        grid_keys: GRID_KEYS,
        variant: |v| one_of("kv_precision", VARIANTS, v),
        run,
        render,
        peers: false,
    }),
    cuda: &[],
    replay: None,
};

/// The variants of this family's experiments.
pub const VARIANTS: &[kernel_common::VariantInfo] = &[kernel_common::VariantInfo::cpu(
    "kv_cache",
    "the pipeline and paged decode with the KV cache in each grid format (rows name the format)",
)];

/// Grid keys a kv_precision experiment understands.
pub const GRID_KEYS: &[(&str, &str)] = &[
    ("part", "quality | decode (which measurements run)"),
    (
        "kv_cache",
        "f32 | f16 | bf16 | fp8 | int8 | fp8:per_head | int8:per_head | progressive:window=N,old=FMT[,recent=FMT] (f32, the reference, always runs)",
    ),
    (
        "model",
        "smollm2 | a preset (no tokenizer: token ids are the text's bytes) | a checkpoint path",
    ),
    ("text", "gpl3 | licenses | rust | seeds | a UTF-8 file"),
    ("window", "CTXxN: N windows of CTX tokens (llama.cpp's chunks)"),
    ("prefill_chunk", "tokens per forward pass while a window is prefilled"),
    ("decode", "decode shapes bB:hQ/K:dD:ctxN (batch, heads, head dim, context)"),
    ("block_size", "tokens per KV block of the decode shapes"),
    ("isa", "native | avx512 | avx2 | portable: the tier the decode kernel is timed at"),
];

/// `CTXxN` → (ctx, N).
fn parse_window(text: &str) -> Result<(usize, usize)> {
    crate::run_files::pair_of_counts(text).ok_or_else(|| {
        HarnessError::Usage(format!(
            "window '{text}' is not CTXxN (e.g. 512x8: 8 windows of 512 tokens)"
        ))
    })
}

/// A tier of the grid: `native` is the active one.
fn parse_isa(text: &str) -> Result<Isa> {
    if text == "native" {
        return Ok(Isa::active());
    }
    let isa = Isa::parse(text).map_err(|e| HarnessError::Usage(e.to_string()))?;
    if !isa.supported() {
        return Err(HarnessError::Usage(format!(
            "isa {text}: this CPU lacks {}",
            isa.missing().join(", ")
        )));
    }
    Ok(isa)
}

/// One model with its token streams, loaded while the request is validated.
struct ModelTexts {
    name: String,
    model: Llama,
    /// (text, its tokens, the windows per grid window value).
    texts: Vec<(Text, Vec<u32>, Vec<Vec<models::eval::perplexity::Window>>)>,
    note: String,
}

/// Runs a kv_precision experiment.
pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, spec_path, grid) = (req.opts, req.spec, req.spec_path, req.grid.clone());
    let g = GridValues(&grid);
    let parts = g.strings("part", &["quality", "decode"]);
    if let Some(p) = parts.iter().find(|p| *p != "quality" && *p != "decode") {
        return Err(HarnessError::Usage(format!(
            "part '{p}' is not quality or decode"
        )));
    }
    let mut formats = vec![KvCacheFormat::default()];
    for f in g.strings("kv_cache", &["f16", "int8"]) {
        let f = KvCacheFormat::parse(&f)?;
        if !formats.contains(&f) {
            formats.push(f);
        }
    }
    let win = g
        .strings("window", &["512x8"])
        .iter()
        .map(|w| parse_window(w))
        .collect::<Result<Vec<_>>>()?;
    let chunks = g.counts("prefill_chunk", &["64"])?;
    let shapes = g
        .strings("decode", &["b8:h32/8:d128:ctx4096"])
        .iter()
        .map(|s| kernel::DecodeShape::parse(s))
        .collect::<Result<Vec<_>>>()?;
    let block_sizes = g.counts("block_size", &["16"])?;
    for &bs in &block_sizes {
        PoolLayout {
            num_blocks: 1,
            block_size: bs,
            kv_heads: 1,
            head_dim: 1,
        }
        .validate()?;
    }
    let isas = g
        .strings("isa", &["native"])
        .iter()
        .map(|i| parse_isa(i))
        .collect::<Result<Vec<_>>>()?;
    // Every model, text and window is checked (and loaded) before results/ is touched.
    let mut loaded = vec![];
    if parts.iter().any(|p| p == "quality") {
        for name in g.strings("model", &["smollm2"]) {
            loaded.push(model_texts(&name, &g, &win)?);
        }
    }
    let decode = parts.iter().any(|p| p == "decode");
    let mut run = RunFiles::start(opts, spec, spec_path, grid.clone())?;
    for m in &loaded {
        for (text, _, _) in &m.texts {
            run.prov.inputs.insert(
                format!("text {}", text.name),
                format!("sha256:{}", text.sha256),
            );
        }
    }
    let n_quality: usize =
        loaded.iter().map(|m| m.texts.len()).sum::<usize>() * win.len() * chunks.len();
    let n_decode = if decode {
        shapes.len() * block_sizes.len() * isas.len()
    } else {
        0
    };
    let bar = run.progress_bar((n_quality + n_decode) * formats.len());
    let heads = run.heads.clone();
    let head = |variant: &str| heads.head(variant, opts.seed);
    let mut failures = 0;
    for m in &mut loaded {
        for (text, tokens, wins) in &m.texts {
            for (&(ctx, n), ws) in win.iter().zip(wins) {
                for &chunk in &chunks {
                    let window = format!("{ctx}x{n}");
                    let key = PointKey::of(&[
                        ("part", &"quality"),
                        ("model", &m.name),
                        ("text", &text.name),
                        ("window", &window),
                        ("prefill_chunk", &chunk),
                    ]);
                    if !run.owns(&key) {
                        continue;
                    }
                    let (need, what) = quality_need(&m.model, ctx, chunk);
                    if let Some(note) = opts.mem_budget.refuse(need, &what) {
                        let cols = KvPrecisionCols {
                            part: "quality".into(),
                            model: m.name.clone(),
                            text: text.name.clone(),
                            text_sha256: text.sha256.clone(),
                            ctx: Some(ctx),
                            windows: Some(n),
                            prefill_chunk: Some(chunk),
                            ..KvPrecisionCols::default()
                        };
                        run.write_point(&key, &skipped(&formats, cols, &head, &note, &bar))?;
                        continue;
                    }
                    let point = quality::QualityPoint {
                        model_name: &m.name,
                        model_id: m.name.clone(),
                        text,
                        tokens,
                        windows: ws,
                        ctx,
                        prefill_chunk: chunk,
                        formats: &formats,
                        note: m.note.clone(),
                    };
                    let rows = quality::rows(&mut m.model, &point, &head, &bar)?;
                    failures += rows.iter().filter(|r| r.head.status == "fail").count();
                    run.write_point(&key, &rows)?;
                }
            }
        }
    }
    let mut flusher = None;
    for (i, &shape) in shapes.iter().enumerate().filter(|_| decode) {
        for &bs in &block_sizes {
            for &isa in &isas {
                let key = PointKey::of(&[
                    ("part", &"decode"),
                    ("shape", &shape.label()),
                    ("block_size", &bs),
                    ("isa", &isa.name()),
                ]);
                if !run.owns(&key) {
                    continue;
                }
                let (need, what) = decode_need(shape, bs);
                if let Some(note) = opts.mem_budget.refuse(need, &what) {
                    let cols = KvPrecisionCols {
                        part: "decode".into(),
                        shape: shape.label(),
                        batch: Some(shape.batch),
                        q_heads: Some(shape.q_heads),
                        kv_heads: Some(shape.kv_heads),
                        head_dim: Some(shape.head_dim),
                        context: Some(shape.context),
                        block_size: Some(bs),
                        isa: isa.name().into(),
                        ..KvPrecisionCols::default()
                    };
                    run.write_point(&key, &skipped(&formats, cols, &head, &note, &bar))?;
                    continue;
                }
                let point = kernel::DecodePoint {
                    shape,
                    block_size: bs,
                    isa,
                    formats: &formats,
                    seed: kernel_common::inputs::derive_seed(opts.seed, i as u64),
                    reps: req.reps,
                    budget_s: spec.limits.seconds_per_point,
                    read_gbps: run.roof.read_gbps,
                };
                let fl = flusher.get_or_insert_with(CacheFlusher::new);
                let rows = kernel::rows(&point, &head, fl, &bar)?;
                failures += rows.iter().filter(|r| r.head.status == "fail").count();
                run.write_point(&key, &rows)?;
            }
        }
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, failures, render)
}

/// What a quality point holds at its peak, for the memory guard: the model's weights; its f32
/// K/V of one window, about four times over (the session, and the storage check's gathered
/// f32 and exact f64 copies of every layer); the f32 cache's kept log-probabilities of the
/// window; a prefill chunk's logits twice.
fn quality_need(model: &Llama, ctx: usize, chunk: usize) -> (u64, String) {
    use crate::mem_guard::{human, product};
    let c = &model.cfg;
    let weights = model.held_bytes() as u64;
    let kv = product(&[c.layers, ctx, c.kv_heads, c.head_dim, 2, 4]);
    let kept = product(&[ctx, c.vocab, 4]);
    let logits = product(&[chunk.min(ctx), c.vocab, 8]);
    let need = weights
        .saturating_add(kv.saturating_mul(4))
        .saturating_add(kept)
        .saturating_add(logits);
    let what = format!(
        "weights {}, a {ctx}-token window's K/V {} about four times, its log-probabilities {}",
        human(weights),
        human(kv),
        human(kept)
    );
    (need, what)
}

/// What a decode point holds at its peak: the seeded f32 K/V of every sequence and a cache of
/// it (one format at a time, none wider than f32), one sequence's gathered f32 and exact f64
/// copies for the storage check, the block tables.
fn decode_need(s: kernel::DecodeShape, block_size: usize) -> (u64, String) {
    use crate::mem_guard::{human, product};
    let values = product(&[s.batch, s.context, s.kv_heads, s.head_dim, 2, 4]);
    let check = product(&[s.context, s.kv_heads, s.head_dim, 2, 12]);
    let tables = product(&[s.batch, s.context.div_ceil(block_size.max(1)), 8]);
    let need = values
        .saturating_mul(2)
        .saturating_add(check)
        .saturating_add(tables);
    let what = format!("the f32 K/V {} and a cache of it", human(values));
    (need, what)
}

/// The rows of a point the memory guard skipped: one per format, with the point's columns.
fn skipped(
    formats: &[KvCacheFormat],
    cols: KvPrecisionCols,
    head: &dyn Fn(&str) -> Head,
    note: &str,
    bar: &indicatif::ProgressBar,
) -> Vec<KvPrecisionRow> {
    let rows = formats
        .iter()
        .map(|f| {
            let mut h = head(&f.to_string());
            h.status = "skipped".into();
            KvPrecisionRow {
                head: h,
                cols: KvPrecisionCols {
                    kv_cache: f.to_string(),
                    scheme: quality::scheme(f).into(),
                    ..cols.clone()
                },
                note: note.into(),
            }
        })
        .collect();
    bar.inc(formats.len() as u64);
    rows
}

/// Loads `name` and tokenises every text of the grid, checking each window setting fits the
/// model and the text.
fn model_texts(name: &str, g: &GridValues, win: &[(usize, usize)]) -> Result<ModelTexts> {
    let path = resolve_model(name)?;
    let lopts = crate::load_flags::LoadFlags {
        attention: Some("paged".into()),
        matmul: Some("packed".into()),
        ..Default::default()
    }
    .options()?;
    let l = load(&path, &lopts)?;
    let root = crate::workspace::root().ok();
    let mut texts = vec![];
    for t in g.strings("text", &["gpl3"]) {
        let text = Text::resolve(&t, root.as_deref())?;
        let tokens: Vec<u32> = match &l.tokenizer {
            Some(tok) => tok.encode(&text.content)?,
            None => text
                .content
                .bytes()
                .map(|b| b as u32 % l.model.cfg.vocab as u32)
                .collect(),
        };
        let mut per = vec![];
        for &(ctx, n) in win {
            if ctx > l.model.cfg.context {
                return Err(HarnessError::Usage(format!(
                    "window {ctx}x{n} is beyond {name}'s context of {}",
                    l.model.cfg.context
                )));
            }
            let ws = windows(tokens.len(), ctx, ctx, Some(n))
                .map_err(|e| HarnessError::Usage(format!("{name} on {t}: {e}")))?;
            if ws.len() < n {
                return Err(HarnessError::Usage(format!(
                    "window {ctx}x{n}: {t} has {} tokens for {name}, {} windows of {ctx}",
                    tokens.len(),
                    ws.len()
                )));
            }
            per.push(ws);
        }
        texts.push((text, tokens, per));
    }
    let note = if l.tokenizer.is_none() {
        "preset without a tokenizer: token ids are the text's bytes (random weights: the numbers exercise the code, they say nothing of a model)".into()
    } else {
        String::new()
    };
    Ok(ModelTexts {
        name: name.into(),
        model: l.model,
        texts,
        note,
    })
}

/// This family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<KvPrecisionCols>(spec, csv, prov, tables::tables)
}
