//! Qwen2-MoE (HF `Qwen2MoeForCausalLM`, llama.cpp `qwen2moe`): Qwen2's attention (`qkv_bias`)
//! with, on every `decoder_sparse_step`-th layer not in `mlp_only_layers`, a sparse
//! feed-forward: softmax router, top-k experts of `moe_intermediate_size` (the k weights
//! renormalised when `norm_topk_prob`), plus a shared expert of
//! `shared_expert_intermediate_size` scaled by sigmoid(x · shared_expert_gate). Layers in
//! `mlp_only_layers` are dense of `intermediate_size`.

use crate::model::arch::{names, qwen2, Architecture, GgufMeta, HfConfig, LayerSpec, ModelSpec};
use crate::model::llama::{MoeSpec, Result, RopeLayout};
use kernel_moe::{Capacity, WeightNorm};

pub const ROW: Architecture = Architecture {
    name: "qwen2moe",
    hf_classes: &["Qwen2MoeForCausalLM"],
    model_types: &["qwen2_moe"],
    gguf: Some("qwen2moe"),
    from_hf,
    from_gguf,
    hf_names: names::hf,
    gguf_names: names::gguf,
};

fn norm(renormalise: bool) -> WeightNorm {
    match renormalise {
        true => WeightNorm::Renormalize,
        false => WeightNorm::Raw,
    }
}

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    c.expect_str("hidden_act", "silu")?;
    let mut cfg = c.base(ROW.name)?;
    cfg.blocks.qkv_bias = c.opt_bool("qkv_bias")?.unwrap_or(true);
    let experts = c.uint("num_experts")?;
    let shared = c.uint("shared_expert_intermediate_size")?;
    if experts > 0 {
        cfg.moe = Some(MoeSpec {
            experts,
            top_k: c.uint("num_experts_per_tok")?,
            capacity: Capacity::Dropless,
            d_ff: c.uint("moe_intermediate_size")?,
            norm: norm(c.opt_bool("norm_topk_prob")?.unwrap_or(false)),
            shared: Some(shared),
        });
    }
    let dense: Vec<usize> = match c.get("mlp_only_layers") {
        None => vec![],
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|u| u as usize)).collect())
            .ok_or_else(|| {
                c.err(format!(
                    "'mlp_only_layers' is {v}, not a list of layer indices"
                ))
            })?,
    };
    let step = c.opt_uint("decoder_sparse_step")?.unwrap_or(1).max(1);
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
    for (i, (l, w)) in spec
        .layers
        .iter_mut()
        .zip(qwen2::windows(c, cfg.layers, 28)?)
        .enumerate()
    {
        *l = LayerSpec {
            window: w,
            rope: 0,
            moe: experts > 0 && !dense.contains(&i) && (i + 1) % step == 0,
        };
    }
    Ok(spec)
}

fn from_gguf(m: &GgufMeta) -> Result<ModelSpec> {
    let mut cfg = m.base(ROW.name, RopeLayout::HalfSplit)?;
    cfg.blocks.qkv_bias = true;
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
        d_ff: m.uint("expert_feed_forward_length")?,
        norm: norm(matches!(
            m.g.meta.get(&format!("{}.expert_weights_norm", m.arch)),
            Some(crate::model::gguf::Value::Bool(true))
        )),
        shared: Some(m.uint("expert_shared_feed_forward_length")?),
    });
    let rope = m.rope(cfg.head_dim)?;
    cfg.rope_base = rope.base as f32;
    Ok(ModelSpec::uniform(&ROW, cfg, rope, None, m.tied()))
}
