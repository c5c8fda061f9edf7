//! Gemma-3 (HF `Gemma3ForCausalLM`, llama.cpp `gemma3`): four RMSNorms per layer (input,
//! post-attention, pre- and post-feed-forward; Hugging Face stores w of (1 + w), llama.cpp's
//! converter stores 1 + w), per-head QK RMSNorm before RoPE, GeGLU (`gelu_pytorch_tanh`), the
//! embedding scaled by √d_model, attention scale `query_pre_attn_scalar`^−½ (llama.cpp:
//! 1/√head_dim, 1/√(d_model/heads) for the 27B), final logit soft-capping when set
//! (transformers' Gemma-3 attention takes no score soft-cap), tied embeddings. Local layers
//! (`layer_types`, else 5 of every `sliding_window_pattern` = 6, as llama.cpp's
//! `set_swa_pattern`) attend within `sliding_window` and rotate with their own base
//! (`rope_local_base_freq`, llama.cpp's `rope.freq_base_swa`, 10000) and no scaling; global
//! layers with `rope_theta` and its scaling.

use crate::model::arch::{names, Architecture, GgufMeta, HfConfig, LayerSpec, ModelSpec, Part};
use crate::model::gguf::Value as GValue;
use crate::model::llama::{Mlp, QkNorm, Result, RopeLayout};
use crate::model::rope::RopeSpec;

pub const ROW: Architecture = Architecture {
    name: "gemma3",
    hf_classes: &["Gemma3ForCausalLM"],
    model_types: &["gemma3_text"],
    gguf: Some("gemma3"),
    from_hf,
    from_gguf,
    hf_names,
    gguf_names: names::gguf,
};

fn hf_names(part: Part, layer: usize) -> Option<String> {
    let l = |t: &str| Some(format!("model.layers.{layer}.{t}"));
    match part {
        Part::PostAttnNorm => l("post_attention_layernorm"),
        Part::FfnNorm => l("pre_feedforward_layernorm"),
        Part::PostFfnNorm => l("post_feedforward_layernorm"),
        other => names::hf(other, layer),
    }
}

/// The layers, local ones (`local[i]`) on RoPE 1 with the window, global ones on RoPE 0.
fn layers(local: &[bool], window: Option<usize>) -> Vec<LayerSpec> {
    local
        .iter()
        .map(|&l| LayerSpec {
            window: window.filter(|_| l),
            rope: usize::from(l),
            moe: false,
        })
        .collect()
}

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    c.expect_str("hidden_activation", "gelu_pytorch_tanh")?;
    let mut cfg = c.base(ROW.name)?;
    cfg.head_dim = c.opt_uint("head_dim")?.unwrap_or(256);
    let bias = c.opt_bool("attention_bias")?.unwrap_or(false);
    let b = &mut cfg.blocks;
    (b.qkv_bias, b.o_bias) = (bias, bias);
    b.qk_norm = QkNorm::PerHead;
    b.post_norms = true;
    b.mlp = Mlp::GeGlu;
    b.embed_scale = Some((cfg.d_model as f64).sqrt() as f32);
    let scalar = c.opt_float("query_pre_attn_scalar")?.unwrap_or(256.0);
    b.attn_scale = Some(scalar.powf(-0.5) as f32);
    b.final_softcap = c.opt_float("final_logit_softcapping")?.map(|v| v as f32);
    let hd = cfg.head_dim;
    let nested = c
        .get("rope_parameters")
        .filter(|v| v.get("full_attention").is_some() || v.get("sliding_attention").is_some());
    let (global, local) = match nested {
        Some(rp) => (
            c.rope(
                rp.get("full_attention").filter(|v| v.is_object()),
                "rope_parameters.full_attention.",
                hd,
                "rope_theta",
                1e6,
            )?,
            c.rope(
                rp.get("sliding_attention").filter(|v| v.is_object()),
                "rope_parameters.sliding_attention.",
                hd,
                "rope_local_base_freq",
                1e4,
            )?,
        ),
        None => {
            let (dict, prefix) = c.rope_dict().unzip();
            let global = c.rope(dict, prefix.unwrap_or(""), hd, "rope_theta", 1e6)?;
            let local = c.rope(None, "", hd, "rope_local_base_freq", 1e4)?;
            (global, local)
        }
    };
    cfg.rope_base = global.base as f32;
    let pattern = match c.opt_uint("sliding_window_pattern")? {
        Some(p) => p,
        None => c.opt_uint("_sliding_window_pattern")?.unwrap_or(6),
    };
    let local_layers = c.sliding_layers(cfg.layers, |i| (i + 1) % pattern.max(1) != 0)?;
    Ok(ModelSpec {
        arch: &ROW,
        cfg,
        layers: layers(&local_layers, c.window()?),
        ropes: vec![global, local],
        tied: c.tied(true)?,
        norm_offset: 1.0,
    })
}

fn from_gguf(m: &GgufMeta) -> Result<ModelSpec> {
    let mut cfg = m.base(ROW.name, RopeLayout::HalfSplit)?;
    let b = &mut cfg.blocks;
    b.qk_norm = QkNorm::PerHead;
    b.post_norms = true;
    b.mlp = Mlp::GeGlu;
    b.embed_scale = Some((cfg.d_model as f32).sqrt());
    // llama.cpp's `f_attention_scale`: the 27B (62 layers) scales by d_model / heads.
    let scaled_by = match cfg.layers {
        62 => cfg.d_model / cfg.heads.max(1),
        _ => cfg.head_dim,
    };
    b.attn_scale = Some(1.0 / (scaled_by as f32).sqrt());
    b.final_softcap = m.opt_float("final_logit_softcapping")?.map(|v| v as f32);
    let window = m.window()?;
    let key = format!("{}.attention.sliding_window_pattern", m.arch);
    let local: Vec<bool> = match (window, m.g.meta.get(&key)) {
        (None, _) => vec![false; cfg.layers],
        (Some(_), Some(GValue::Array(v))) if v.len() == cfg.layers => v
            .iter()
            .map(|x| match x {
                GValue::Bool(b) => Ok(*b),
                _ => Err(m.err(format!("metadata {key} holds {x:?}, not booleans"))),
            })
            .collect::<Result<_>>()?,
        (Some(_), _) => {
            let n = m.opt_uint("attention.sliding_window_pattern")?.unwrap_or(6);
            (0..cfg.layers).map(|i| n == 0 || i % n < n - 1).collect()
        }
    };
    let global = m.rope(cfg.head_dim)?;
    cfg.rope_base = global.base as f32;
    let local_base = m.opt_float("rope.freq_base_swa")?.unwrap_or(10000.0);
    Ok(ModelSpec {
        arch: &ROW,
        cfg,
        layers: layers(&local, window),
        ropes: vec![global.clone(), RopeSpec::plain(local_base, global.dim)],
        tied: m.tied(),
        norm_offset: 0.0,
    })
}
