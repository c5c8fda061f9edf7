//! Phi-3 (HF `Phi3ForCausalLM`, llama.cpp `phi3`): Q, K and V in one `qkv_proj` and gate and up
//! in one `gate_up_proj` (llama.cpp: `attn_qkv`, and `ffn_up` of 2·d_ff rows), SwiGLU,
//! `longrope` (transformers maps the old `su` and `yarn` names to it; GGUF files carry the
//! factors as `rope_factors_long/short`), `partial_rotary_factor`, `sliding_window` on every
//! layer (llama.cpp disables Phi's window, and so does its GGUF row here).

use crate::model::arch::{names, Architecture, GgufMeta, HfConfig, ModelSpec, Part};
use crate::model::llama::{Result, RopeLayout};
use crate::model::rope::{RopeScaling, RopeSpec};

pub const ROW: Architecture = Architecture {
    name: "phi3",
    hf_classes: &["Phi3ForCausalLM"],
    model_types: &["phi3"],
    gguf: Some("phi3"),
    from_hf,
    from_gguf,
    hf_names: names::hf,
    gguf_names,
};

fn gguf_names(part: Part, layer: usize) -> Option<String> {
    match part {
        Part::GateUp => names::gguf(Part::Up, layer),
        Part::Gate | Part::Up => None,
        other => names::gguf(other, layer),
    }
}

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    c.expect_str("hidden_act", "silu")?;
    let mut cfg = c.base(ROW.name)?;
    let (dict, prefix) = c.rope_dict().unzip();
    // Phi3Config renames the old rope types `su` and `yarn` to `longrope`.
    let renamed = dict.map(|d| {
        let mut d = d.clone();
        let old = d
            .get("rope_type")
            .or(d.get("type"))
            .and_then(|v| v.as_str());
        if matches!(old, Some("su" | "yarn")) {
            d["rope_type"] = "longrope".into();
        }
        d
    });
    let rope = c.rope(
        renamed.as_ref(),
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

fn from_gguf(m: &GgufMeta) -> Result<ModelSpec> {
    let mut cfg = m.base(ROW.name, RopeLayout::HalfSplit)?;
    let g = m.g;
    let rope = match g.tensors.contains_key("rope_factors_long.weight") {
        false => m.rope(cfg.head_dim)?,
        true => {
            let factors = |n: &str| -> Result<Vec<f64>> {
                Ok(g.floats(n)?.into_iter().map(f64::from).collect())
            };
            let original = m.uint("rope.scaling.original_context_length")?;
            let factor = cfg.context as f64 / original as f64;
            let attention_factor = match m.opt_float("rope.scaling.attn_factor")? {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
            };
            RopeSpec {
                base: m.opt_float("rope.freq_base")?.unwrap_or(10000.0),
                dim: m.opt_uint("rope.dimension_count")?.unwrap_or(cfg.head_dim),
                scaling: RopeScaling::LongRope {
                    short: factors("rope_factors_short.weight")?,
                    long: factors("rope_factors_long.weight")?,
                    original_max: original,
                    attention_factor,
                },
            }
        }
    };
    cfg.rope_base = rope.base as f32;
    Ok(ModelSpec::uniform(&ROW, cfg, rope, None, m.tied()))
}
