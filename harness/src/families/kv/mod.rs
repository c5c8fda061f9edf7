//! `harness exp` for the kv family: an exact KV-cache calculator over the published model
//! shapes (`models::PRESETS`) — bytes per token = 2 × layers × kv_heads × head_dim × bytes per
//! element, per sequence, per batch of sessions — with the attention layout as published or
//! rewritten as MHA, MQA or N KV groups. No timing: the numbers are arithmetic, written with
//! the same provenance as every run.

use crate::error::{HarnessError, Result};
use crate::family::{listed, one_of, ExpFamily, Family};
use crate::provenance::Provenance;
use crate::render::{report, Rendered};
use crate::row::{Head, Row};
use crate::run_files::{ExpRequest, GridValues, RunFiles};
use crate::spec::ExperimentSpec;
use crate::sweep::PointKey;
use models::ModelShape;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

pub const FAMILY: Family = Family {
    name: "kv",
    about: "the exact KV-cache size calculator over published model shapes",
    variants: || listed("kv", VARIANTS),
    check: None,
    exp: Some(ExpFamily {
        grid_keys: GRID_KEYS,
        variant: |v| one_of("kv", VARIANTS, v),
        run,
        render,
        peers: false,
    }),
    cuda: &[],
    replay: None,
};

/// The variants of this family's experiments.
pub const VARIANTS: &[kernel_common::VariantInfo] = &[kernel_common::VariantInfo::cpu(
    "calculator",
    "bytes of K and V per token and per session, by attention layout and cache dtype",
)];

/// Grid keys a kv (KV-cache calculator) experiment understands.
pub const GRID_KEYS: &[(&str, &str)] = &[
    (
        "model",
        "a preset: llama-2-7b | llama-2-13b | llama-2-70b | mixtral-8x7b | smollm2-135m",
    ),
    (
        "attention",
        "model (KV heads as published) | mha | mqa | g<N> (N KV heads)",
    ),
    (
        "dtype",
        "f32 | f16 | bf16 | fp8 | int8 (bytes per cached element)",
    ),
    ("seq_len", "tokens per sequence"),
    ("sessions", "sequences held at once"),
];

/// One model × layout × dtype × length × sessions. Column names are stable.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KvCols {
    pub model: String,
    /// model (as published) | mha | mqa | g<N>
    pub attention: String,
    pub layers: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub dtype: String,
    pub bytes_per_element: f64,
    pub kv_bytes_per_token: f64,
    pub kv_kib_per_token: f64,
    pub seq_len: usize,
    pub sessions: usize,
    pub total_bytes: f64,
    pub total_gib: f64,
    /// 1 − kv_heads / q_heads: the saving over MHA of the same model.
    pub saving_vs_mha: f64,
}

/// A row: the shared head, these columns, the note.
pub type KvRow = Row<KvCols>;

fn bytes_of(dtype: &str) -> Result<f64> {
    match dtype {
        "f32" => Ok(4.0),
        "f16" | "bf16" => Ok(2.0),
        "fp8" | "int8" => Ok(1.0),
        o => Err(HarnessError::Usage(format!(
            "dtype '{o}' is not f32, f16, bf16, fp8 or int8"
        ))),
    }
}

fn layout(shape: &ModelShape, attention: &str) -> Result<usize> {
    let kv = match attention {
        "model" => shape.kv_heads,
        "mha" => shape.q_heads,
        "mqa" => 1,
        g => match g.strip_prefix('g').and_then(|n| n.parse::<usize>().ok()) {
            Some(n) if n > 0 => n,
            _ => {
                return Err(HarnessError::Usage(format!(
                    "attention '{g}' is not model, mha, mqa or g<N> (N KV heads)"
                )))
            }
        },
    };
    Ok(kv)
}

