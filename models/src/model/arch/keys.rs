//! The two config dialects an architecture reads: a Hugging Face `config.json` (transformers 4
//! style — `rope_theta` and `rope_scaling` at the top level — or 5 — `rope_parameters`, possibly
//! per layer type) and a GGUF file's metadata under llama.cpp's keys (`{arch}.block_count`,
//! `{arch}.attention.head_count`, `{arch}.rope.freq_base`, ... as `llama-arch.cpp`'s
//! `LLM_KV_NAMES`). Each reader names the architecture and the key in its one-line error; the
//! shared parts every Llama-like architecture reads (sizes, RoPE, layer types) are here.

use crate::model::gguf::{Gguf, Value as GValue};
use crate::model::llama::{Blocks, LlamaConfig, Result, RopeLayout};
use crate::model::rope::{RopeScaling, RopeSpec};
use kernel_common::KernelError;
use serde_json::Value;
use std::path::Path;

/// A parsed config.json and the class it declares, for errors.
pub struct HfConfig<'a> {
    pub path: &'a Path,
    pub v: &'a Value,
    pub class: &'a str,
}

/// The RoPE types transformers' `ROPE_INIT_FUNCTIONS` has that this workbench runs.
const ROPE_TYPES: &str = "default, linear, llama3, yarn, longrope";

