//! The decoder every architecture of `arch/` runs (the type is still called `Llama`: Llama is
//! the template the others vary): its shape (`LlamaConfig`, with the `Blocks` an architecture
//! chooses — Q/K/V/O and MLP biases, per-head or whole-projection QK RMSNorm, Gemma's pre- and
//! post-norms, SwiGLU or GeGLU, embedding scale, attention scale and soft-capping — and a
//! dense or MoE feed-forward), the layers (each with its sliding window and RoPE kind), the
//! projections (`Projection`: Q/K/V and gate/up stacked into one `kernel_quant` product where
//! their formats agree, biases added after the product, laid out for the model's product by
//! `set_matmul`), a tied or untied output head, and the attention kernels the forward pass
//! calls (`attention_choice`). The forward pass itself is `forward.rs`.

use crate::model::rope::{Rope, RopeSpec};
use kernel_attention::AttentionKernel;
use kernel_common::KernelError;
use kernel_moe::{Capacity, WeightNorm};
use kernel_paged::{KvCacheFormat, SplitKv};
use kernel_quant::{MatVecVariant, Prepared, QuantMatrix, WeightFormat};
use std::collections::BTreeMap;

/// The error type of the pipeline: one line naming the file or input at fault.
pub type Result<T> = std::result::Result<T, KernelError>;

/// How rotary embeddings pair the dimensions of a head: `HalfSplit` (x[i], x[i + d/2]) as
/// Hugging Face checkpoints, `Interleaved` (x[2i], x[2i+1]) as GGUF llama files (their Q/K rows
/// are permuted at conversion).
pub use kernel_cpu::ops::RopePairs as RopeLayout;

/// A sparse feed-forward: Mixtral, OLMoE, Qwen2-MoE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeSpec {
    pub experts: usize,
    pub top_k: usize,
    /// Dropless (Mixtral at inference) unless a capacity factor is chosen.
    pub capacity: Capacity,
    /// Width of each routed expert.
    pub d_ff: usize,
    /// The top-k weights renormalised (Mixtral, `norm_topk_prob`) or the raw softmax (OLMoE).
    pub norm: WeightNorm,
    /// A shared expert of this width behind a sigmoid gate, added to every token (Qwen2-MoE).
    pub shared: Option<usize>,
}

/// Where a query/key RMSNorm applies before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Over each head (Gemma-3, Qwen3): a gain of head_dim.
    PerHead,
    /// Over the whole Q and K projections (OLMoE): gains of q_dim and kv_dim.
    Whole,
}

/// The gated feed-forward's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mlp {
    /// silu(gate) · up (Shazeer 2020).
    SwiGlu,
    /// gelu_tanh(gate) · up (Gemma's `gelu_pytorch_tanh`).
    GeGlu,
}

/// The blocks an architecture chooses around the Llama template.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Blocks {
    /// Biases on Q, K and V (Qwen2) — Llama's `attention_bias` sets these and `o_bias`.
    pub qkv_bias: bool,
    pub o_bias: bool,
    /// Biases on gate, up and down (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    pub qk_norm: QkNorm,
    /// RMSNorms after attention and after the feed-forward, before each residual add
    /// (Gemma-3's four norms per layer).
    pub post_norms: bool,
    pub mlp: Mlp,
    /// The embedding is multiplied by this (Gemma: √d_model).
    pub embed_scale: Option<f32>,
    /// The attention scale instead of 1/√head_dim (Gemma: query_pre_attn_scalar^−½).
    pub attn_scale: Option<f32>,
    /// Attention scores soft-capped: cap · tanh(s / cap) (Gemma-2).
    pub attn_softcap: Option<f32>,
    /// Logits soft-capped the same way (Gemma-2, Gemma-3).
    pub final_softcap: Option<f32>,
}