/// Runs a kv-family experiment (called by `exp::run` once the spec and grid are loaded).
pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, spec_path, grid) = (req.opts, req.spec, req.spec_path, req.grid.clone());
    let g = GridValues(&grid);
    let seq_lens = g.counts("seq_len", &["4096"])?;
    let session_counts = g.counts("sessions", &["1"])?;
    let mut points = vec![];
    for m in g.strings("model", &["llama-2-7b"]) {
        let shape = models::preset(&m).ok_or_else(|| {
            let known: Vec<&str> = models::PRESETS.iter().map(|p| p.name).collect();
            HarnessError::Usage(format!("unknown model '{m}' (known: {})", known.join(", ")))
        })?;
        for a in g.strings("attention", &["model"]) {
            let kv = layout(&shape, &a)?;
            for dt in g.strings("dtype", &["f16"]) {
                let bytes = bytes_of(&dt)?;
                for &len in &seq_lens {
                    for &sessions in &session_counts {
                        let shaped = ModelShape {
                            kv_heads: kv,
                            ..shape
                        };
                        points.push((shaped, a.clone(), dt.clone(), bytes, len, sessions));
                    }
                }
            }
        }
    }
    let mut run = RunFiles::start(opts, spec, spec_path, grid)?;
    let bar = run.progress_bar(points.len());
    for (shape, attention, dtype, bytes, seq_len, sessions) in points {
        let key = PointKey::of(&[
            ("model", &shape.name),
            ("attention", &attention),
            ("dtype", &dtype),
            ("seq_len", &seq_len),
            ("sessions", &sessions),
        ]);
        if !run.owns(&key) {
            continue;
        }
        let fits = shape.kv_heads <= shape.q_heads && shape.q_heads % shape.kv_heads == 0;
        let per_token = if fits {
            shape.kv_bytes_per_token(bytes)
        } else {
            f64::NAN
        };
        let total = per_token * seq_len as f64 * sessions as f64;
        let row = Row {
            head: Head {
                status: if fits { "ok" } else { "skipped" }.into(),
                ..run.head("calculator", opts.seed)
            },
            cols: KvCols {
                model: shape.name.into(),
                attention,
                layers: shape.layers,
                q_heads: shape.q_heads,
                kv_heads: shape.kv_heads,
                head_dim: shape.head_dim,
                dtype,
                bytes_per_element: bytes,
                kv_bytes_per_token: per_token,
                kv_kib_per_token: per_token / 1024.0,
                seq_len,
                sessions,
                total_bytes: total,
                total_gib: total / (1u64 << 30) as f64,
                saving_vs_mha: 1.0 - shape.kv_heads as f64 / shape.q_heads as f64,
            },
            note: if fits {
                String::new()
            } else {
                format!(
                    "{} KV heads do not divide the {} query heads",
                    shape.kv_heads, shape.q_heads
                )
            },
        };
        run.write_point(&key, [&row])?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, 0, render)
}

/// This family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<KvCols>(spec, csv, prov, |_, rows| tables(rows))
}

/// The markdown table of a kv run.
pub fn tables(rows: &[KvRow]) -> String {
    let mut md = String::from("## KV cache sizes\n\n| model | layout | layers | heads q/kv | head dim | dtype | KiB/token | tokens | sessions | total GiB | saving vs MHA |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows.iter().filter(|r| r.head.status == "ok") {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {}/{} | {} | {} | {:.2} | {} | {} | {:.3} | {:.1}% |",
            r.model,
            r.attention,
            r.layers,
            r.q_heads,
            r.kv_heads,
            r.head_dim,
            r.dtype,
            r.kv_kib_per_token,
            r.seq_len,
            r.sessions,
            r.total_gib,
            100.0 * r.saving_vs_mha
        );
    }
    let mut skipped: Vec<String> = rows
        .iter()
        .filter(|r| r.head.status != "ok")
        .map(|r| {
            format!(
                "{} {}: {} ({})",
                r.model, r.attention, r.head.status, r.note
            )
        })
        .collect();
    skipped.dedup();
    for line in skipped {
        let _ = writeln!(md, "\n{line}");
    }
    md.push('\n');
    md
}
