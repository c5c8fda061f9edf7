//! A Llama-family decoder (HF `LlamaForCausalLM` / `MixtralForCausalLM`, llama.cpp's `llama`
//! architecture), its shape and weights: the config (RMSNorm eps, rotary embeddings with
//! half-split pairs as in Hugging Face checkpoints or interleaved pairs as GGUF llama files
//! need, MHA/GQA/MQA heads, a SwiGLU feed-forward or a Mixtral MoE), the layers with Q/K/V and
//! gate/up stacked into one `quant_kernels` product each and laid out for the model's product
//! (`set_matmul`), a tied or untied output head, and the attention kernels the forward pass
//! calls (`attention_choice`). The forward pass itself is `forward.rs`.

use attention_kernels::AttentionKernel;
use kernel_common::KernelError;
use moe_kernels::Capacity;
use paged_kernels::{KvCacheFormat, SplitKv};
use quant_kernels::{MatVecVariant, Prepared, QuantMatrix};

/// The error type of the pipeline: one line naming the file or input at fault.
pub type Result<T> = std::result::Result<T, KernelError>;

/// How rotary embeddings pair the dimensions of a head: `HalfSplit` (x[i], x[i + d/2]) as
/// Hugging Face checkpoints, `Interleaved` (x[2i], x[2i+1]) as GGUF llama files (their Q/K rows
/// are permuted at conversion).
pub use kernel_cpu::ops::RopePairs as RopeLayout;

/// A Mixtral-style sparse feed-forward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeSpec {
    pub experts: usize,
    pub top_k: usize,
    /// Dropless (Mixtral at inference) unless a capacity factor is chosen.
    pub capacity: Capacity,
}

/// The shape of the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaConfig {
    pub layers: usize,
    pub d_model: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub d_ff: usize,
    pub vocab: usize,
    pub context: usize,
    pub eps: f32,
    pub rope_base: f32,
    pub rope: RopeLayout,
    pub moe: Option<MoeSpec>,
}

