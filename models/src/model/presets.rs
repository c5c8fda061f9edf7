//! Built-in models with seeded random weights, small enough for tests and for experiments on
//! 2 cores: a GQA, an MQA, an MHA and a Mixtral-style MoE decoder (Hugging Face layout, so
//! they go through the same loader as a checkpoint directory). Weights are N(0, 1/fan_in),
//! embeddings N(0, 1), norms 1: logits of order one, so greedy choices are not near-ties. The
//! shape-only presets of `config.rs` (Llama-2, Mixtral-8x7B) are for calculators.

use crate::model::arch::{self, ModelSpec, Naming};
use crate::model::config;
use crate::model::llama::{Blocks, Llama, LlamaConfig, MoeSpec, Result, RopeLayout};
use crate::model::rope::RopeSpec;
use crate::model::source::{build, LoadOptions, TensorSource};
use kernel_common::inputs::{derive_seed, normal_buffer_par};
use kernel_common::{DType, KernelError};
use kernel_moe::{Capacity, WeightNorm};
use kernel_quant::{QuantMatrix, WeightFormat};
use std::collections::BTreeMap;

/// A random-weight preset.
#[derive(Debug, Clone, Copy)]
pub struct RandomPreset {
    pub name: &'static str,
    pub about: &'static str,
    pub cfg: LlamaConfig,
    pub seed: u64,
}

const fn tiny(heads: usize, kv_heads: usize, d_ff: usize, moe: Option<MoeSpec>) -> LlamaConfig {
    LlamaConfig {
        layers: 4,
        d_model: 256,
        heads,
        kv_heads,
        head_dim: 256 / heads,
        d_ff,
        vocab: 512,
        context: 2048,
        eps: 1e-5,
        rope_base: 10000.0,
        rope: RopeLayout::HalfSplit,
        moe,
        arch: if moe.is_some() { "mixtral" } else { "llama" },
        blocks: Blocks::LLAMA,
    }
}

const fn micro(seed: u64, name: &'static str) -> RandomPreset {
    RandomPreset {
        name,
        about: "2 layers, d 64, 4 query / 2 KV heads, SwiGLU 128, vocab 8 (for distribution tests)",
        cfg: LlamaConfig {
            layers: 2,
            d_model: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            d_ff: 128,
            vocab: 8,
            context: 512,
            eps: 1e-5,
            rope_base: 10000.0,
            rope: RopeLayout::HalfSplit,
            moe: None,
            arch: "llama",
            blocks: Blocks::LLAMA,
        },
        seed,
    }
}

/// The random-weight presets.
pub const RANDOM_PRESETS: &[RandomPreset] = &[
    micro(21, "micro"),
    micro(22, "micro-draft"),
    RandomPreset {
        name: "tiny-gqa",
        about: "4 layers, d 256, 8 query / 2 KV heads, SwiGLU 512, vocab 512",
        cfg: tiny(8, 2, 512, None),
        seed: 11,
    },
    RandomPreset {
        name: "tiny-mqa",
        about: "4 layers, d 256, 8 query heads / 1 KV head, SwiGLU 512, vocab 512",
        cfg: tiny(8, 1, 512, None),
        seed: 12,
    },
    RandomPreset {
        name: "tiny-mha",
        about: "4 layers, d 256, 8 heads (MHA), SwiGLU 512, vocab 512",
        cfg: tiny(8, 8, 512, None),
        seed: 13,
    },
    RandomPreset {
        name: "tiny-moe",
        about:
            "4 layers, d 256, 8 query / 2 KV heads, 8 experts of SwiGLU 256, top-2 (Mixtral style)",
        cfg: tiny(
            8,
            2,
            256,
            Some(MoeSpec {
                experts: 8,
                top_k: 2,
                capacity: Capacity::Dropless,
                d_ff: 256,
                norm: WeightNorm::Renormalize,
                shared: None,
            }),
        ),
        seed: 14,
    },
];

/// The random preset called `name`.
pub fn random_preset(name: &str) -> Option<RandomPreset> {
    RANDOM_PRESETS.iter().copied().find(|p| p.name == name)
}

