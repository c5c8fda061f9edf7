//! One perplexity evaluation as the harness runs it (`harness eval perplexity`, the accuracy
//! family's experiments): a model over a text's token windows (`models::eval::perplexity`),
//! with the KL divergence and top-1 agreement against a reference run's log-probabilities —
//! kept in memory, or saved to and read from a reference-logits file (safetensors: tensor
//! `logprobs` f32 [scored rows, vocab], and in its metadata the model's and the text's sha256,
//! the window settings and the vocabulary, so a file of another model, text or window is
//! refused in one line, llama.cpp's `--kl-divergence-base` with a check it lacks).

use crate::error::{HarnessError, Result};
use indicatif::ProgressBar;
use models::eval::perplexity::{evaluate_chunked, KlStats, PplStats, Window};
use models::Llama;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// What a reference run was of.
#[derive(Debug, Clone, PartialEq)]
pub struct RefMeta {
    /// The model file's sha256 (or the preset's name).
    pub model: String,
    pub text_sha256: String,
    pub ctx: usize,
    pub stride: usize,
    pub windows: usize,
    pub vocab: usize,
}

impl RefMeta {
    fn to_map(&self) -> Vec<(&'static str, String)> {
        vec![
            ("model", self.model.clone()),
            ("text_sha256", self.text_sha256.clone()),
            ("ctx", self.ctx.to_string()),
            ("stride", self.stride.to_string()),
            ("windows", self.windows.to_string()),
            ("vocab", self.vocab.to_string()),
        ]
    }

    fn from_map(m: &HashMap<String, String>, path: &Path) -> Result<RefMeta> {
        let bad = |k: &str| {
            HarnessError::Usage(format!(
                "{}: not a reference-logits file (no '{k}' in its metadata)",
                path.display()
            ))
        };
        let s = |k: &str| m.get(k).cloned().ok_or_else(|| bad(k));
        let n = |k: &str| s(k)?.parse::<usize>().map_err(|_| bad(k));
        Ok(RefMeta {
            model: s("model")?,
            text_sha256: s("text_sha256")?,
            ctx: n("ctx")?,
            stride: n("stride")?,
            windows: n("windows")?,
            vocab: n("vocab")?,
        })
    }
}

/// A reference run's log-probabilities, row after row.
pub struct RefLogits {
    pub meta: RefMeta,
    pub logprobs: Vec<f32>,
}

impl RefLogits {
    /// Its scored rows.
    pub fn rows(&self) -> usize {
        self.logprobs.len() / self.meta.vocab.max(1)
    }

    /// Writes it as safetensors (streamed: the rows are not copied).
    pub fn save(&self, path: &Path) -> Result<()> {
        let io =
            |e: std::io::Error| HarnessError::Usage(format!("writing {}: {e}", path.display()));
        let meta: serde_json::Map<String, serde_json::Value> = self
            .meta
            .to_map()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into()))
            .collect();
        let bytes = self.logprobs.len() * 4;
        let header = serde_json::json!({
            "__metadata__": meta,
            "logprobs": {"dtype": "F32", "shape": [self.rows(), self.meta.vocab], "data_offsets": [0, bytes]},
        })
        .to_string();
        let mut header = header.into_bytes();
        header.resize(header.len().div_ceil(8) * 8, b' ');
        let tmp = path.with_extension("partial");
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
        f.write_all(&(header.len() as u64).to_le_bytes())
            .map_err(io)?;
        f.write_all(&header).map_err(io)?;
        for v in &self.logprobs {
            f.write_all(&v.to_le_bytes()).map_err(io)?;
        }
        f.flush().map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads a file `save` wrote; anything else is one line naming the problem.
    pub fn load(path: &Path) -> Result<RefLogits> {
        let bytes = std::fs::read(path).map_err(|e| {
            HarnessError::Usage(format!("--reference-logits {}: {e}", path.display()))
        })?;
        let bad = |why: String| HarnessError::Usage(format!("{}: {why}", path.display()));
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(format!("not a safetensors file ({e})")))?;
        let meta = RefMeta::from_map(header.metadata().as_ref().unwrap_or(&HashMap::new()), path)?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| bad(format!("not a safetensors file ({e})")))?;
        let t = st
            .tensor("logprobs")
            .map_err(|_| bad("no tensor 'logprobs'".into()))?;
        if t.dtype() != safetensors::Dtype::F32
            || t.shape().len() != 2
            || t.shape()[1] != meta.vocab
        {
            return Err(bad(format!(
                "'logprobs' is {:?} {:?}, expected F32 [rows, {}]",
                t.dtype(),
                t.shape(),
                meta.vocab
            )));
        }
        let logprobs = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(RefLogits { meta, logprobs })
    }

    /// Fails with one line unless this reference is of `want` (model, text, windows).
    pub fn check(&self, want: &RefMeta, path: &Path) -> Result<()> {
        let m = &self.meta;
        let what = if m.model != want.model {
            Some(format!("model {} (this run: {})", m.model, want.model))
        } else if m.text_sha256 != want.text_sha256 {
            Some(format!(
                "a text with sha256 {} (this run: {})",
                m.text_sha256, want.text_sha256
            ))
        } else if (m.ctx, m.stride, m.windows) != (want.ctx, want.stride, want.windows) {
            Some(format!(
                "--ctx {} --stride {} over {} windows (this run: {} {} {})",
                m.ctx, m.stride, m.windows, want.ctx, want.stride, want.windows
            ))
        } else if m.vocab != want.vocab {
            Some(format!(
                "a vocabulary of {} (this run: {})",
                m.vocab, want.vocab
            ))
        } else {
            None
        };
        match what {
            Some(w) => Err(HarnessError::Usage(format!(
                "--reference-logits {}: the reference is of {w}",
                path.display()
            ))),
            None => Ok(()),
        }
    }
}