impl Blocks {
    /// Llama's: no biases, no QK norm, pre-norms only, SwiGLU, no scales or caps.
    pub const LLAMA: Blocks = Blocks {
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        qk_norm: QkNorm::None,
        post_norms: false,
        mlp: Mlp::SwiGlu,
        embed_scale: None,
        attn_scale: None,
        attn_softcap: None,
        final_softcap: None,
    };
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
    /// The base of the global layers' RoPE (each layer's own is in `Llama::ropes`).
    pub rope_base: f32,
    pub rope: RopeLayout,
    /// The sparse feed-forward of the MoE layers (which layers: `Layer::ffn`).
    pub moe: Option<MoeSpec>,
    /// The architecture's row in `arch::ARCHITECTURES` ("llama", "gemma3", ...).
    pub arch: &'static str,
    pub blocks: Blocks,
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
            if m.d_ff == 0 || m.shared == Some(0) {
                return bad("an expert of width 0".into());
            }
        }
        let b = &self.blocks;
        for (name, v) in [
            ("embedding scale", b.embed_scale),
            ("attention scale", b.attn_scale),
            ("attention soft-cap", b.attn_softcap),
            ("final soft-cap", b.final_softcap),
        ] {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return bad(format!("{name} {v} must be a positive finite number"));
            }
        }
        Ok(())
    }

    /// The attention scale: the architecture's, or 1/√head_dim.
    pub fn attn_scale(&self) -> f32 {
        self.blocks
            .attn_scale
            .unwrap_or(1.0 / (self.head_dim as f32).sqrt())
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

/// y = x·Wᵀ + b, the rows of W in one or more products: Q, K and V (or gate and up) stacked
/// into one where their formats agree, separate products where they do not (a file's Q and K
/// in q5_0, V in q8_0: Q+K stacked, V alone); their outputs are concatenated in order.
pub struct Projection {
    pub parts: Vec<Prepared>,
    /// One bias per output row, added after the product.
    pub bias: Option<Vec<f32>>,
}

impl Projection {
    /// Output width (rows of W).
    pub fn rows(&self) -> usize {
        self.parts.iter().map(Prepared::rows).sum()
    }

    /// Input width.
    pub fn cols(&self) -> usize {
        self.parts[0].cols()
    }

    /// The format of its first product (of every product, unless a file mixes formats).
    pub fn format(&self) -> WeightFormat {
        self.parts[0].format()
    }

    /// Bytes of the weights counted by `m`, plus the bias in f32.
    fn bytes_by(&self, m: &impl Fn(&Prepared) -> usize) -> usize {
        self.parts.iter().map(m).sum::<usize>() + self.bias.as_ref().map_or(0, |b| 4 * b.len())
    }
}

impl From<QuantMatrix> for Projection {
    fn from(m: QuantMatrix) -> Projection {
        Projection {
            parts: vec![m.into()],
            bias: None,
        }
    }
}

/// One expert's gated feed-forward: gate and up (stacked), down.
pub struct Expert {
    pub gate_up: Projection,
    pub down: Projection,
}

impl Expert {
    /// The hidden width.
    pub fn width(&self) -> usize {
        self.gate_up.rows() / 2
    }
}

/// Qwen2-MoE's shared expert: every token's output plus sigmoid(x·gate) times this expert's.
pub struct SharedExpert {
    pub expert: Expert,
    /// The 1 × d_model gate.
    pub gate: Projection,
}

/// A layer's feed-forward.
pub enum Ffn {
    Dense(Expert),
    /// Router W [d_model × experts] (x·W), the routed experts, an optional shared expert.
    Moe {
        router: Vec<f32>,
        experts: Vec<Expert>,
        shared: Option<SharedExpert>,
    },
}

/// One decoder layer.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    /// Q, K and V: one product per step where their formats agree.
    pub wqkv: Projection,
    /// RMSNorm gains of Q and K before RoPE (`Blocks::qk_norm`).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub wo: Projection,
    /// The norm of the attention output before the residual add (`Blocks::post_norms`).
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// A query at position p sees keys j with p − j < window (None: all j ≤ p).
    pub window: Option<usize>,
    /// Index of the layer's RoPE in `Llama::ropes` (Gemma-3: local or global).
    pub rope: usize,
}

impl Layer {
    /// Every projection of the layer.
    pub fn projections(&self) -> Vec<&Projection> {
        let mut all = vec![&self.wqkv, &self.wo];
        all.extend(self.ffn.projections());
        all
    }

