//! `harness check --invariance`: for each attention variant × projection product, whether a
//! sequence's logits are bit-identical decoded alone and inside a continuous batch with
//! sequences of other lengths, and alone on 1 and on N threads (`models::serve::invariance`).
//! A report, not a pass/fail check: which variants are invariant is the finding. Rows go to
//! results/check/<run-id>-invariance.csv.

use crate::error::{HarnessError, Result};
use crate::load_flags::LoadFlags;
use crate::{machine, Format};
use models::serve::invariance::{self, Drift, Invariance, Script};
use serde::Serialize;
use std::path::PathBuf;

/// What `--invariance` checks.
pub struct InvarianceOptions {
    /// A model as `generate --model` takes it (default: the tiny-gqa preset).
    pub model: String,
    /// `--weights` for the model (default for a preset: q4_0, so every product has work).
    pub weights: Option<String>,
    pub threads: usize,
    pub steps: usize,
    pub format: Format,
    pub results_dir: PathBuf,
}

/// The attention variants: paged with its default split (by the context length), with the
/// thread-dependent one, with a fixed partition size, without a split, and flash2 over the
/// gathered cache.
pub const ATTENTIONS: [&str; 5] = [
    "paged",
    "paged:split=auto",
    "paged:split=64",
    "paged:split=off",
    "flash2",
];
/// The projection products.
pub const MATMULS: [&str; 3] = ["packed", "fused:act=q8", "fused"];

/// One row of the report.
#[derive(Debug, Serialize)]
pub struct InvarianceRow {
    pub model: String,
    pub attention: String,
    pub matmul: String,
    pub batch_identical: bool,
    pub batch_max_abs: f32,
    pub batch_differing: usize,
    pub batch_top1_flips: usize,
    pub threads: String,
    pub threads_identical: bool,
    pub threads_max_abs: f32,
    pub threads_differing: usize,
    pub threads_top1_flips: usize,
    pub logits: usize,
}

/// `n` token ids below `vocab`, spread by a fixed stride from `seed`.
fn tokens(n: usize, seed: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729 + 13) % vocab.min(32_000)) as u32)
        .collect()
}

/// The target (a 300-token prompt: long enough that paged's `split=auto` cuts it into
/// partitions that depend on the thread count) and three others of 5, 90 and 170 tokens;
/// `steps` each.
fn scripts(vocab: usize, steps: usize) -> (Script, Vec<Script>) {
    let script = |len, seed| Script {
        prompt: tokens(len, seed, vocab),
        steps: tokens(steps, seed + 100, vocab),
    };
    (
        script(300, 1),
        vec![script(5, 2), script(90, 3), script(170, 4)],
    )
}

/// Runs the grid; prints the table (or JSON) and writes the CSV. Exit 0 unless a variant
/// could not run.
pub fn run(opts: &InvarianceOptions) -> Result<i32> {
    if opts.steps == 0 {
        return Err(HarnessError::Usage("--steps must be at least 1".into()));
    }
    let model = crate::model_source::resolve_model(&opts.model)?;
    let preset = models::model::presets::RANDOM_PRESETS
        .iter()
        .any(|p| p.name == opts.model);
    let weights = opts
        .weights
        .clone()
        .or_else(|| preset.then(|| "q4_0".to_string()));
    let mut rows = vec![];
    let bar = indicatif::ProgressBar::new((ATTENTIONS.len() * MATMULS.len()) as u64);
    for attention in ATTENTIONS {
        for matmul in MATMULS {
            bar.set_message(format!("{attention} × {matmul}"));
            let load = LoadFlags {
                attention: Some(attention.into()),
                weights: weights.clone(),
                capacity: None,
                matmul: Some(matmul.into()),
                kv_cache: None,
            }
            .options()?;
            let loaded = models::load(&model, &load)?;
            let (target, others) = scripts(loaded.model.cfg.vocab, opts.steps);
            let Invariance { batch, threads } =
                invariance::check(&loaded.model, &target, &others, opts.threads, 16)?;
            rows.push(row(
                &opts.model,
                attention,
                matmul,
                opts.threads,
                batch,
                threads,
            ));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let dir = opts.results_dir.join("check");
    std::fs::create_dir_all(&dir)
        .map_err(HarnessError::io(format!("creating {}", dir.display())))?;
    let path = dir.join(format!("{}-invariance.csv", machine::run_id("check")));
    let mut w = csv::Writer::from_writer(vec![]);
    for r in &rows {
        w.serialize(r)?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| HarnessError::Usage(format!("csv: {e}")))?;
    crate::atomic::write(&path, &bytes)?;
    match opts.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Format::Table => println!("{}", table(&rows)),
    }
    eprintln!("{} rows: {}", rows.len(), path.display());
    Ok(0)
}

fn row(
    model: &str,
    attention: &str,
    matmul: &str,
    threads: usize,
    batch: Drift,
    thr: Drift,
) -> InvarianceRow {
    InvarianceRow {
        model: model.into(),
        attention: attention.into(),
        matmul: matmul.into(),
        batch_identical: batch.identical(),
        batch_max_abs: batch.max_abs,
        batch_differing: batch.differing,
        batch_top1_flips: batch.top1_flips,
        threads: format!("1 vs {threads}"),
        threads_identical: thr.identical(),
        threads_max_abs: thr.max_abs,
        threads_differing: thr.differing,
        threads_top1_flips: thr.top1_flips,
        logits: batch.count,
    }
}

fn verdict(identical: bool, max_abs: f32, differing: usize, count: usize, flips: usize) -> String {
    if identical {
        "bit-identical".into()
    } else {
        format!("differs: {differing}/{count} logits, max |Δ| {max_abs:.1e}, {flips} top-1 flips")
    }
}

/// The markdown table of the rows.
pub fn table(rows: &[InvarianceRow]) -> String {
    let mut t = String::from(
        "| attention | matmul | alone vs in a batch | 1 thread vs N |\n|---|---|---|---|\n",
    );
    for r in rows {
        t.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            r.attention,
            r.matmul,
            verdict(
                r.batch_identical,
                r.batch_max_abs,
                r.batch_differing,
                r.logits,
                r.batch_top1_flips
            ),
            verdict(
                r.threads_identical,
                r.threads_max_abs,
                r.threads_differing,
                r.logits,
                r.threads_top1_flips
            ),
        ));
    }
    t
}
