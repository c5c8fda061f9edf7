//! Experiment specs are data: `experiments/<name>.toml` holds the question, the claim ids it
//! bears on, the variants, the grid (every key a list; the run is their cartesian product),
//! the `--quick` replacements, the per-point limits and the plot. This module parses and
//! validates a spec and expands the grid into attention problems before anything runs.

use crate::error::{HarnessError, Result};
use attention_kernels::AttentionShape;
use kernel_common::DType;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Grid keys an attention experiment understands, with what each means.
pub const GRID_KEYS: &[(&str, &str)] = &[
    ("mode", "decode (q_len 1) | append (q_len = append_len < kv_len, causal) | prefill (q_len = kv_len)"),
    ("dtype", "f32 | f16 | bf16 (storage; accumulation is f32)"),
    ("batch", "sequences per call"),
    ("q_heads", "query heads"),
    ("heads", "mha | gqa (kv = q/4) | mqa (kv = 1) | Q/KV explicit, e.g. 32/8"),
    ("kv_len", "context length (keys per sequence)"),
    ("append_len", "new tokens per sequence in append mode"),
    ("head_dim", "dimension of each head"),
    ("causal", "true | false (prefill only; decode/append are causal by position)"),
];

/// Grid keys a quant experiment understands.
pub const QUANT_GRID_KEYS: &[(&str, &str)] = &[
    (
        "format",
        "f32 | f16 | q8_0 | q4_0 | q4_1 | sym<bits>g<group>[s32] | asym<bits>g<group>[s32]",
    ),
    (
        "shape",
        "ROWSxCOLS of the weight matrix (out × in), e.g. 4096x11008",
    ),
    (
        "weights",
        "gaussian | outliers (8 input channels × 50) | outliers:CHANNELS:SCALE",
    ),
    ("batch", "activation vectors per call (1 = GEMV, decode)"),
];

/// Grid keys a moe experiment understands.
pub const MOE_GRID_KEYS: &[(&str, &str)] = &[
    (
        "capacity",
        "capacity factor > 0 (slots = ceil(tokens·k·factor/experts)) | dropless",
    ),
    (
        "skew",
        "router skew s >= 0: bias -s·ln(rank+1) per expert (0 = none)",
    ),
    ("top_k", "experts per token, 1..=experts"),
    ("experts", "number of experts"),
    ("tokens", "tokens per call"),
    ("d_model", "model width"),
    ("d_ff", "expert hidden width (SwiGLU)"),
    (
        "policy",
        "score (keep the highest router scores) | order (keep the first tokens)",
    ),
    ("norm", "renormalize (Mixtral) | raw (Switch)"),
];