impl LlamaConfig {
    /// Checks that the sizes are consistent; one error naming the first problem.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(KernelError::InvalidShape(m));
        let sizes = [
            ("layers", self.layers),
            ("d_model", self.d_model),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("d_ff", self.d_ff),
            ("vocab", self.vocab),
            ("context", self.context),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{name} must be > 0"));
        }
        let products = [
            ("heads × head_dim", self.heads.checked_mul(self.head_dim)),
            (
                "kv_heads × head_dim",
                self.kv_heads.checked_mul(self.head_dim),
            ),
            ("d_ff × d_model", self.d_ff.checked_mul(self.d_model)),
            ("vocab × d_model", self.vocab.checked_mul(self.d_model)),
        ];
        if let Some((name, _)) = products.iter().find(|(_, v)| v.is_none()) {
            return bad(format!("{name} overflows the address space"));
        }
        for (name, v) in [("eps", self.eps), ("rope_base", self.rope_base)] {
            if !(v.is_finite() && v > 0.0) {
                return bad(format!("{name} {v} must be a positive finite number"));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads are not a multiple of {} KV heads",
                self.heads, self.kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if let Some(m) = self.moe {
            if m.top_k == 0 || m.top_k > m.experts {
                return bad(format!(
                    "top-k {} must be in 1..={} experts",
                    m.top_k, m.experts
                ));
            }
        }
        Ok(())
    }

    /// Width of the attention output (heads × head_dim).
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Width of K or V per token (kv_heads × head_dim).
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// One expert's SwiGLU: gate and up stacked, down.
pub struct Expert {
    pub gate_up: Prepared,
    pub down: Prepared,
}

/// A layer's feed-forward.
pub enum Ffn {
    Dense(Expert),
    /// Router W [d_model × experts] (x·W) and the experts.
    Moe {
        router: Vec<f32>,
        experts: Vec<Expert>,
    },
}

/// One decoder layer.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    /// Q, K and V stacked: one product per step instead of three.
    pub wqkv: Prepared,
    pub wo: Prepared,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
}

/// Which attention kernels the forward pass calls.
pub enum AttentionChoice {
    /// A contiguous kernel (naive, flash2, ...) on K/V gathered from the cache per sequence.
    Contiguous(Box<dyn AttentionKernel>),
    /// Paged decode straight on the block pool for chunks of ≤ 16 tokens.
    Paged(SplitKv),
}

/// A loaded model (weights and the attention choice; the KV cache lives in `KvPools`).
pub struct Llama {
    pub cfg: LlamaConfig,
    pub embed: Prepared,
    pub head: Option<Prepared>,
    pub out_norm: Vec<f32>,
    pub layers: Vec<Layer>,
    pub attention: AttentionChoice,
    /// The product of every projection (`fused`, `fused:act=q8`, `packed`, ...; formats it
    /// does not take use the default); the weights are laid out for it (`set_matmul`).
    pub(super) matmul: MatVecVariant,
    /// For chunks the chosen kernel does not take (a prompt under paged decode).
    pub(super) fallback: Box<dyn AttentionKernel>,
    /// What every `KvPools` built for this model stores K/V in (`set_kv_cache`).
    pub(super) kv_cache: KvCacheFormat,
    /// RoPE inverse frequencies, one per dimension pair.
    pub(super) inv_freq: Vec<f32>,
}

/// The greedy choice: the largest logit, the lowest id on ties (NaN never chosen; token 0 for
/// a row without a number).
pub fn argmax(logits: &[f32]) -> u32 {
    kernel_cpu::ops::argmax(logits).unwrap_or(0) as u32
}

/// The product every projection uses unless the model is given another.
pub const DEFAULT_MATMUL: MatVecVariant = MatVecVariant::FUSED;

/// The product a weight of `format` gets when the model's is `variant`.
pub(super) fn product_for(
    variant: MatVecVariant,
    format: quant_kernels::WeightFormat,
) -> MatVecVariant {
    if quant_kernels::supports(variant, format).is_ok() {
        variant
    } else {
        DEFAULT_MATMUL
    }
}

/// `w` laid out for the product its format gets under `variant`.
fn relayout(w: &Prepared, variant: MatVecVariant) -> Result<Prepared> {
    Prepared::new(w.rows_matrix(), product_for(variant, w.format()))
}

impl Llama {
    /// Assembles a model; `attention` is an attention variant spec (naive, flash2, paged, ...).
    pub fn new(
        cfg: LlamaConfig,
        embed: QuantMatrix,
        head: Option<QuantMatrix>,
        out_norm: Vec<f32>,
        layers: Vec<Layer>,
        attention: &str,
    ) -> Result<Llama> {
        cfg.validate()?;
        let d = cfg.head_dim;
        let inv_freq = (0..d / 2)
            .map(|i| 1.0 / cfg.rope_base.powf((2 * i) as f32 / d as f32))
            .collect();
        Ok(Llama {
            attention: attention_choice(attention)?,
            fallback: attention_kernels::kernel_from_spec(&kernel_common::VariantSpec::parse(
                "flash2",
            )?)?
            .expect("flash2 exists"),
            matmul: DEFAULT_MATMUL,
            kv_cache: KvCacheFormat::default(),
            cfg,
            embed: embed.into(),
            head: head.map(Prepared::from),
            out_norm,
            layers,
            inv_freq,
        })
    }

    /// Keeps the first `n` layers (self-speculative drafting by layer skipping, as in
    /// Draft & Verify, Zhang et al. 2023): the same embedding, final norm and head.
    pub fn keep_layers(&mut self, n: usize) -> Result<()> {
        if n == 0 || n > self.layers.len() {
            return Err(KernelError::InvalidShape(format!(
                "cannot keep {n} of {} layers",
                self.layers.len()
            )));
        }
        self.layers.truncate(n);
        self.cfg.layers = n;
        Ok(())
    }

