//! `load(--model)`: picks the weight source from the argument — a `.gguf` file (`gguf`), a
//! Hugging Face checkpoint directory (`hf`) or a random preset name (`presets`) — and returns
//! the model built through `source::build` with the source's tokenizer, if it has one.

use crate::model::arch::{self, Naming};
use crate::model::gguf::Gguf;
use crate::model::hf::HfCheckpoint;
use crate::model::llama::{Llama, LlamaConfig, Result};
use crate::model::presets::random_model;
use crate::model::source::{build, LoadOptions};
use crate::model::tokenizer::TextTokenizer;
use std::path::Path;

/// A loaded model and, when its source has one, its tokenizer.
pub struct Loaded {
    pub model: Llama,
    pub tokenizer: Option<TextTokenizer>,
    /// What was loaded, for provenance ("preset tiny-gqa", a path).
    pub source: String,
}

/// Loads `--model`: a `.gguf` file, a Hugging Face checkpoint directory, or a preset name.
pub fn load(model: &str, opts: &LoadOptions) -> Result<Loaded> {
    let path = Path::new(model);
    if path.is_dir() {
        let dir = HfCheckpoint::open(path)?;
        return Ok(Loaded {
            model: dir.build(opts)?,
            tokenizer: dir.tokenizer()?,
            source: path.display().to_string(),
        });
    }
    if model.ends_with(".gguf") || path.is_file() {
        return load_gguf(&Gguf::open(path)?, opts);
    }
    Ok(Loaded {
        model: random_model(model, opts)?,
        tokenizer: None,
        source: format!("preset {model}"),
    })
}

/// The model and tokenizer of a parsed GGUF file.
pub fn load_gguf(g: &Gguf, opts: &LoadOptions) -> Result<Loaded> {
    let model = build(&arch::from_gguf(g)?, g, Naming::Gguf, opts)?;
    Ok(Loaded {
        model,
        tokenizer: Some(TextTokenizer::from_gguf(g)?),
        source: g.path.display().to_string(),
    })
}

/// The shape of a GGUF file of any architecture in the table.
pub fn gguf_config(g: &Gguf) -> Result<LlamaConfig> {
    Ok(arch::from_gguf(g)?.cfg)
}

impl Llama {
    /// Loads `g` (its architecture from `general.architecture`); `attention` is an attention
    /// variant spec.
    pub fn from_gguf(g: &Gguf, attention: &str) -> Result<Llama> {
        let opts = LoadOptions {
            attention: attention.into(),
            ..LoadOptions::default()
        };
        build(&arch::from_gguf(g)?, g, Naming::Gguf, &opts)
    }
}
