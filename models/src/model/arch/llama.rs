//! Llama (HF `LlamaForCausalLM`, llama.cpp `llama`): RMSNorm, RoPE (default, linear, llama3,
//! yarn; GGUF files carry Llama-3's scaling as `rope_freqs` divisors and interleaved pairs, the
//! Q/K rows permuted by llama.cpp's converter), GQA, SwiGLU, optional `attention_bias` (Q, K,
//! V and O) and `mlp_bias`. A GGUF `llama` file with `expert_count` is a Mixtral.

use crate::model::arch::{names, Architecture, GgufMeta, HfConfig, ModelSpec};
use crate::model::llama::{MoeSpec, Result, RopeLayout};
use kernel_moe::{Capacity, WeightNorm};

pub const ROW: Architecture = Architecture {
    name: "llama",
    hf_classes: &["LlamaForCausalLM"],
    model_types: &["llama"],
    gguf: Some("llama"),
    from_hf,
    from_gguf,
    hf_names: names::hf,
    gguf_names: names::gguf,
};

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    c.expect_str("hidden_act", "silu")?;
    let mut cfg = c.base(ROW.name)?;
    let bias = c.opt_bool("attention_bias")?.unwrap_or(false);
    cfg.blocks.qkv_bias = bias;
    cfg.blocks.o_bias = bias;
    cfg.blocks.mlp_bias = c.opt_bool("mlp_bias")?.unwrap_or(false);
    let (dict, prefix) = c.rope_dict().unzip();
    let rope = c.rope(
        dict,
        prefix.unwrap_or(""),
        cfg.head_dim,
        "rope_theta",
        10000.0,
    )?;
    cfg.rope_base = rope.base as f32;
    Ok(ModelSpec::uniform(&ROW, cfg, rope, None, c.tied(false)?))
}

/// llama.cpp's `llama` (also what its converter writes for Mistral and Mixtral): interleaved
/// RoPE pairs; experts from `expert_count` / `expert_used_count`, renormalised top-k.
pub fn from_gguf(m: &GgufMeta) -> Result<ModelSpec> {
    let mut cfg = m.base(ROW.name, RopeLayout::Interleaved)?;
    if let Some((experts, top_k)) = m.experts()? {
        cfg.moe = Some(MoeSpec {
            experts,
            top_k,
            capacity: Capacity::Dropless,
            d_ff: m
                .opt_uint("expert_feed_forward_length")?
                .unwrap_or(cfg.d_ff),
            norm: WeightNorm::Renormalize,
            shared: None,
        });
    }
    let rope = m.rope(cfg.head_dim)?;
    cfg.rope_base = rope.base as f32;
    Ok(ModelSpec::uniform(&ROW, cfg, rope, None, m.tied()))
}
