//! Tensor sources and the model builder (the conversion step of llama.cpp's
//! `convert_hf_to_gguf.py` / transformers' `from_pretrained`, done at load time): a tensor
//! source (GGUF file, Hugging Face safetensors directory, seeded random preset) answers
//! matrices by name in its own naming scheme; `build` checks every shape, converts to the
//! requested weight format (`--weights`), stacks Q/K/V and gate/up, and assembles the layers.
//! The sources (`gguf`, `hf`, `presets`) import this module; `load` imports them.

use crate::model::llama::{Expert, Ffn, Layer, Llama, LlamaConfig, Result, DEFAULT_MATMUL};
use kernel_common::KernelError;
use moe_kernels::Capacity;
use paged_kernels::KvCacheFormat;
use quant_kernels::{MatVecVariant, QuantMatrix, WeightFormat};

/// Tensors by name, each as a rows × cols matrix (vectors: one row).
pub trait TensorSource {
    /// The file or preset, for error messages.
    fn origin(&self) -> String;
    fn has(&self, name: &str) -> bool;
    fn matrix(&self, name: &str) -> Result<QuantMatrix>;
}

/// How a source names its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// `blk.{i}.attn_q.weight` (llama.cpp).
    Gguf,
    /// `model.layers.{i}.self_attn.q_proj.weight` (transformers).
    Hf,
}

/// One tensor of the model.
#[derive(Debug, Clone, Copy)]
enum Part {
    Embed,
    Head,
    OutNorm,
    AttnNorm,
    Q,
    K,
    V,
    O,
    FfnNorm,
    Gate,
    Up,
    Down,
    Router,
    ExpertGate(usize),
    ExpertUp(usize),
    ExpertDown(usize),
}

fn name(naming: Naming, part: Part, layer: usize) -> String {
    use Part::*;
    match naming {
        Naming::Gguf => {
            let t = match part {
                Embed => return "token_embd.weight".into(),
                Head => return "output.weight".into(),
                OutNorm => return "output_norm.weight".into(),
                AttnNorm => "attn_norm",
                Q => "attn_q",
                K => "attn_k",
                V => "attn_v",
                O => "attn_output",
                FfnNorm => "ffn_norm",
                Gate => "ffn_gate",
                Up => "ffn_up",
                Down => "ffn_down",
                Router | ExpertGate(_) | ExpertUp(_) | ExpertDown(_) => "ffn_gate_inp",
            };
            format!("blk.{layer}.{t}.weight")
        }
        Naming::Hf => {
            let t = match part {
                Embed => return "model.embed_tokens.weight".into(),
                Head => return "lm_head.weight".into(),
                OutNorm => return "model.norm.weight".into(),
                AttnNorm => "input_layernorm".into(),
                Q => "self_attn.q_proj".into(),
                K => "self_attn.k_proj".into(),
                V => "self_attn.v_proj".into(),
                O => "self_attn.o_proj".into(),
                FfnNorm => "post_attention_layernorm".into(),
                Gate => "mlp.gate_proj".into(),
                Up => "mlp.up_proj".into(),
                Down => "mlp.down_proj".into(),
                Router => "block_sparse_moe.gate".into(),
                ExpertGate(j) => format!("block_sparse_moe.experts.{j}.w1"),
                ExpertDown(j) => format!("block_sparse_moe.experts.{j}.w2"),
                ExpertUp(j) => format!("block_sparse_moe.experts.{j}.w3"),
            };
            format!("model.layers.{layer}.{t}.weight")
        }
    }
}

/// What the loader is asked for besides the weights.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Attention variant spec (naive, flash2, paged[:split=...]).
    pub attention: String,
    /// Convert every matrix to this format (None: keep the source's).
    pub weights: Option<WeightFormat>,
    /// MoE capacity (dropless by default, as Mixtral runs at inference).
    pub capacity: Capacity,
    /// The product of every projection (see `Llama::matmul`).
    pub matmul: MatVecVariant,
    /// Formats for some projection matrices instead of `weights`, in order (a later match
    /// wins): per layer, per projection kind, or both.
    pub overrides: Vec<WeightOverride>,
    /// What the KV cache stores (see `Llama::kv_cache`): f32 unless asked.
    pub kv_cache: KvCacheFormat,
}