impl HfConfig<'_> {
    /// An error naming the file and the class.
    pub fn err(&self, m: impl std::fmt::Display) -> KernelError {
        KernelError::BadFile(format!("{}: {}: {m}", self.path.display(), self.class))
    }

    /// The value at `key`, None when absent or null.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    /// A required non-negative integer.
    pub fn uint(&self, key: &str) -> Result<usize> {
        self.opt_uint(key)?
            .ok_or_else(|| self.err(format!("'{key}' is missing (a non-negative integer)")))
    }

    pub fn opt_uint(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .map(|u| u as usize)
                    .ok_or_else(|| self.err(format!("'{key}' is {v}, not a non-negative integer")))
            })
            .transpose()
    }

    pub fn opt_float(&self, key: &str) -> Result<Option<f64>> {
        float_in(self, self.v, key, key)
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.err(format!("'{key}' is {v}, not true or false")))
            })
            .transpose()
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.err(format!("'{key}' is {v}, not a string")))
            })
            .transpose()
    }

    /// `key` must be absent or `want` (an activation, say): one error otherwise.
    pub fn expect_str(&self, key: &str, want: &str) -> Result<()> {
        match self.opt_str(key)? {
            Some(v) if v != want => Err(self.err(format!(
                "'{key}' is '{v}'; this architecture runs '{want}' only"
            ))),
            _ => Ok(()),
        }
    }

    /// The Llama-shaped sizes every architecture has: layers, widths, heads, vocabulary,
    /// context, eps; half-split RoPE pairs (transformers' `rotate_half`), no MoE, Llama's
    /// blocks. The RoPE base is set by `rope`.
    pub fn base(&self, arch: &'static str) -> Result<LlamaConfig> {
        let (d_model, heads) = (self.uint("hidden_size")?, self.uint("num_attention_heads")?);
        let head_dim = match self.opt_uint("head_dim")? {
            Some(h) => h,
            None if heads > 0 => d_model / heads,
            None => 0,
        };
        Ok(LlamaConfig {
            layers: self.uint("num_hidden_layers")?,
            d_model,
            heads,
            kv_heads: self.opt_uint("num_key_value_heads")?.unwrap_or(heads),
            head_dim,
            d_ff: self.uint("intermediate_size")?,
            vocab: self.uint("vocab_size")?,
            context: self.uint("max_position_embeddings")?,
            eps: self.opt_float("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope_base: 10000.0,
            rope: RopeLayout::HalfSplit,
            moe: None,
            arch,
            blocks: Blocks::LLAMA,
        })
    }

    /// The RoPE dictionary of a non-nested config: `rope_parameters` (transformers 5) or
    /// `rope_scaling` (4), with its key prefix for errors.
    pub fn rope_dict(&self) -> Option<(&Value, &'static str)> {
        if let Some(v) = self.get("rope_parameters").filter(|v| v.is_object()) {
            return Some((v, "rope_parameters."));
        }
        self.get("rope_scaling")
            .filter(|v| v.is_object())
            .map(|v| (v, "rope_scaling."))
    }

    /// The RoPE of `dict` (a `rope_parameters` entry; None: the config's top-level keys only)
    /// as transformers' `standardize_rope_params` completes it and `ROPE_INIT_FUNCTIONS`
    /// computes it: the theta of the entry, else the top-level `theta_key` (`rope_theta`;
    /// Gemma-3's local layers: `rope_local_base_freq`), else `default_theta`; the
    /// rotated share of `head_dim` by `partial_rotary_factor`; an original context from the
    /// top-level `original_max_position_embeddings` (which wins, as for Phi-3), the entry's,
    /// or `max_position_embeddings`. `prefix` names the entry's keys in errors.
    pub fn rope(
        &self,
        dict: Option<&Value>,
        prefix: &str,
        head_dim: usize,
        theta_key: &str,
        default_theta: f64,
    ) -> Result<RopeSpec> {
        let empty = Value::Object(Default::default());
        let d = dict.unwrap_or(&empty);
        let f = |key: &str| float_in(self, d, key, &format!("{prefix}{key}"));
        let base = match f("rope_theta")? {
            Some(t) => t,
            None => self.opt_float(theta_key)?.unwrap_or(default_theta),
        };
        let partial = match f("partial_rotary_factor")? {
            Some(p) => p,
            None => self.opt_float("partial_rotary_factor")?.unwrap_or(1.0),
        };
        let dim = (head_dim as f64 * partial) as usize;
        let kind = d
            .get("rope_type")
            .or(d.get("type"))
            .filter(|v| !v.is_null())
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.err(format!("'{prefix}rope_type' is {v}, not a string")))
            })
            .transpose()?
            .unwrap_or("default");
        let original = || -> Result<f64> {
            if let Some(o) = self.opt_float("original_max_position_embeddings")? {
                return Ok(o);
            }
            match f("original_max_position_embeddings")? {
                Some(o) => Ok(o),
                None => Ok(self.uint("max_position_embeddings")? as f64),
            }
        };
        let need = |key: &str| -> Result<f64> {
            f(key)?.ok_or_else(|| {
                self.err(format!(
                    "rope type '{kind}' needs '{prefix}{key}' (a number)"
                ))
            })
        };
        let scaling = match kind {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: need("factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max: original()?,
            },
            "yarn" => {
                let original_max = original()?;
                let factor = match f("factor")? {
                    Some(x) => x,
                    None => self.uint("max_position_embeddings")? as f64 / original_max,
                };
                // Python's `get("beta_fast") or 32`: 0 and null mean the default too.
                let or = |v: Option<f64>, dflt: f64| v.filter(|x| *x != 0.0).unwrap_or(dflt);
                RopeScaling::Yarn {
                    factor,
                    original_max,
                    attention_factor: f("attention_factor")?,
                    mscale: f("mscale")?,
                    mscale_all_dim: f("mscale_all_dim")?,
                    beta_fast: or(f("beta_fast")?, 32.0),
                    beta_slow: or(f("beta_slow")?, 1.0),
                    truncate: d.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                }
            }
            "longrope" => {
                let list = |key: &str| -> Result<Vec<f64>> {
                    d.get(key)
                        .and_then(Value::as_array)
                        .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<_>>>())
                        .ok_or_else(|| {
                            self.err(format!(
                                "rope type 'longrope' needs '{prefix}{key}' (a list of numbers)"
                            ))
                        })
                };
                let original_max = original()?;
                let factor = match f("factor")? {
                    Some(x) => x,
                    None => self.uint("max_position_embeddings")? as f64 / original_max,
                };
                let attention_factor = match f("attention_factor")? {
                    Some(a) => a,
                    None if factor <= 1.0 => 1.0,
                    None => (1.0 + factor.ln() / original_max.ln()).sqrt(),
                };
                RopeScaling::LongRope {
                    short: list("short_factor")?,
                    long: list("long_factor")?,
                    original_max: original_max as usize,
                    attention_factor,
                }
            }
            other => {
                return Err(self.err(format!(
                    "'{prefix}rope_type' '{other}' is not supported ({ROPE_TYPES})"
                )))
            }
        };
        Ok(RopeSpec { base, dim, scaling })
    }

    /// Which layers use sliding-window attention: `layer_types` when the config has it
    /// (transformers 5 writes it), else `default(i)`.
    pub fn sliding_layers(
        &self,
        layers: usize,
        default: impl Fn(usize) -> bool,
    ) -> Result<Vec<bool>> {
        let Some(v) = self.get("layer_types") else {
            return Ok((0..layers).map(default).collect());
        };
        let types = v.as_array().filter(|a| a.len() == layers).ok_or_else(|| {
            self.err(format!(
                "'layer_types' is not a list of {layers} layer types"
            ))
        })?;
        types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(self.err(format!(
                    "'layer_types' holds {t}; sliding_attention and full_attention are supported"
                ))),
            })
            .collect()
    }

    /// `sliding_window`, None when absent, null or 0.
    pub fn window(&self) -> Result<Option<usize>> {
        Ok(self.opt_uint("sliding_window")?.filter(|&w| w > 0))
    }

    /// `tie_word_embeddings` (default `dflt`, the class's).
    pub fn tied(&self, dflt: bool) -> Result<bool> {
        Ok(self.opt_bool("tie_word_embeddings")?.unwrap_or(dflt))
    }
}