    /// The format of the KV caches built for this model.
    pub fn kv_cache(&self) -> KvCacheFormat {
        self.kv_cache
    }

    /// Builds every later `KvPools` of this model in `format` (f32 by default).
    pub fn set_kv_cache(&mut self, format: KvCacheFormat) {
        self.kv_cache = format;
    }

    /// The product every projection uses.
    pub fn matmul(&self) -> MatVecVariant {
        self.matmul
    }

    /// Uses `variant` for every projection (formats it does not take use the default) and
    /// lays every weight out for it: packed into tiles for `packed`, row-major otherwise.
    pub fn set_matmul(&mut self, variant: MatVecVariant) -> Result<()> {
        if variant == MatVecVariant::Cuda {
            return Err(KernelError::Unsupported(
                "the model's projections run on the CPU; cuda_gemv is a quant-family variant"
                    .into(),
            ));
        }
        variant.isa()?;
        let lay = |w: &mut Prepared| -> Result<()> {
            *w = relayout(w, variant)?;
            Ok(())
        };
        lay(&mut self.embed)?;
        if let Some(h) = self.head.as_mut() {
            lay(h)?;
        }
        for l in &mut self.layers {
            lay(&mut l.wqkv)?;
            lay(&mut l.wo)?;
            match &mut l.ffn {
                Ffn::Dense(e) => {
                    lay(&mut e.gate_up)?;
                    lay(&mut e.down)?;
                }
                Ffn::Moe { experts, .. } => {
                    for e in experts {
                        lay(&mut e.gate_up)?;
                        lay(&mut e.down)?;
                    }
                }
            }
        }
        self.matmul = variant;
        Ok(())
    }

    /// Bytes of all weights (what one decode step must read at least once).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes_by(Prepared::byte_len)
    }

    /// Bytes the same weights take in f32 (what a reference model or a `self:FORMAT` drafter
    /// decoded from them holds, for the harness's memory guard).
    pub fn f32_weight_bytes(&self) -> usize {
        self.weight_bytes_by(|q| 4 * q.rows() * q.cols())
    }

    /// The weights' bytes with each matrix counted by `m`; norms and the router in f32.
    fn weight_bytes_by(&self, m: impl Fn(&Prepared) -> usize) -> usize {
        let mut total = self.head.as_ref().map_or(0, &m) + 4 * self.out_norm.len();
        if self.head.is_none() {
            total += m(&self.embed);
        }
        for l in &self.layers {
            total += m(&l.wqkv) + m(&l.wo) + 4 * (l.attn_norm.len() + l.ffn_norm.len());
            total += match &l.ffn {
                Ffn::Dense(e) => m(&e.gate_up) + m(&e.down),
                Ffn::Moe { router, experts } => {
                    4 * router.len()
                        + experts
                            .iter()
                            .map(|e| m(&e.gate_up) + m(&e.down))
                            .sum::<usize>()
                }
            };
        }
        total
    }
}

/// Parses an attention spec for the model: a contiguous kernel, or `paged[:split=...]` (the
/// block size is the KV cache's, `--block-size`).
pub fn attention_choice(spec: &str) -> Result<AttentionChoice> {
    let parsed = kernel_common::VariantSpec::parse(spec)?;
    if parsed.name == "paged" {
        parsed.only(&["split"]).map_err(|_| {
            KernelError::Unsupported(format!(
                "attention '{spec}': the model's paged attention takes only split=...; the block size is --block-size"
            ))
        })?;
        // Split by default: a decode step of one sequence has only kv_heads tasks.
        let split = SplitKv::parse(parsed.params.get("split").map_or("auto", String::as_str))?;
        return Ok(AttentionChoice::Paged(split));
    }
    match attention_kernels::kernel_from_spec(&parsed)? {
        Some(k) => Ok(AttentionChoice::Contiguous(k)),
        None => Err(KernelError::Unsupported(format!(
            "unknown attention variant '{spec}' (naive, flash2, paged, with parameters)"
        ))),
    }
}