/// A projection kind of a layer (MoE experts count as gate/up/down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    /// transformers' name: q_proj, ..., down_proj.
    pub fn name(self) -> &'static str {
        match self {
            Proj::Q => "q_proj",
            Proj::K => "k_proj",
            Proj::V => "v_proj",
            Proj::O => "o_proj",
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }

    fn of(part: Part) -> Option<Proj> {
        match part {
            Part::Q => Some(Proj::Q),
            Part::K => Some(Proj::K),
            Part::V => Some(Proj::V),
            Part::O => Some(Proj::O),
            Part::Gate | Part::ExpertGate(_) => Some(Proj::Gate),
            Part::Up | Part::ExpertUp(_) => Some(Proj::Up),
            Part::Down | Part::ExpertDown(_) => Some(Proj::Down),
            _ => None,
        }
    }
}

/// One override of the weight format: the matrices of `layer` (None: every layer) of kind
/// `proj` (None: every projection) in `format`. `simulate` quantises and dequantises them
/// and keeps the values in the base format (simulated quantisation, the way per-layer
/// sensitivity is measured: the accuracy of the format without its kernel, and without
/// breaking the Q/K/V and gate/up stacks, whose parts must share a format).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WeightOverride {
    pub layer: Option<usize>,
    pub proj: Option<Proj>,
    pub format: WeightFormat,
    pub simulate: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            attention: "flash2".into(),
            weights: None,
            capacity: Capacity::Dropless,
            matmul: DEFAULT_MATMUL,
            overrides: vec![],
            kv_cache: KvCacheFormat::default(),
        }
    }
}

struct Builder<'a> {
    src: &'a dyn TensorSource,
    naming: Naming,
    weights: Option<WeightFormat>,
    overrides: &'a [WeightOverride],
}

