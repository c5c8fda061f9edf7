//! Models as experiments and commands name them: `smollm2` (the GGUF that
//! scripts/fetch-models.sh fetched), a preset, a checkpoint path; and the speculative drafters
//! (`ngram[:N]`, `suffix[:D][:corpus=TEXT]`, the target in a cheaper format, its first N layers, another
//! model) built for a loaded target; the one line of a loaded model's bytes per stored type.
//! Shared by `harness generate`, `harness eval` and the serving, decode and spec experiments.

use crate::error::{HarnessError, Result};
use crate::texts::Text;
use kernel_quant::WeightFormat;
use models::speculative::corpus::CorpusIndex;
use models::speculative::draft::{Drafter, ModelDrafter, NgramDrafter};
use models::speculative::suffix::{SpecLimits, SuffixDrafter};
use models::{load, LoadOptions, SamplerConfig};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// `smollm2`, `qwen2.5-0.5b`, `gemma3-270m` → the fetched GGUF; anything else is passed to
/// `models::load` as is.
pub fn resolve_model(name: &str) -> Result<String> {
    if let Some((_, p)) = models::fetched_models()
        .into_iter()
        .find(|(n, _)| *n == name)
    {
        if !p.exists() {
            return Err(HarnessError::Usage(format!(
                "model {name}: {} is absent (run scripts/fetch-models.sh)",
                p.display()
            )));
        }
        return Ok(p.display().to_string());
    }
    Ok(name.to_string())
}

/// The suffix drafter's default depth: strings of up to 24 tokens indexed, so suffixes of up
/// to 23 are matched.
pub const SUFFIX_DEPTH: usize = 24;

/// A `suffix[:D][:corpus=TEXT][:factor=F][:min_prob=P]` drafter spec: the depth D (at least
/// 2, default `SUFFIX_DEPTH`), the text (a `texts` name or a file) whose tokens it also
/// drafts from, and SuffixDecoding's adaptive speculation limits (off by default; vLLM's
/// defaults are factor=1 and min_prob=0.1).
#[derive(Debug, Clone, PartialEq)]
pub struct SuffixSpec {
    pub depth: usize,
    pub corpus: Option<String>,
    pub limits: SpecLimits,
}

/// Parses a suffix drafter spec; `None` when `spec` names another drafter.
pub fn suffix_spec(spec: &str) -> Option<Result<SuffixSpec>> {
    if spec != "suffix" && !spec.starts_with("suffix:") {
        return None;
    }
    let bad = |why: String| {
        HarnessError::Usage(format!(
            "--spec-draft {spec}: {why} (want suffix[:D][:corpus=TEXT][:factor=F][:min_prob=P])"
        ))
    };
    let mut out = SuffixSpec {
        depth: SUFFIX_DEPTH,
        corpus: None,
        limits: SpecLimits::default(),
    };
    for (i, part) in spec.split(':').skip(1).enumerate() {
        if let Some(read) = out.limits.read_option(part) {
            if let Err(why) = read {
                return Some(Err(bad(why)));
            }
        } else if let Some(text) = part.strip_prefix("corpus=") {
            if text.is_empty() || out.corpus.is_some() {
                return Some(Err(bad("one non-empty corpus=TEXT".into())));
            }
            out.corpus = Some(text.to_string());
        } else if i == 0 {
            match part.parse::<usize>().ok().filter(|&d| d >= 2) {
                Some(d) => out.depth = d,
                None => {
                    return Some(Err(bad(
                        "D (the longest indexed string) must be an integer of at least 2".into(),
                    )))
                }
            }
        } else {
            return Some(Err(bad(format!("unknown option '{part}'"))));
        }
    }
    Some(Ok(out))
}

