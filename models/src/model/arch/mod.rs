//! The architecture table: one row per architecture — its Hugging Face class names and
//! `model_type`s, its GGUF `general.architecture`, the reader of its `config.json`, the reader
//! of its GGUF metadata (llama.cpp's `{arch}.block_count`, `{arch}.attention.head_count`, ...)
//! and its tensor names — mapping each onto the shared blocks of `Llama` (`Blocks`, per-layer
//! windows and RoPE kinds, a dense or MoE feed-forward). Adding an architecture is one module
//! here and one row in `ARCHITECTURES`; the loader, the forward pass and the harness read the
//! table and never match on a name.

use crate::model::gguf::Gguf;
use crate::model::llama::{LlamaConfig, Result};
use crate::model::rope::RopeSpec;
use kernel_common::KernelError;
use std::path::Path;

pub mod gemma3;
pub mod keys;
pub mod llama;
pub mod mistral;
pub mod mixtral;
pub mod names;
pub mod olmoe;
pub mod phi3;
pub mod qwen2;
pub mod qwen2moe;

pub use keys::{GgufMeta, HfConfig};
pub use names::{ExpertPart, Part};

/// What an architecture's config reader says about one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpec {
    /// Sliding-window attention over the last `window` positions (None: global).
    pub window: Option<usize>,
    /// Which of `ModelSpec::ropes` rotates this layer's Q and K.
    pub rope: usize,
    /// The layer's feed-forward is the sparse one of `LlamaConfig::moe`.
    pub moe: bool,
}

/// A model as a config reader describes it: the shape, each layer, each RoPE kind.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub arch: &'static Architecture,
    pub cfg: LlamaConfig,
    pub layers: Vec<LayerSpec>,
    pub ropes: Vec<RopeSpec>,
    /// The head is the embedding (`tie_word_embeddings`, or a GGUF without `output`).
    pub tied: bool,
    /// Added to every norm gain at load: 1 for Gemma's Hugging Face checkpoints, whose
    /// RMSNorm multiplies by (1 + w); llama.cpp's converter already added it in a GGUF.
    pub norm_offset: f32,
}

impl ModelSpec {
    /// Every layer alike: global attention (or `window`), RoPE 0, dense or MoE as `cfg.moe`.
    pub fn uniform(
        arch: &'static Architecture,
        cfg: LlamaConfig,
        rope: RopeSpec,
        window: Option<usize>,
        tied: bool,
    ) -> ModelSpec {
        let layer = LayerSpec {
            window,
            rope: 0,
            moe: cfg.moe.is_some(),
        };
        ModelSpec {
            arch,
            cfg,
            layers: vec![layer; cfg.layers],
            ropes: vec![rope],
            tied,
            norm_offset: 0.0,
        }
    }
}

/// How a source names its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// `blk.{i}.attn_q.weight` (llama.cpp).
    Gguf,
    /// `model.layers.{i}.self_attn.q_proj.weight` (transformers).
    Hf,
}

/// One row of the table.
#[derive(Debug)]
pub struct Architecture {
    /// The row's name (`LlamaConfig::arch`).
    pub name: &'static str,
    /// `architectures[0]` of a config.json.
    pub hf_classes: &'static [&'static str],
    /// `model_type` of a config.json.
    pub model_types: &'static [&'static str],
    /// `general.architecture` of a GGUF file; None where llama.cpp writes the architecture as
    /// another's (Mistral and Mixtral files say `llama`, and the Llama row reads them).
    pub gguf: Option<&'static str>,
    pub from_hf: fn(&HfConfig) -> Result<ModelSpec>,
    pub from_gguf: fn(&GgufMeta) -> Result<ModelSpec>,
    /// Hugging Face tensor stems (None: this architecture has no such tensor).
    pub hf_names: fn(Part, usize) -> Option<String>,
    /// llama.cpp tensor stems.
    pub gguf_names: fn(Part, usize) -> Option<String>,
}

impl Architecture {
    /// The stem of `part` of `layer` in `naming`.
    pub fn name(&self, naming: Naming, part: Part, layer: usize) -> Option<String> {
        match naming {
            Naming::Hf => (self.hf_names)(part, layer),
            Naming::Gguf => (self.gguf_names)(part, layer),
        }
    }
}

/// Every architecture the workbench runs.
pub static ARCHITECTURES: &[Architecture] = &[
    llama::ROW,
    mistral::ROW,
    mixtral::ROW,
    qwen2::ROW,
    qwen2moe::ROW,
    gemma3::ROW,
    phi3::ROW,
    olmoe::ROW,
];

/// The row called `name`.
pub fn by_name(name: &str) -> Option<&'static Architecture> {
    ARCHITECTURES.iter().find(|a| a.name == name)
}

/// The model a parsed config.json at `path` describes: its class (`architectures[0]`, or
/// `model_type` when it has none) picks the row; an unknown one is one error listing the known.
pub fn from_hf(path: &Path, config: &serde_json::Value) -> Result<ModelSpec> {
    let class = config["architectures"][0].as_str();
    let model_type = config["model_type"].as_str();
    let row = ARCHITECTURES.iter().find(|a| match class {
        Some(c) => a.hf_classes.contains(&c),
        None => model_type.is_some_and(|t| a.model_types.contains(&t)),
    });
    let Some(row) = row else {
        let known: Vec<&str> = ARCHITECTURES
            .iter()
            .flat_map(|a| a.hf_classes)
            .copied()
            .collect();
        let what = match (class, model_type) {
            (Some(c), _) => format!("architecture '{c}'"),
            (None, Some(t)) => format!("model_type '{t}'"),
            (None, None) => "no 'architectures' or 'model_type'".to_string(),
        };
        return Err(KernelError::BadFile(format!(
            "{}: {what} is not one this workbench runs ({})",
            path.display(),
            known.join(", ")
        )));
    };
    let c = HfConfig {
        path,
        v: config,
        class: class.or(model_type).unwrap_or(row.name),
    };
    (row.from_hf)(&c)
}

/// The model a GGUF file's metadata describes: `general.architecture` picks the row.
pub fn from_gguf(g: &Gguf) -> Result<ModelSpec> {
    let arch = g.string("general.architecture")?;
    let Some(row) = ARCHITECTURES.iter().find(|a| a.gguf == Some(arch)) else {
        let known: Vec<&str> = ARCHITECTURES.iter().filter_map(|a| a.gguf).collect();
        return Err(KernelError::BadFile(format!(
            "{}: general.architecture '{arch}' is not one this workbench runs ({})",
            g.path.display(),
            known.join(", ")
        )));
    };
    (row.from_gguf)(&GgufMeta { g, arch })
}
