//! Mixtral (HF `MixtralForCausalLM`): Mistral's attention (`sliding_window` if set) with a
//! sparse feed-forward: softmax router, top-k experts renormalised over the chosen k, SwiGLU
//! experts named `block_sparse_moe.experts.{j}.w1/w3/w2`. GGUF Mixtral files say `llama`
//! (with `expert_count`) and are read by the Llama row.

use crate::model::arch::{llama, names, Architecture, ExpertPart, HfConfig, ModelSpec, Part};
use crate::model::llama::{MoeSpec, Result};
use kernel_moe::{Capacity, WeightNorm};

pub const ROW: Architecture = Architecture {
    name: "mixtral",
    hf_classes: &["MixtralForCausalLM"],
    model_types: &["mixtral"],
    gguf: None,
    from_hf,
    from_gguf: llama::from_gguf,
    hf_names,
    gguf_names: names::gguf,
};

fn hf_names(part: Part, layer: usize) -> Option<String> {
    let l = |t: String| Some(format!("model.layers.{layer}.block_sparse_moe.{t}"));
    match part {
        Part::Router => l("gate".into()),
        Part::Expert(j, e) => l(format!(
            "experts.{j}.{}",
            match e {
                ExpertPart::Gate => "w1",
                ExpertPart::Up => "w3",
                ExpertPart::Down => "w2",
            }
        )),
        Part::Shared(_) | Part::SharedRouter => None,
        other => names::hf(other, layer),
    }
}

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    c.expect_str("hidden_act", "silu")?;
    let mut cfg = c.base(ROW.name)?;
    cfg.moe = Some(MoeSpec {
        experts: c.uint("num_local_experts")?,
        top_k: c.uint("num_experts_per_tok")?,
        capacity: Capacity::Dropless,
        d_ff: cfg.d_ff,
        norm: WeightNorm::Renormalize,
        shared: None,
    });
    let (dict, prefix) = c.rope_dict().unzip();
    let rope = c.rope(dict, prefix.unwrap_or(""), cfg.head_dim, "rope_theta", 1e6)?;
    cfg.rope_base = rope.base as f32;
    Ok(ModelSpec::uniform(
        &ROW,
        cfg,
        rope,
        c.window()?,
        c.tied(false)?,
    ))
}