/// Grid keys a kv (KV-cache calculator) experiment understands.
pub const KV_GRID_KEYS: &[(&str, &str)] = &[
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

/// Grid keys a kv_alloc (allocation simulation) experiment understands.
pub const KV_ALLOC_GRID_KEYS: &[(&str, &str)] = &[
    ("block_size", "paged block size in tokens (swept)"),
    (
        "system_prompt",
        "tokens of a system prompt shared by every request (swept)",
    ),
    ("budget_tokens", "KV slots of the budget (one value)"),
    (
        "max_new",
        "most output tokens per request; contiguous reserves prompt + this",
    ),
    ("requests", "requests queued at once"),
    ("prompt_mean", "mean prompt tokens (log-normal, sigma 1)"),
    ("output_mean", "mean output tokens (log-normal, sigma 1)"),
];

/// Grid keys a serving (batching) experiment understands.
pub const SERVING_GRID_KEYS: &[(&str, &str)] = &[
    (
        "model",
        "smollm2 (the fetched GGUF) | a preset | a checkpoint path",
    ),
    (
        "mode",
        "static | dynamic:<window ms> | continuous | continuous-chunked",
    ),
    (
        "load",
        "offered rate as a fraction of the model's saturated capacity",
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

/// Grid keys a decode (roofline) experiment understands.
pub const DECODE_GRID_KEYS: &[(&str, &str)] = &[
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

/// Grid keys a spec (speculative decoding) experiment understands.
pub const SPEC_GRID_KEYS: &[(&str, &str)] = &[
    (
        "model",
        "smollm2 (the fetched GGUF) | a checkpoint with a tokenizer (one value)",
    ),
    (
        "drafter",
        "ngram[:N] | self:FORMAT | self-layers:N | a preset or checkpoint",
    ),
    (
        "tree",
        "chain:K | static:B1,B2,... (in --set: static:B1/B2/...) | dynamic:N",
    ),
    ("temperature", "0 (greedy) or a sampling temperature"),
    ("prompt", "prose | code | repetitive"),
    ("max_new", "tokens generated per run (one value)"),
    (
        "adaptive",
        "off | on: adapt the draft depth to the running acceptance (70%)",
    ),
];

/// Families an experiment spec may name.
pub const EXPERIMENT_FAMILIES: &[&str] = &[
    "attention",
    "quant",
    "moe",
    "kv",
    "kv_alloc",
    "serving",
    "decode",
    "spec",
];

/// The grid keys of `family`'s experiments.
pub fn grid_keys(family: &str) -> &'static [(&'static str, &'static str)] {
    match family {
        "quant" => QUANT_GRID_KEYS,
        "moe" => MOE_GRID_KEYS,
        "kv" => KV_GRID_KEYS,
        "kv_alloc" => KV_ALLOC_GRID_KEYS,
        "serving" => SERVING_GRID_KEYS,
        "decode" => DECODE_GRID_KEYS,
        "spec" => SPEC_GRID_KEYS,
        _ => GRID_KEYS,
    }
}

/// A spec file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentSpec {
    pub name: String,
    pub question: String,
    pub claims: Vec<String>,
    pub family: String,
    pub variants: Vec<String>,
    /// The variants `--device cuda` runs when no `--variant` is given.
    #[serde(default)]
    pub cuda_variants: Vec<String>,
    pub grid: BTreeMap<String, Vec<toml::Value>>,
    #[serde(default)]
    pub quick: BTreeMap<String, Vec<toml::Value>>,
    #[serde(default)]
    pub limits: Limits,
    /// Limits that replace `limits` under `--device cuda` (a GPU's memory and speed).
    #[serde(default)]
    pub cuda_limits: Option<Limits>,
    #[serde(default)]
    pub reps: Option<usize>,
    pub plot: PlotSpec,
    /// More plots, written as `<run-id>-2.svg`, `-3.svg`, ...
    #[serde(default)]
    pub extra_plots: Vec<PlotSpec>,
    #[serde(default)]
    pub report: ReportSpec,
}

/// Points over these limits are recorded as skipped instead of run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest useful GFLOP count of one call.
    #[serde(default = "default_max_gflop")]
    pub max_gflop: f64,
    /// Largest K+V size in MiB (the paged pool is a second copy).
    #[serde(default = "default_max_kv_mib")]
    pub max_kv_mib: f64,
    /// Largest score-matrix workspace naive may allocate, in MiB (per running head × threads).
    #[serde(default = "default_max_scores_mib")]
    pub max_scores_mib: f64,
    /// Seconds of timed repetitions per point before stopping early (at least 3 reps run).
    #[serde(default = "default_seconds_per_point")]
    pub seconds_per_point: f64,
}

fn default_max_gflop() -> f64 {
    100.0
}
fn default_max_kv_mib() -> f64 {
    1024.0
}
fn default_max_scores_mib() -> f64 {
    4096.0
}
fn default_seconds_per_point() -> f64 {
    2.0
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_gflop: default_max_gflop(),
            max_kv_mib: default_max_kv_mib(),
            max_scores_mib: default_max_scores_mib(),
            seconds_per_point: default_seconds_per_point(),
        }
    }
}

