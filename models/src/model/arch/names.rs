//! Tensor names: every tensor a decoder may have (`Part`), and the two naming schemes — Hugging
//! Face's `model.layers.{i}.self_attn.q_proj` (transformers' modules) and llama.cpp's
//! `blk.{i}.attn_q` (`llama-arch.cpp`'s `LLM_TENSOR_NAMES`) — as the Llama row uses them;
//! architectures whose modules are named otherwise map the parts they rename and call these
//! for the rest. A name is a stem: `.weight` or `.bias` is appended by the loader.

/// The three matrices of a SwiGLU/GeGLU expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertPart {
    Gate,
    Up,
    Down,
}

/// One tensor of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Embed,
    Head,
    OutNorm,
    AttnNorm,
    Q,
    K,
    V,
    /// Q, K and V in one matrix (Phi-3's `qkv_proj`).
    Qkv,
    O,
    QNorm,
    KNorm,
    PostAttnNorm,
    FfnNorm,
    PostFfnNorm,
    Gate,
    Up,
    /// Gate and up in one matrix (Phi-3's `gate_up_proj`).
    GateUp,
    Down,
    Router,
    /// Expert j's matrix (one tensor per expert, as Hugging Face stores them).
    Expert(usize, ExpertPart),
    /// All experts' matrices in one 3-D tensor (llama.cpp's `ffn_*_exps`).
    Experts(ExpertPart),
    /// The shared expert (Qwen2-MoE).
    Shared(ExpertPart),
    /// The shared expert's sigmoid gate, a 1 × d_model row.
    SharedRouter,
    /// llama.cpp's per-pair RoPE frequency divisors (Llama-3 files).
    RopeFreqs,
    /// Phi-3's longrope factors in a GGUF file.
    RopeLong,
    RopeShort,
}

/// Hugging Face names of the Llama modules; `None` for tensors transformers does not have.
pub fn hf(part: Part, layer: usize) -> Option<String> {
    use ExpertPart as E;
    use Part::*;
    let l = |t: &str| Some(format!("model.layers.{layer}.{t}"));
    let w = |e: ExpertPart| match e {
        E::Gate => "gate_proj",
        E::Up => "up_proj",
        E::Down => "down_proj",
    };
    match part {
        Embed => Some("model.embed_tokens".into()),
        Head => Some("lm_head".into()),
        OutNorm => Some("model.norm".into()),
        AttnNorm => l("input_layernorm"),
        Q => l("self_attn.q_proj"),
        K => l("self_attn.k_proj"),
        V => l("self_attn.v_proj"),
        Qkv => l("self_attn.qkv_proj"),
        O => l("self_attn.o_proj"),
        QNorm => l("self_attn.q_norm"),
        KNorm => l("self_attn.k_norm"),
        PostAttnNorm => None,
        FfnNorm => l("post_attention_layernorm"),
        PostFfnNorm => None,
        Gate => l("mlp.gate_proj"),
        Up => l("mlp.up_proj"),
        GateUp => l("mlp.gate_up_proj"),
        Down => l("mlp.down_proj"),
        Router => l("mlp.gate"),
        Expert(j, e) => l(&format!("mlp.experts.{j}.{}", w(e))),
        Shared(e) => l(&format!("mlp.shared_expert.{}", w(e))),
        SharedRouter => l("mlp.shared_expert_gate"),
        Experts(_) | RopeFreqs | RopeLong | RopeShort => None,
    }
}

/// llama.cpp's names; `None` for tensors its files do not have.
pub fn gguf(part: Part, layer: usize) -> Option<String> {
    use ExpertPart as E;
    use Part::*;
    let b = |t: &str| Some(format!("blk.{layer}.{t}"));
    let e = |e: ExpertPart| match e {
        E::Gate => "gate",
        E::Up => "up",
        E::Down => "down",
    };
    match part {
        Embed => Some("token_embd".into()),
        Head => Some("output".into()),
        OutNorm => Some("output_norm".into()),
        RopeFreqs => Some("rope_freqs".into()),
        RopeLong => Some("rope_factors_long".into()),
        RopeShort => Some("rope_factors_short".into()),
        AttnNorm => b("attn_norm"),
        Q => b("attn_q"),
        K => b("attn_k"),
        V => b("attn_v"),
        Qkv => b("attn_qkv"),
        O => b("attn_output"),
        QNorm => b("attn_q_norm"),
        KNorm => b("attn_k_norm"),
        PostAttnNorm => b("post_attention_norm"),
        FfnNorm => b("ffn_norm"),
        PostFfnNorm => b("post_ffw_norm"),
        Gate => b("ffn_gate"),
        Up => b("ffn_up"),
        Down => b("ffn_down"),
        Router => b("ffn_gate_inp"),
        Experts(x) => b(&format!("ffn_{}_exps", e(x))),
        Shared(x) => b(&format!("ffn_{}_shexp", e(x))),
        SharedRouter => b("ffn_gate_inp_shexp"),
        GateUp | Expert(..) => None,
    }
}