/// Generated tensors under Hugging Face names.
struct Generated {
    name: String,
    tensors: BTreeMap<String, QuantMatrix>,
}

impl TensorSource for Generated {
    fn origin(&self) -> String {
        format!("preset {}", self.name)
    }
    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn matrix(&self, name: &str) -> Result<QuantMatrix> {
        Ok(self.tensors[name].clone())
    }
}

fn generate(p: &RandomPreset) -> Result<Generated> {
    let c = &p.cfg;
    let (d, f, qd, kvd) = (c.d_model, c.d_ff, c.q_dim(), c.kv_dim());
    let mut tensors = BTreeMap::new();
    let mut counter = 0u64;
    let mut add = |name: String, rows: usize, cols: usize, sd: Option<f32>| -> Result<()> {
        counter += 1;
        let w: Vec<f32> = match sd {
            Some(sd) => normal_buffer_par(derive_seed(p.seed, counter), DType::F32, rows * cols)
                .to_f32()
                .into_iter()
                .map(|v| v * sd)
                .collect(),
            None => vec![1.0; rows * cols],
        };
        tensors.insert(
            name,
            QuantMatrix::quantize(WeightFormat::F32, rows, cols, &w)?,
        );
        Ok(())
    };
    let fan = |n: usize| Some(1.0 / (n as f32).sqrt());
    add("model.embed_tokens.weight".into(), c.vocab, d, Some(1.0))?;
    add("lm_head.weight".into(), c.vocab, d, fan(d))?;
    add("model.norm.weight".into(), 1, d, None)?;
    for i in 0..c.layers {
        let l = |t: &str| format!("model.layers.{i}.{t}.weight");
        add(l("input_layernorm"), 1, d, None)?;
        add(l("post_attention_layernorm"), 1, d, None)?;
        add(l("self_attn.q_proj"), qd, d, fan(d))?;
        add(l("self_attn.k_proj"), kvd, d, fan(d))?;
        add(l("self_attn.v_proj"), kvd, d, fan(d))?;
        add(l("self_attn.o_proj"), d, qd, fan(qd))?;
        match c.moe {
            None => {
                add(l("mlp.gate_proj"), f, d, fan(d))?;
                add(l("mlp.up_proj"), f, d, fan(d))?;
                add(l("mlp.down_proj"), d, f, fan(f))?;
            }
            Some(m) => {
                add(l("block_sparse_moe.gate"), m.experts, d, fan(d))?;
                for j in 0..m.experts {
                    let e = |w: &str| l(&format!("block_sparse_moe.experts.{j}.{w}"));
                    add(e("w1"), f, d, fan(d))?;
                    add(e("w3"), f, d, fan(d))?;
                    add(e("w2"), d, f, fan(f))?;
                }
            }
        }
    }
    Ok(Generated {
        name: p.name.into(),
        tensors,
    })
}

/// The preset `name` with its seeded weights.
pub fn random_model(name: &str, opts: &LoadOptions) -> Result<Llama> {
    if let Some(p) = random_preset(name) {
        let row = arch::by_name(p.cfg.arch).expect("presets name rows of the table");
        let rope = RopeSpec::plain(p.cfg.rope_base as f64, p.cfg.head_dim);
        let spec = ModelSpec::uniform(row, p.cfg, rope, None, false);
        return build(&spec, &generate(&p)?, Naming::Hf, opts);
    }
    let known: Vec<&str> = RANDOM_PRESETS.iter().map(|p| p.name).collect();
    if let Some(shape) = config::preset(name) {
        return Err(KernelError::Unsupported(format!(
            "preset '{name}' is shape-only ({:.1}B parameters, for kv_calc and simulations); presets with weights: {}",
            shape.params() as f64 / 1e9,
            known.join(", ")
        )));
    }
    Err(KernelError::Unsupported(format!(
        "--model '{name}' is not a .gguf file, a checkpoint directory or a preset ({})",
        known.join(", ")
    )))
}