impl Builder<'_> {
    fn err(&self, m: impl std::fmt::Display) -> KernelError {
        KernelError::BadBuffer(format!("{}: {m}", self.src.origin()))
    }

    /// The tensor, shape-checked, in the requested format.
    fn get(&self, part: Part, layer: usize, rows: usize, cols: usize) -> Result<QuantMatrix> {
        let n = name(self.naming, part, layer);
        if !self.src.has(&n) {
            return Err(self.err(format!("tensor '{n}' is missing")));
        }
        let m = self.src.matrix(&n)?;
        if m.rows != rows || m.cols != cols {
            return Err(self.err(format!(
                "tensor '{n}' is {}×{}, expected {rows}×{cols} from the config",
                m.rows, m.cols
            )));
        }
        let wanted = Proj::of(part).and_then(|p| {
            self.overrides
                .iter()
                .rev()
                .find(|o| o.layer.is_none_or(|l| l == layer) && o.proj.is_none_or(|q| q == p))
        });
        let convert = |m: QuantMatrix, f: WeightFormat| {
            QuantMatrix::quantize(f, rows, cols, &m.dequantize())
                .map_err(|e| self.err(format!("tensor '{n}' as {f}: {e}")))
        };
        let m = match wanted {
            Some(o) if o.simulate => {
                let round_trip = convert(m, o.format)?;
                QuantMatrix::quantize(WeightFormat::F32, rows, cols, &round_trip.dequantize())
                    .map_err(|e| self.err(format!("tensor '{n}': {e}")))?
            }
            Some(o) => return convert(m, o.format),
            None => m,
        };
        match self.weights {
            Some(f) if f != m.format => convert(m, f),
            _ => Ok(m),
        }
    }

    fn vector(&self, part: Part, layer: usize, len: usize) -> Result<Vec<f32>> {
        let n = name(self.naming, part, layer);
        if !self.src.has(&n) {
            return Err(self.err(format!("tensor '{n}' is missing")));
        }
        let m = self.src.matrix(&n)?;
        if m.rows * m.cols != len {
            return Err(self.err(format!(
                "tensor '{n}' has {} values, expected {len}",
                m.rows * m.cols
            )));
        }
        Ok(m.dequantize())
    }

    fn stack(&self, parts: &[&QuantMatrix], layer: usize) -> Result<QuantMatrix> {
        QuantMatrix::stack(parts).map_err(|e| {
            self.err(format!(
                "layer {layer}: {e} (Q/K/V and gate/up are stacked: override them together)"
            ))
        })
    }

    fn expert(
        &self,
        gate: Part,
        up: Part,
        down: Part,
        i: usize,
        cfg: &LlamaConfig,
    ) -> Result<Expert> {
        let (d, f) = (cfg.d_model, cfg.d_ff);
        let (g, u) = (self.get(gate, i, f, d)?, self.get(up, i, f, d)?);
        Ok(Expert {
            gate_up: self.stack(&[&g, &u], i)?.into(),
            down: self.get(down, i, d, f)?.into(),
        })
    }

    fn layer(&self, i: usize, cfg: &LlamaConfig) -> Result<Layer> {
        let (d, qd, kvd) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim());
        let (q, k, v) = (
            self.get(Part::Q, i, qd, d)?,
            self.get(Part::K, i, kvd, d)?,
            self.get(Part::V, i, kvd, d)?,
        );
        let ffn = match cfg.moe {
            None => Ffn::Dense(self.expert(Part::Gate, Part::Up, Part::Down, i, cfg)?),
            Some(m) => {
                // HF stores the router as [experts, d_model]; the router kernel takes x·W.
                let r = self.get(Part::Router, i, m.experts, d)?.dequantize();
                let mut router = vec![0.0f32; d * m.experts];
                for e in 0..m.experts {
                    for c in 0..d {
                        router[c * m.experts + e] = r[e * d + c];
                    }
                }
                let experts = (0..m.experts)
                    .map(|j| {
                        self.expert(
                            Part::ExpertGate(j),
                            Part::ExpertUp(j),
                            Part::ExpertDown(j),
                            i,
                            cfg,
                        )
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ffn::Moe { router, experts }
            }
        };
        Ok(Layer {
            attn_norm: self.vector(Part::AttnNorm, i, d)?,
            wqkv: self.stack(&[&q, &k, &v], i)?.into(),
            wo: self.get(Part::O, i, d, qd)?.into(),
            ffn_norm: self.vector(Part::FfnNorm, i, d)?,
            ffn,
        })
    }
}

/// Builds the model of shape `cfg` from `src`; the head is `lm_head`/`output` when the source
/// has one and `tied` is false, else the embedding.
pub fn build(
    cfg: LlamaConfig,
    src: &dyn TensorSource,
    naming: Naming,
    tied: bool,
    opts: &LoadOptions,
) -> Result<Llama> {
    cfg.validate()
        .map_err(|e| KernelError::BadBuffer(format!("{}: {e}", src.origin())))?;
    let b = Builder {
        src,
        naming,
        weights: opts.weights,
        overrides: &opts.overrides,
    };
    let layers = (0..cfg.layers)
        .map(|i| b.layer(i, &cfg))
        .collect::<Result<Vec<_>>>()?;
    let embed = b.get(Part::Embed, 0, cfg.vocab, cfg.d_model)?;
    let head = if !tied && src.has(&name(naming, Part::Head, 0)) {
        Some(b.get(Part::Head, 0, cfg.vocab, cfg.d_model)?)
    } else {
        None
    };
    let mut cfg = cfg;
    if let Some(m) = cfg.moe.as_mut() {
        m.capacity = opts.capacity;
    }
    let mut model = Llama::new(
        cfg,
        embed,
        head,
        b.vector(Part::OutNorm, 0, cfg.d_model)?,
        layers,
        &opts.attention,
    )?;
    model.set_matmul(opts.matmul)?;
    model.set_kv_cache(opts.kv_cache);
    Ok(model)
}
