//! `load(--model)`: picks the weight source from the argument — a `.gguf` file (`gguf`), a
//! Hugging Face checkpoint directory (`hf`) or a random preset name (`presets`) — and returns
//! the model built through `source::build` with the source's tokenizer, if it has one.

use crate::model::arch::{self, Naming};
use crate::model::gguf::{Gguf, Value};
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
    /// Why a file's tokenizer is absent: its kind is one `TextTokenizer` does not build.
    pub tokenizer_note: Option<String>,
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
            tokenizer_note: None,
            source: path.display().to_string(),
        });
    }
    if model.ends_with(".gguf") || path.is_file() {
        return load_gguf(&Gguf::open(path)?, opts);
    }
    Ok(Loaded {
        model: random_model(model, opts)?,
        tokenizer: None,
        tokenizer_note: None,
        source: format!("preset {model}"),
    })
}

/// The model and tokenizer of a parsed GGUF file. A tokenizer of a kind `TextTokenizer` does
/// not build (its `tokenizer.ggml.model` is not byte-level BPE) leaves the model usable with
/// token ids, the reason in `tokenizer_note`; a damaged byte-level BPE is an error.
pub fn load_gguf(g: &Gguf, opts: &LoadOptions) -> Result<Loaded> {
    let model = build(&arch::from_gguf(g)?, g, Naming::Gguf, opts)?;
    let bpe = matches!(g.meta.get("tokenizer.ggml.model"), Some(Value::Str(m)) if m == "gpt2");
    let (tokenizer, tokenizer_note) = match TextTokenizer::from_gguf(g) {
        Ok(t) => (Some(t), None),
        Err(e) if !bpe => (None, Some(e.to_string())),
        Err(e) => return Err(e),
    };
    Ok(Loaded {
        model,
        tokenizer,
        tokenizer_note,
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
