//! Qwen2 / Qwen2.5 (HF `Qwen2ForCausalLM`, llama.cpp `qwen2`): Llama with biases on Q, K and V
//! (none on O), half-split RoPE pairs in GGUF too (llama.cpp's `LLAMA_ROPE_TYPE_NEOX`: its
//! converter does not permute Q/K for qwen2), and with `use_sliding_window` a window on the
//! layers `layer_types` marks (by default those from `max_window_layers` on). llama.cpp runs
//! qwen2 without a window, and so does its GGUF row here.

use crate::model::arch::{names, Architecture, GgufMeta, HfConfig, LayerSpec, ModelSpec};
use crate::model::llama::{Result, RopeLayout};

pub const ROW: Architecture = Architecture {
    name: "qwen2",
    hf_classes: &["Qwen2ForCausalLM"],
    model_types: &["qwen2"],
    gguf: Some("qwen2"),
    from_hf,
    from_gguf,
    hf_names: names::hf,
    gguf_names: names::gguf,
};

/// Each layer's window: `sliding_window` where `use_sliding_window` is set and the layer is
/// marked `sliding_attention` (transformers' default: layer index ≥ `max_window_layers`).
pub fn windows(
    c: &HfConfig,
    layers: usize,
    max_window_default: usize,
) -> Result<Vec<Option<usize>>> {
    let window = match c.opt_bool("use_sliding_window")?.unwrap_or(false) {
        true => c.window()?,
        false => None,
    };
    let max_window = c
        .opt_uint("max_window_layers")?
        .unwrap_or(max_window_default);
    let sliding = c.sliding_layers(layers, |i| window.is_some() && i >= max_window)?;
    Ok(sliding.iter().map(|&s| window.filter(|_| s)).collect())
}

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    c.expect_str("hidden_act", "silu")?;
    let mut cfg = c.base(ROW.name)?;
    cfg.blocks.qkv_bias = true;
    let (dict, prefix) = c.rope_dict().unzip();
    let rope = c.rope(
        dict,
        prefix.unwrap_or(""),
        cfg.head_dim,
        "rope_theta",
        10000.0,
    )?;
    cfg.rope_base = rope.base as f32;
    let mut spec = ModelSpec::uniform(&ROW, cfg, rope, None, c.tied(false)?);
    for (l, w) in spec.layers.iter_mut().zip(windows(c, cfg.layers, 28)?) {
        *l = LayerSpec { window: w, ..*l };
    }
    Ok(spec)
}

fn from_gguf(m: &GgufMeta) -> Result<ModelSpec> {
    let mut cfg = m.base(ROW.name, RopeLayout::HalfSplit)?;
    cfg.blocks.qkv_bias = true;
    let rope = m.rope(cfg.head_dim)?;
    cfg.rope_base = rope.base as f32;
    Ok(ModelSpec::uniform(&ROW, cfg, rope, None, m.tied()))
}