/// What one evaluation measured.
pub struct Outcome {
    pub stats: PplStats,
    /// Against the reference, when one was given.
    pub kl: Option<KlStats>,
    /// This run's log-probabilities, when asked to keep them.
    pub kept: Option<Vec<f32>>,
    /// Tokens run through the model (every window's, scored or not).
    pub tokens_run: usize,
    pub seconds: f64,
}

impl Outcome {
    /// Tokens run per second (prefill speed over the windows).
    pub fn tokens_per_s(&self) -> f64 {
        self.tokens_run as f64 / self.seconds.max(1e-9)
    }
}

/// Evaluates `model` over `windows` of `tokens`: KL against `reference` (whose rows must be
/// these windows' scored rows), keeping this run's log-probabilities if `keep`; the bar
/// advances one per window.
pub fn run(
    model: &Llama,
    tokens: &[u32],
    windows: &[Window],
    reference: Option<&RefLogits>,
    keep: bool,
    bar: &ProgressBar,
) -> Result<Outcome> {
    run_chunked(model, tokens, windows, usize::MAX, reference, keep, bar)
}

/// `run` with each window prefilled in pieces of `prefill_chunk` tokens
/// (`evaluate_chunked`).
pub fn run_chunked(
    model: &Llama,
    tokens: &[u32],
    windows: &[Window],
    prefill_chunk: usize,
    reference: Option<&RefLogits>,
    keep: bool,
    bar: &ProgressBar,
) -> Result<Outcome> {
    let vocab = model.cfg.vocab;
    let scored: usize = windows.iter().map(Window::scored).sum();
    if let Some(r) = reference {
        if r.rows() != scored || r.meta.vocab != vocab {
            return Err(HarnessError::Usage(format!(
                "the reference has {} rows of {}, this run scores {scored} of {vocab}",
                r.rows(),
                r.meta.vocab
            )));
        }
    }
    let mut kl = reference.map(|_| KlStats::default());
    let mut kept = keep.then(|| Vec::with_capacity(scored * vocab));
    let mut row = 0;
    let started = Instant::now();
    let stats = evaluate_chunked(
        model,
        tokens,
        windows,
        16,
        prefill_chunk,
        |r| {
            if let (Some(kl), Some(reference)) = (kl.as_mut(), reference) {
                kl.add(
                    &reference.logprobs[row * vocab..(row + 1) * vocab],
                    r.logprobs,
                );
            }
            if let Some(k) = kept.as_mut() {
                k.extend_from_slice(r.logprobs);
            }
            row += 1;
        },
        |_| bar.inc(1),
    )?;
    Ok(Outcome {
        stats,
        kl,
        kept,
        tokens_run: windows.iter().map(|w| w.len).sum(),
        seconds: started.elapsed().as_secs_f64(),
    })
}
