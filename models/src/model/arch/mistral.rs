//! Mistral (HF `MistralForCausalLM`): Llama with `sliding_window` on every layer and an
//! explicit `head_dim` (q_dim may differ from d_model). llama.cpp's converter writes Mistral
//! files as `llama`, so GGUF files are read by the Llama row.

use crate::model::arch::{llama, names, Architecture, HfConfig, ModelSpec};
use crate::model::llama::Result;

pub const ROW: Architecture = Architecture {
    name: "mistral",
    hf_classes: &["MistralForCausalLM"],
    model_types: &["mistral"],
    gguf: None,
    from_hf,
    from_gguf: llama::from_gguf,
    hf_names: names::hf,
    gguf_names: names::gguf,
};

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    c.expect_str("hidden_act", "silu")?;
    let mut cfg = c.base(ROW.name)?;
    let (dict, prefix) = c.rope_dict().unzip();
    let rope = c.rope(
        dict,
        prefix.unwrap_or(""),
        cfg.head_dim,
        "rope_theta",
        10000.0,
    )?;
    cfg.rope_base = rope.base as f32;
    Ok(ModelSpec::uniform(
        &ROW,
        cfg,
        rope,
        c.window()?,
        c.tied(false)?,
    ))
}
