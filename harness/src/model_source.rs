//! Models as experiments and commands name them: `smollm2` (the GGUF that
//! scripts/fetch-models.sh fetched), a preset, a checkpoint path; and the speculative drafters
//! (`ngram[:N]`, `suffix[:D]`, the target in a cheaper format, its first N layers, another
//! model) built for a loaded target; the one line of a loaded model's bytes per stored type.
//! Shared by `harness generate`, `harness eval` and the serving, decode and spec experiments.

use crate::error::{HarnessError, Result};
use kernel_quant::WeightFormat;
use models::speculative::draft::{Drafter, ModelDrafter, NgramDrafter};
use models::speculative::suffix::SuffixDrafter;
use models::{load, LoadOptions, SamplerConfig};

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

/// The depth D of a `suffix[:D]` drafter spec (at least 2, default `SUFFIX_DEPTH`); `None`
/// when `spec` names another drafter.
pub fn suffix_depth(spec: &str) -> Option<Result<usize>> {
    if spec != "suffix" && !spec.starts_with("suffix:") {
        return None;
    }
    Some(match spec.strip_prefix("suffix:") {
        None => Ok(SUFFIX_DEPTH),
        Some(v) => v.parse::<usize>().ok().filter(|&d| d >= 2).ok_or_else(|| {
            HarnessError::Usage(format!(
                "--spec-draft {spec}: D (the longest indexed string) must be an integer of at least 2"
            ))
        }),
    })
}

/// The drafter `spec` names (`ngram[:N]`, `suffix[:D]`, `self:FORMAT`, `self-layers:N`, a
/// preset or a checkpoint) for `target`, which was loaded from `model` with `opts`; a model drafter samples
/// with `sampler` and holds `capacity` tokens of its own paged cache.
pub fn drafter(
    model: &str,
    opts: LoadOptions,
    sampler: SamplerConfig,
    target: &models::Llama,
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
    if let Some(d) = suffix_depth(spec) {
        return Ok(Box::new(SuffixDrafter::new(d?, target.cfg.vocab)));
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