/// A float at `key` of the object `d` (named `shown` in errors); integers count.
fn float_in(c: &HfConfig, d: &Value, key: &str, shown: &str) -> Result<Option<f64>> {
    d.get(key)
        .filter(|v| !v.is_null())
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| c.err(format!("'{shown}' is {v}, not a number")))
        })
        .transpose()
}

/// A GGUF file's metadata read as architecture `arch`.
pub struct GgufMeta<'a> {
    pub g: &'a Gguf,
    pub arch: &'a str,
}

impl GgufMeta<'_> {
    /// An error naming the file and the architecture.
    pub fn err(&self, m: impl std::fmt::Display) -> KernelError {
        KernelError::BadFile(format!("{}: {}: {m}", self.g.path.display(), self.arch))
    }

    fn missing(&self, key: &str) -> KernelError {
        self.err(format!(
            "the metadata lacks {}.{key}, which it needs",
            self.arch
        ))
    }

    fn value(&self, key: &str) -> Option<&GValue> {
        self.g.meta.get(&format!("{}.{key}", self.arch))
    }

    /// `{arch}.{key}` as an unsigned integer, if present.
    pub fn opt_uint(&self, key: &str) -> Result<Option<usize>> {
        match self.value(key) {
            None => Ok(None),
            Some(GValue::UInt(v)) => Ok(Some(*v as usize)),
            Some(GValue::Int(v)) if *v >= 0 => Ok(Some(*v as usize)),
            Some(other) => Err(self.err(format!(
                "metadata {}.{key} is {other:?}, not an unsigned integer",
                self.arch
            ))),
        }
    }

    pub fn uint(&self, key: &str) -> Result<usize> {
        self.opt_uint(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn opt_float(&self, key: &str) -> Result<Option<f64>> {
        match self.value(key) {
            None => Ok(None),
            Some(GValue::Float(v)) => Ok(Some(*v)),
            Some(GValue::UInt(v)) => Ok(Some(*v as f64)),
            Some(GValue::Int(v)) => Ok(Some(*v as f64)),
            Some(other) => Err(self.err(format!(
                "metadata {}.{key} is {other:?}, not a number",
                self.arch
            ))),
        }
    }

    pub fn float(&self, key: &str) -> Result<f64> {
        self.opt_float(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.value(key) {
            None => Ok(None),
            Some(GValue::Str(s)) => Ok(Some(s)),
            Some(other) => Err(self.err(format!(
                "metadata {}.{key} is {other:?}, not a string",
                self.arch
            ))),
        }
    }

    /// The sizes llama.cpp reads for every architecture (`llama_model::load_hparams`):
    /// `block_count`, `embedding_length`, `attention.head_count`[`_kv`], `attention.key_length`
    /// (else d_model / heads), `feed_forward_length`, `context_length`, the RMS epsilon, the
    /// vocabulary from `tokenizer.ggml.tokens`, `rope.freq_base`; RoPE pairs as `layout`.
    pub fn base(&self, arch: &'static str, layout: RopeLayout) -> Result<LlamaConfig> {
        let d_model = self.uint("embedding_length")?;
        let heads = self.uint("attention.head_count")?;
        let vocab = match self.opt_uint("vocab_size")? {
            Some(v) => v,
            None => self
                .g
                .strings("tokenizer.ggml.tokens")
                .map(|t| t.len())
                .map_err(|_| {
                    self.err("the metadata lacks tokenizer.ggml.tokens, which it needs")
                })?,
        };
        Ok(LlamaConfig {
            layers: self.uint("block_count")?,
            d_model,
            heads,
            kv_heads: self.opt_uint("attention.head_count_kv")?.unwrap_or(heads),
            head_dim: match self.opt_uint("attention.key_length")? {
                Some(k) => k,
                None => d_model / heads.max(1),
            },
            d_ff: self.uint("feed_forward_length")?,
            vocab,
            context: self.uint("context_length")?,
            eps: self.float("attention.layer_norm_rms_epsilon")? as f32,
            rope_base: self.opt_float("rope.freq_base")?.unwrap_or(10000.0) as f32,
            rope: layout,
            moe: None,
            arch,
            blocks: Blocks::LLAMA,
        })
    }

    /// The global RoPE: `rope.freq_base`, `rope.dimension_count` (else head_dim) and the
    /// scaling of `rope.scaling.type` (`linear`, `yarn` with `rope.scaling.factor` and
    /// `original_context_length`), or the `rope_freqs` divisors a Llama-3 file carries.
    pub fn rope(&self, head_dim: usize) -> Result<RopeSpec> {
        let base = self.opt_float("rope.freq_base")?.unwrap_or(10000.0);
        let dim = self.opt_uint("rope.dimension_count")?.unwrap_or(head_dim);
        let factor = || self.float("rope.scaling.factor");
        let scaling = match self.opt_str("rope.scaling.type")? {
            None | Some("none") => match self.g.tensors.contains_key("rope_freqs.weight") {
                true => RopeScaling::FreqFactors(self.g.floats("rope_freqs.weight")?),
                false => RopeScaling::Default,
            },
            Some("linear") => RopeScaling::Linear { factor: factor()? },
            Some("yarn") => RopeScaling::Yarn {
                factor: factor()?,
                original_max: self.float("rope.scaling.original_context_length")?,
                attention_factor: None,
                mscale: None,
                mscale_all_dim: None,
                beta_fast: self
                    .opt_float("rope.scaling.yarn_beta_fast")?
                    .unwrap_or(32.0),
                beta_slow: self
                    .opt_float("rope.scaling.yarn_beta_slow")?
                    .unwrap_or(1.0),
                truncate: true,
            },
            Some(other) => {
                return Err(self.err(format!(
                    "metadata {}.rope.scaling.type '{other}' is not supported (none, linear, yarn)",
                    self.arch
                )))
            }
        };
        Ok(RopeSpec { base, dim, scaling })
    }

    /// `attention.sliding_window`, None when absent or 0.
    pub fn window(&self) -> Result<Option<usize>> {
        Ok(self
            .opt_uint("attention.sliding_window")?
            .filter(|&w| w > 0))
    }

    /// A file without `output.weight` ties its head to the embedding (llama.cpp's
    /// `TENSOR_DUPLICATED` fallback).
    pub fn tied(&self) -> bool {
        !self.g.tensors.contains_key("output.weight")
    }

    /// `{arch}.expert_count` and `expert_used_count`, when the file has experts.
    pub fn experts(&self) -> Result<Option<(usize, usize)>> {
        match self.opt_uint("expert_count")?.filter(|&e| e > 0) {
            None => Ok(None),
            Some(e) => Ok(Some((e, self.uint("expert_used_count")?))),
        }
    }
}
