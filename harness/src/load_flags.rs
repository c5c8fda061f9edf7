//! The load flags — `--attention`, `--weights`, `--capacity`, `--matmul`, `--kv-cache` — as
//! `harness generate`, `harness eval` and the experiments' grids write them, parsed by one
//! route into `models::LoadOptions`: each flag by the one function below (the variant and
//! format tables of the kernel crates behind them), a flag not given keeping the loader's
//! default. Shared layer: commands and families call it; it imports neither.

use crate::error::Result;
use kernel_moe::Capacity;
use kernel_paged::KvCacheFormat;
use kernel_quant::{MatVecVariant, WeightFormat};
use models::LoadOptions;

/// The flags as text; `None` keeps `LoadOptions::default()`'s value.
#[derive(Debug, Clone, Default)]
pub struct LoadFlags {
    /// naive, flash2, paged[:split=...] (the model's attention; its block size is the cache's).
    pub attention: Option<String>,
    /// A weight format every matrix is converted to; `native` keeps the checkpoint's.
    pub weights: Option<String>,
    /// dropless or a factor > 0.
    pub capacity: Option<String>,
    /// A quant product variant (`packed`, `fused:act=q8`, `fused:isa=avx2`, ...).
    pub matmul: Option<String>,
    /// A KV cache format (`f32`, `fp8:per_head`, `progressive:window=N,old=...`).
    pub kv_cache: Option<String>,
}

impl LoadFlags {
    /// The loader options: every flag given parsed (a bad one is a one-line error naming it),
    /// the others the loader's defaults.
    pub fn options(&self) -> Result<LoadOptions> {
        let d = LoadOptions::default();
        Ok(LoadOptions {
            attention: match &self.attention {
                Some(a) => attention(a)?,
                None => d.attention,
            },
            weights: match &self.weights {
                Some(w) => weights(w)?,
                None => d.weights,
            },
            capacity: self.capacity.as_deref().map_or(Ok(d.capacity), capacity)?,
            matmul: self.matmul.as_deref().map_or(Ok(d.matmul), matmul)?,
            kv_cache: self.kv_cache.as_deref().map_or(Ok(d.kv_cache), kv_cache)?,
            overrides: d.overrides,
        })
    }
}

/// `--attention`: checked here as the model will read it (`models::model::llama::
/// attention_choice`: a contiguous kernel of the attention table, or `paged[:split=...]`).
pub fn attention(text: &str) -> Result<String> {
    models::model::llama::attention_choice(text)?;
    Ok(text.to_string())
}

/// `--weights`: a format, or `native` (`None`: keep the checkpoint's).
pub fn weights(text: &str) -> Result<Option<WeightFormat>> {
    if text == "native" {
        return Ok(None);
    }
    Ok(Some(WeightFormat::parse(text)?))
}

/// `--capacity`: dropless or a factor.
pub fn capacity(text: &str) -> Result<Capacity> {
    Ok(kernel_moe::parse_capacity(text)?)
}

/// `--matmul`: a row of the quant table.
pub fn matmul(text: &str) -> Result<MatVecVariant> {
    Ok(crate::registry::quant_variant(text)?.1)
}

/// `--kv-cache`: a KV cache format.
pub fn kv_cache(text: &str) -> Result<KvCacheFormat> {
    Ok(KvCacheFormat::parse(text)?)
}