    fn projections_mut(&mut self) -> Vec<&mut Projection> {
        let mut all = vec![&mut self.wqkv, &mut self.wo];
        match &mut self.ffn {
            Ffn::Dense(e) => all.extend([&mut e.gate_up, &mut e.down]),
            Ffn::Moe {
                experts, shared, ..
            } => {
                for e in experts {
                    all.extend([&mut e.gate_up, &mut e.down]);
                }
                if let Some(s) = shared {
                    all.extend([&mut s.expert.gate_up, &mut s.expert.down, &mut s.gate]);
                }
            }
        }
        all
    }

    /// The f32 vectors: norms and the router.
    fn vector_len(&self) -> usize {
        let opt = |v: &Option<Vec<f32>>| v.as_ref().map_or(0, Vec::len);
        let router = match &self.ffn {
            Ffn::Moe { router, .. } => router.len(),
            Ffn::Dense(_) => 0,
        };
        self.attn_norm.len()
            + self.ffn_norm.len()
            + opt(&self.q_norm)
            + opt(&self.k_norm)
            + opt(&self.post_attn_norm)
            + opt(&self.post_ffn_norm)
            + router
    }
}

impl Ffn {
    /// The feed-forward's projections: the expert's, or every routed and the shared expert's.
    pub fn projections(&self) -> Vec<&Projection> {
        match self {
            Ffn::Dense(e) => vec![&e.gate_up, &e.down],
            Ffn::Moe {
                experts, shared, ..
            } => {
                let mut all: Vec<&Projection> =
                    experts.iter().flat_map(|e| [&e.gate_up, &e.down]).collect();
                if let Some(s) = shared {
                    all.extend([&s.expert.gate_up, &s.expert.down, &s.gate]);
                }
                all
            }
        }
    }
}

/// Which attention kernels the forward pass calls.
pub enum AttentionChoice {
    /// A contiguous kernel (naive, flash2, ...) on K/V gathered from the cache per sequence.
    Contiguous(Box<dyn AttentionKernel>),
    /// Paged decode straight on the block pool for chunks of ≤ 16 tokens.
    Paged(SplitKv),
}

/// A loaded model of any architecture (weights and the attention choice; the KV cache lives in
/// `KvPools`).
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
    /// The RoPE of each layer kind (`Layer::rope` indexes it).
    pub(super) ropes: Vec<Rope>,
}

/// The greedy choice: the largest logit, the lowest id on ties (NaN never chosen; token 0 for
/// a row without a number).
pub fn argmax(logits: &[f32]) -> u32 {
    kernel_cpu::ops::argmax(logits).unwrap_or(0) as u32
}

/// The product every projection uses unless the model is given another.
pub const DEFAULT_MATMUL: MatVecVariant = MatVecVariant::FUSED;

/// The product a weight of `format` gets when the model's is `variant`: `variant` itself; for
/// `packed` on a format it does not tile (Q2_K, Q3_K in a file's mix) the same int8
/// arithmetic on row-major weights (`fused:act=q8`, llama.cpp's `vec_dot` for that type) at
/// the same tier; else `DEFAULT_MATMUL`.
pub(super) fn product_for(variant: MatVecVariant, format: WeightFormat) -> MatVecVariant {
    if kernel_quant::supports(variant, format).is_ok() {
        return variant;
    }
    if let MatVecVariant::Packed(isa) = variant {
        let q8 = MatVecVariant::FusedQ8(isa);
        if kernel_quant::supports(q8, format).is_ok() {
            return q8;
        }
    }
    DEFAULT_MATMUL
}

/// `w` laid out for the product its format gets under `variant`.
fn relayout(w: &Prepared, variant: MatVecVariant) -> Result<Prepared> {
    Prepared::new(w.rows_matrix(), product_for(variant, w.format()))
}