/// The corpus index of `text` in the tokens of `tokenizer` (`model`'s) for matches below
/// `depth` tokens, built once per process for each (text, model, depth) and shared after.
pub fn corpus_index(
    text: &str,
    model: &str,
    tokenizer: Option<&models::TextTokenizer>,
    depth: usize,
) -> Result<Arc<CorpusIndex>> {
    type Key = (String, String, usize);
    static BUILT: Mutex<Vec<(Key, Arc<CorpusIndex>)>> = Mutex::new(vec![]);
    let tok = tokenizer.ok_or_else(|| {
        HarnessError::Usage(format!(
            "corpus={text}: the target has no tokenizer to read the corpus with"
        ))
    })?;
    let key = (text.to_string(), model.to_string(), depth);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, index)) = built.iter().find(|(k, _)| *k == key) {
        return Ok(index.clone());
    }
    // Its errors speak of texts (`--text` elsewhere): say which option named this one.
    let content = Text::resolve(text, crate::workspace::root().ok().as_deref())
        .map_err(|e| HarnessError::Usage(format!("corpus={text}, read as a text: {e}")))?
        .content;
    // Line by line in parallel (BPE pre-tokenisation splits at newlines anyway).
    let lines: Vec<&str> = content.split_inclusive('\n').collect();
    let tokens: Vec<Vec<u32>> = lines
        .par_chunks(256)
        .map(|chunk| tok.encode(&chunk.concat()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| HarnessError::Usage(format!("corpus={text}: {e}")))?;
    let index = Arc::new(CorpusIndex::new(tokens.concat(), depth));
    built.push((key, index.clone()));
    Ok(index)
}

/// The drafter `spec` names (`ngram[:N]`, `suffix[:D][:corpus=TEXT]`, `self:FORMAT`,
/// `self-layers:N`, a preset or a checkpoint) for `target`, which was loaded from `model` with
/// `opts` (a corpus is read with `tokenizer`, the target's); a model drafter samples with
/// `sampler` and holds `capacity` tokens of its own paged cache.
pub fn drafter(
    model: &str,
    opts: LoadOptions,
    sampler: SamplerConfig,
    target: &models::Llama,
    tokenizer: Option<&models::TextTokenizer>,
    spec: &str,
    capacity: usize,
) -> Result<Box<dyn Drafter>> {
    if spec == "ngram" || spec.starts_with("ngram:") {
        let n = match spec.strip_prefix("ngram:") {
            None => 3,
            Some(v) => v.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
                HarnessError::Usage(format!("--spec-draft {spec}: N must be a positive integer"))
            })?,
        };
        return Ok(Box::new(NgramDrafter::new(n, target.cfg.vocab)));
    }
    if let Some(s) = suffix_spec(spec) {
        let s = s?;
        let vocab = target.cfg.vocab;
        let d = match &s.corpus {
            None => SuffixDrafter::new(s.depth, vocab),
            Some(text) => SuffixDrafter::with_corpus(
                s.depth,
                vocab,
                corpus_index(text, model, tokenizer, s.depth)?,
            ),
        };
        return Ok(Box::new(d.with_limits(s.limits)));
    }
    let mut opts = opts;
    let mut keep = None;
    let source = if let Some(fmt) = spec.strip_prefix("self:") {
        opts.weights = Some(WeightFormat::parse(fmt)?);
        model.to_string()
    } else if let Some(n) = spec.strip_prefix("self-layers:") {
        keep = Some(n.parse::<usize>().map_err(|_| {
            HarnessError::Usage(format!("--spec-draft {spec}: N must be a positive integer"))
        })?);
        model.to_string()
    } else {
        spec.to_string()
    };
    let mut model = load(&source, &opts)?.model;
    if let Some(n) = keep {
        model
            .keep_layers(n)
            .map_err(|e| HarnessError::Usage(format!("--spec-draft {spec}: {e}")))?;
    }
    Ok(Box::new(ModelDrafter::new(model, spec, capacity, sampler)?))
}

/// The bytes a loaded model holds per stored type, largest first.
pub fn weight_bytes_by_type(m: &models::Llama) -> std::collections::BTreeMap<String, usize> {
    m.bytes_by_format()
        .into_iter()
        .map(|(f, n)| (f.to_string(), n))
        .collect()
}

/// "weights: 374.2 MB — q5_0 260.1, q8_0 61.2, q6_k 30.9, f32 2.4" (MB = 10⁶ bytes).
pub fn weights_line(m: &models::Llama) -> String {
    let by = m.bytes_by_format();
    let total: usize = by.iter().map(|(_, n)| n).sum();
    let parts: Vec<String> = by
        .iter()
        .map(|(f, n)| format!("{f} {:.1}", *n as f64 / 1e6))
        .collect();
    format!(
        "weights: {:.1} MB — {}",
        total as f64 / 1e6,
        parts.join(", ")
    )
}