/// What the SVG shows: one panel per value of `panel`, one line per value of `series`,
/// `x` on the horizontal axis and `y[panel value]` (or `y["*"]`) vertically, rows filtered by
/// `filter` (column = value, or any of `v1|v2|...`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlotSpec {
    pub x: String,
    pub panel: String,
    pub series: String,
    pub y: BTreeMap<String, String>,
    #[serde(default)]
    pub filter: BTreeMap<String, String>,
    #[serde(default = "yes")]
    pub log_x: bool,
    /// Logarithmic vertical axis (errors spanning decades).
    #[serde(default)]
    pub log_y: bool,
    /// Where the legend goes: upper_left (default), upper_right, lower_left, lower_right.
    #[serde(default = "upper_left")]
    pub legend: String,
}

fn upper_left() -> String {
    "upper_left".into()
}

fn yes() -> bool {
    true
}

/// Extra tables in the markdown report.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSpec {
    /// Variant whose time the others are compared with (speed-up = its time / theirs).
    #[serde(default)]
    pub baseline: Option<String>,
}

/// Attention-specific view of one grid point.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub mode: String,
    pub dtype: DType,
    pub shape: AttentionShape,
}

impl ExperimentSpec {
    /// Loads `experiments/<name>.toml` (or a path ending in .toml).
    pub fn load(dir: &Path, name: &str) -> Result<(ExperimentSpec, PathBuf)> {
        let path = if name.ends_with(".toml") {
            PathBuf::from(name)
        } else {
            dir.join(format!("{name}.toml"))
        };
        let text = std::fs::read_to_string(&path).map_err(|e| {
            HarnessError::Usage(format!(
                "unknown experiment '{name}': cannot read {} ({e}); `harness list` shows the experiments",
                path.display()
            ))
        })?;
        let spec: ExperimentSpec = toml::from_str(&text).map_err(|e| {
            HarnessError::Usage(format!(
                "{}: {}",
                path.display(),
                e.message().replace('\n', " ")
            ))
        })?;
        spec.validate_static()?;
        Ok((spec, path))
    }

    /// Every experiment spec under `dir`, sorted by name.
    pub fn list(dir: &Path) -> Result<Vec<ExperimentSpec>> {
        let mut out = vec![];
        let entries = std::fs::read_dir(dir)
            .map_err(|e| HarnessError::Usage(format!("cannot read {}: {e}", dir.display())))?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        paths.sort();
        for p in paths {
            out.push(Self::load(dir, &p.to_string_lossy())?.0);
        }
        Ok(out)
    }

    fn validate_static(&self) -> Result<()> {
        let bad = |m: String| {
            Err(HarnessError::Usage(format!(
                "experiment '{}': {m}",
                self.name
            )))
        };
        if !EXPERIMENT_FAMILIES.contains(&self.family.as_str()) {
            return bad(format!(
                "unknown family '{}' (known: {})",
                self.family,
                EXPERIMENT_FAMILIES.join(", ")
            ));
        }
        let keys = grid_keys(&self.family);
        for key in self.grid.keys().chain(self.quick.keys()) {
            if !keys.iter().any(|(k, _)| k == key) {
                return bad(format!("unknown grid key '{key}'"));
            }
        }
        if self.variants.is_empty() {
            return bad("no variants".into());
        }
        for v in &self.variants {
            match self.family.as_str() {
                "quant" => {
                    crate::registry::quant_variant(v)?;
                }
                "moe" => {
                    crate::registry::moe_variant(v)?;
                }
                "kv" if v == "calculator" => {}
                "kv_alloc" if ["contiguous", "paged", "paged+sharing"].contains(&v.as_str()) => {}
                "serving" if v == "engine" => {}
                "decode" if v == "model" => {}
                "spec" if v == "driver" => {}
                "kv_alloc" | "serving" | "decode" | "spec" => {
                    return bad(format!(
                        "'{v}' is not a variant of a {} experiment (kv_alloc: contiguous, paged, paged+sharing; serving: engine; decode: model; spec: driver)",
                        self.family
                    ))
                }
                "kv" => {
                    return bad(format!(
                        "a kv experiment has one variant, 'calculator', not '{v}'"
                    ))
                }
                _ => {
                    crate::registry::attention_kernel(v)?;
                }
            }
        }
        if self.claims.iter().any(|c| !is_claim_id(c)) {
            return bad("claims must be ids like C8".into());
        }
        Ok(())
    }