impl Llama {
    /// Assembles a model; `ropes` are the RoPE of each layer kind (`Layer::rope`), `attention`
    /// an attention variant spec (naive, flash2, paged, ...).
    pub fn new(
        cfg: LlamaConfig,
        embed: QuantMatrix,
        head: Option<QuantMatrix>,
        out_norm: Vec<f32>,
        layers: Vec<Layer>,
        ropes: &[RopeSpec],
        attention: &str,
    ) -> Result<Llama> {
        cfg.validate()?;
        let ropes = ropes.iter().map(Rope::new).collect::<Result<Vec<_>>>()?;
        if let Some((i, l)) = layers
            .iter()
            .enumerate()
            .find(|(_, l)| ropes.get(l.rope).is_none_or(|r| r.dim > cfg.head_dim))
        {
            return Err(KernelError::InvalidShape(format!(
                "layer {i} names RoPE {} of {} (each at most head_dim {} wide)",
                l.rope,
                ropes.len(),
                cfg.head_dim
            )));
        }
        Ok(Llama {
            attention: attention_choice(attention)?,
            fallback: kernel_attention::kernel_from_spec(&kernel_common::VariantSpec::parse(
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
            ropes,
        })
    }

    /// The original context of a longrope RoPE (Phi-3), past which a pass rotates with the
    /// long factors: a sequence that grows past it is recomputed from its first token
    /// (`Session` does, as transformers' Phi-3 generation does).
    pub fn longrope_original(&self) -> Option<usize> {
        self.ropes.iter().filter_map(Rope::long_from).min()
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
            for p in l.projections_mut() {
                p.parts.iter_mut().try_for_each(lay)?;
            }
        }
        self.matmul = variant;
        Ok(())
    }

    /// Bytes of the weights one decode step reads at least once (the embedding only through
    /// its one row when the head is separate).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes_by(Prepared::byte_len, false)
    }

    /// Bytes of every weight the model holds: the embedding and a separate head both, every
    /// layer's projections, norms, biases and routers (what the harness's memory guard
    /// counts for a loaded model).
    pub fn held_bytes(&self) -> usize {
        self.weight_bytes_by(Prepared::byte_len, true)
    }

    /// Bytes the weights the model holds take in f32 (what a reference model or a
    /// `self:FORMAT` drafter decoded from them holds, for the harness's memory guard).
    pub fn f32_weight_bytes(&self) -> usize {
        self.weight_bytes_by(|q| 4 * q.rows() * q.cols(), true)
    }

    /// The weights' bytes with each matrix counted by `m` (the embedding as well as a
    /// separate head when `held`); norms, biases and routers in f32.
    fn weight_bytes_by(&self, m: impl Fn(&Prepared) -> usize, held: bool) -> usize {
        let mut total = self.head.as_ref().map_or(0, &m) + 4 * self.out_norm.len();
        if self.head.is_none() || held {
            total += m(&self.embed);
        }
        for l in &self.layers {
            total += 4 * l.vector_len();
            total += l
                .projections()
                .iter()
                .map(|p| p.bytes_by(&m))
                .sum::<usize>();
        }
        total
    }

    /// The bytes the model holds per stored format, largest first (norms, biases and routers
    /// count as f32; a tied head once, as the embedding).
    pub fn bytes_by_format(&self) -> Vec<(WeightFormat, usize)> {
        let mut by: BTreeMap<String, (WeightFormat, usize)> = BTreeMap::new();
        let mut add = |f: WeightFormat, n: usize| by.entry(f.to_string()).or_insert((f, 0)).1 += n;
        add(self.embed.format(), self.embed.byte_len());
        if let Some(h) = &self.head {
            add(h.format(), h.byte_len());
        }
        let mut vectors = self.out_norm.len();
        for l in &self.layers {
            vectors += l.vector_len();
            for p in l.projections() {
                for w in &p.parts {
                    add(w.format(), w.byte_len());
                }
                vectors += p.bias.as_ref().map_or(0, Vec::len);
            }
        }
        add(WeightFormat::F32, 4 * vectors);
        let mut out: Vec<(WeightFormat, usize)> = by.into_values().collect();
        out.sort_by_key(|p| std::cmp::Reverse(p.1));
        out
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
        // Split by default (a decode step of one sequence has only kv_heads tasks), by the
        // context length alone so the logits do not depend on --threads.
        let split = SplitKv::parse(parsed.params.get("split").map_or("ctx", String::as_str))?;
        return Ok(AttentionChoice::Paged(split));
    }
    match kernel_attention::kernel_from_spec(&parsed)? {
        Some(k) => Ok(AttentionChoice::Contiguous(k)),
        None => Err(KernelError::Unsupported(format!(
            "unknown attention variant '{spec}' (naive, flash2, paged, with parameters)"
        ))),
    }
}
