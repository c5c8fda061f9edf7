//! OLMoE (HF `OlmoeForCausalLM`, llama.cpp `olmoe`): RMSNorm over the whole Q and K
//! projections (q_norm of q_dim, k_norm of kv_dim) before RoPE, a softmax router whose top-k
//! weights are not renormalised (`norm_topk_prob` false), SwiGLU experts named
//! `mlp.experts.{j}.gate_proj/up_proj/down_proj`. `clip_qkv` is refused.

use crate::model::arch::{names, Architecture, GgufMeta, HfConfig, ModelSpec};
use crate::model::llama::{MoeSpec, QkNorm, Result, RopeLayout};
use kernel_moe::{Capacity, WeightNorm};

pub const ROW: Architecture = Architecture {
    name: "olmoe",
    hf_classes: &["OlmoeForCausalLM"],
    model_types: &["olmoe"],
    gguf: Some("olmoe"),
    from_hf,
    from_gguf,
    hf_names: names::hf,
    gguf_names: names::gguf,
};

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    c.expect_str("hidden_act", "silu")?;
    if let Some(v) = c.opt_float("clip_qkv")? {
        return Err(c.err(format!("'clip_qkv' {v} is not supported")));
    }
    let mut cfg = c.base(ROW.name)?;
    let bias = c.opt_bool("attention_bias")?.unwrap_or(false);
    (cfg.blocks.qkv_bias, cfg.blocks.o_bias) = (bias, bias);
    cfg.blocks.qk_norm = QkNorm::Whole;
    cfg.moe = Some(MoeSpec {
        experts: c.uint("num_experts")?,
        top_k: c.uint("num_experts_per_tok")?,
        capacity: Capacity::Dropless,
        d_ff: cfg.d_ff,
        norm: match c.opt_bool("norm_topk_prob")?.unwrap_or(false) {
            true => WeightNorm::Renormalize,
            false => WeightNorm::Raw,
        },
        shared: None,
    });
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

fn from_gguf(m: &GgufMeta) -> Result<ModelSpec> {
    let mut cfg = m.base(ROW.name, RopeLayout::HalfSplit)?;
    cfg.blocks.qk_norm = QkNorm::Whole;
    let (experts, top_k) = m.experts()?.ok_or_else(|| {
        m.err(format!(
            "the metadata lacks {}.expert_count, which it needs",
            m.arch
        ))
    })?;
    cfg.moe = Some(MoeSpec {
        experts,
        top_k,
        capacity: Capacity::Dropless,
        d_ff: m
            .opt_uint("expert_feed_forward_length")?
            .unwrap_or(cfg.d_ff),
        norm: WeightNorm::Raw,
        shared: None,
    });
    let rope = m.rope(cfg.head_dim)?;
    cfg.rope_base = rope.base as f32;
    Ok(ModelSpec::uniform(&ROW, cfg, rope, None, m.tied()))
}