    /// The grid after `--quick` and `--set` replacements; fails on unknown keys or bad values.
    pub fn resolve_grid(
        &self,
        quick: bool,
        sets: &[(String, Vec<String>)],
    ) -> Result<BTreeMap<String, Vec<String>>> {
        let mut grid: BTreeMap<String, Vec<String>> = self
            .grid
            .iter()
            .map(|(k, vs)| (k.clone(), vs.iter().map(value_text).collect()))
            .collect();
        if quick {
            for (k, vs) in &self.quick {
                grid.insert(k.clone(), vs.iter().map(value_text).collect());
            }
        }
        let keys = grid_keys(&self.family);
        for (k, vs) in sets {
            if !keys.iter().any(|(g, _)| g == k) {
                let known: Vec<&str> = keys.iter().map(|(g, _)| *g).collect();
                return Err(HarnessError::Usage(format!(
                    "unknown --set key '{k}' (known: {})",
                    known.join(", ")
                )));
            }
            grid.insert(k.clone(), vs.clone());
        }
        Ok(grid)
    }

    /// Expands a resolved grid into points, validating every value and every shape.
    pub fn points(grid: &BTreeMap<String, Vec<String>>) -> Result<Vec<Point>> {
        let list = |key: &str, default: &str| -> Vec<String> {
            grid.get(key)
                .cloned()
                .unwrap_or_else(|| vec![default.to_string()])
        };
        let num = |key: &str, v: &str| -> Result<usize> {
            v.parse::<usize>().map_err(|_| {
                HarnessError::Usage(format!(
                    "--set/grid {key}='{v}' is not a non-negative integer"
                ))
            })
        };
        let mut points = vec![];
        for mode in list("mode", "decode") {
            if !["decode", "append", "prefill"].contains(&mode.as_str()) {
                return Err(HarnessError::Usage(format!(
                    "mode '{mode}' is not decode, append or prefill"
                )));
            }
            for dt in list("dtype", "f32") {
                let dtype = DType::parse(&dt).map_err(|e| HarnessError::Usage(e.to_string()))?;
                for batch in list("batch", "1") {
                    for qh in list("q_heads", "32") {
                        for heads in list("heads", "gqa") {
                            for kv_len in list("kv_len", "1024") {
                                for append_len in list("append_len", "16") {
                                    for head_dim in list("head_dim", "128") {
                                        for causal in list("causal", "true") {
                                            let q_heads = num("q_heads", &qh)?;
                                            let kv_heads = parse_heads(&heads, q_heads)?;
                                            let kv_len = num("kv_len", &kv_len)?;
                                            let causal = match causal.as_str() {
                                                "true" => true,
                                                "false" => false,
                                                o => {
                                                    return Err(HarnessError::Usage(format!(
                                                        "causal '{o}' is not true or false"
                                                    )))
                                                }
                                            };
                                            let (q_len, causal) = match mode.as_str() {
                                                "decode" => (1, true),
                                                "append" => {
                                                    let n = num("append_len", &append_len)?;
                                                    if n >= kv_len {
                                                        continue; // not an append: it would be a prefill
                                                    }
                                                    (n, true)
                                                }
                                                _ => (kv_len, causal),
                                            };
                                            let shape = AttentionShape::new(
                                                num("batch", &batch)?,
                                                q_heads,
                                                kv_heads,
                                                q_len,
                                                kv_len,
                                                num("head_dim", &head_dim)?,
                                                causal,
                                            );
                                            shape.validate().map_err(|e| {
                                                HarnessError::Usage(format!(
                                                    "{mode} {}: {e}",
                                                    shape.label()
                                                ))
                                            })?;
                                            let p = Point {
                                                mode: mode.clone(),
                                                dtype,
                                                shape,
                                            };
                                            if !points.contains(&p) {
                                                points.push(p);
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(points)
    }
}

/// `mha`, `gqa`, `mqa` or `Q/KV` → number of KV heads for `q_heads` query heads.
pub fn parse_heads(text: &str, q_heads: usize) -> Result<usize> {
    match text {
        "mha" => Ok(q_heads),
        "gqa" => Ok((q_heads / 4).max(1)),
        "mqa" => Ok(1),
        _ => {
            let parsed = text
                .split_once('/')
                .and_then(|(q, kv)| Some((q.parse::<usize>().ok()?, kv.parse::<usize>().ok()?)));
            match parsed {
                Some((q, kv)) if q == q_heads => Ok(kv),
                Some((q, _)) => Err(HarnessError::Usage(format!(
                    "heads '{text}' names {q} query heads but q_heads is {q_heads}"
                ))),
                None => Err(HarnessError::Usage(format!(
                    "heads '{text}' is not mha, gqa, mqa or Q/KV"
                ))),
            }
        }
    }
}

fn is_claim_id(c: &str) -> bool {
    c.strip_prefix('C')
        .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| (1..=27).contains(&n)))
}

fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Parses `key=v1,v2` from `--set`.
pub fn parse_set(text: &str) -> Result<(String, Vec<String>)> {
    let (k, vs) = text
        .split_once('=')
        .ok_or_else(|| HarnessError::Usage(format!("--set '{text}' must look like key=v1,v2")))?;
    let values: Vec<String> = vs.split(',').map(str::trim).map(String::from).collect();
    if k.is_empty() || values.iter().any(String::is_empty) {
        return Err(HarnessError::Usage(format!(
            "--set '{text}' has an empty key or value"
        )));
    }
    Ok((k.to_string(), values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_and_sets() {
        assert_eq!(parse_heads("mha", 32).unwrap(), 32);
        assert_eq!(parse_heads("gqa", 32).unwrap(), 8);
        assert_eq!(parse_heads("mqa", 32).unwrap(), 1);
        assert_eq!(parse_heads("32/4", 32).unwrap(), 4);
        assert!(parse_heads("16/4", 32).is_err());
        assert!(parse_heads("many", 32).is_err());
        assert_eq!(
            parse_set("kv_len=1,2").unwrap(),
            ("kv_len".into(), vec!["1".into(), "2".into()])
        );
        assert!(parse_set("kv_len").is_err());
        assert!(parse_set("kv_len=1,").is_err());
        assert!(is_claim_id("C8") && !is_claim_id("C28") && !is_claim_id("X1"));
    }

    #[test]
    fn points_validate_shapes() {
        let mut grid = BTreeMap::new();
        grid.insert(
            "mode".to_string(),
            vec!["decode".to_string(), "prefill".to_string()],
        );
        grid.insert("kv_len".to_string(), vec!["64".to_string()]);
        let pts = ExperimentSpec::points(&grid).unwrap();
        assert_eq!(pts.len(), 2);
        assert_eq!(pts[0].shape.q_len, 1);
        assert_eq!(pts[1].shape.q_len, 64);
        grid.insert("heads".to_string(), vec!["32/3".to_string()]);
        let err = ExperimentSpec::points(&grid).unwrap_err().to_string();
        assert!(
            err.contains("kv_heads (3) must divide q_heads (32)"),
            "{err}"
        );
        grid.insert("heads".to_string(), vec!["gqa".to_string()]);
        grid.insert("head_dim".to_string(), vec!["0".to_string()]);
        assert!(ExperimentSpec::points(&grid)
            .unwrap_err()
            .to_string()
            .contains("head_dim must be > 0"));
        grid.insert("head_dim".to_string(), vec!["x".to_string()]);
        assert!(ExperimentSpec::points(&grid).is_err());
    }
}
