//! Tensor sources and the model builder (the conversion step of llama.cpp's
//! `convert_hf_to_gguf.py` / transformers' `from_pretrained`, done at load time): a tensor
//! source (GGUF file, Hugging Face safetensors directory, seeded random preset) answers
//! matrices by name in its own naming scheme; `build` takes an architecture's `ModelSpec`,
//! names each tensor through the architecture's row, checks every shape, splits fused
//! tensors (Phi-3's `qkv_proj`, llama.cpp's 3-D expert tensors), converts to the requested
//! weight format (`--weights`, overrides), stacks Q/K/V and gate/up where their formats agree
//! (separate products where a file mixes them), adds Gemma's norm offset, and assembles the
//! layers. The sources (`gguf`, `hf`, `presets`) import this module; `load` imports them.

use crate::model::arch::{ExpertPart, ModelSpec, Naming, Part};
use crate::model::gguf::Gguf;
use crate::model::llama::{
    Expert, Ffn, Layer, Llama, Projection, QkNorm, Result, SharedExpert, DEFAULT_MATMUL,
};
use kernel_common::KernelError;
use kernel_moe::Capacity;
use kernel_paged::KvCacheFormat;
use kernel_quant::{MatVecVariant, QuantMatrix, WeightFormat};

/// Tensors by name, each as a rows × cols matrix (vectors: one row; a 3-D tensor: its
/// matrices' rows one after another).
pub trait TensorSource {
    /// The file or preset, for error messages.
    fn origin(&self) -> String;
    fn has(&self, name: &str) -> bool;
    fn matrix(&self, name: &str) -> Result<QuantMatrix>;
}

impl TensorSource for Gguf {
    fn origin(&self) -> String {
        self.path.display().to_string()
    }
    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn matrix(&self, name: &str) -> Result<QuantMatrix> {
        Gguf::matrix(self, name)
    }
}

/// The format `--weights f` gives a matrix whose rows are `cols` long: `f` itself, or where
/// a K-quant's super-block of 256 does not divide the row, llama-quantize's fallback
/// (`llama_tensor_get_type`: Q2_K/Q3_K → IQ4_NL, Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0), as
/// for SmolLM2's rows of 576.
pub fn row_fallback(f: WeightFormat, cols: usize) -> WeightFormat {
    if !f.is_k_quant() || cols.is_multiple_of(256) {
        return f;
    }
    match f {
        WeightFormat::Q2_K | WeightFormat::Q3_K => WeightFormat::IQ4_NL,
        WeightFormat::Q4_K => WeightFormat::Q5_0,
        WeightFormat::Q5_K => WeightFormat::Q5_1,
        WeightFormat::Q6_K | WeightFormat::Q8_K => WeightFormat::Q8_0,
        other => other,
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
        let e = |x: ExpertPart| match x {
            ExpertPart::Gate => Proj::Gate,
            ExpertPart::Up => Proj::Up,
            ExpertPart::Down => Proj::Down,
        };
        match part {
            Part::Q => Some(Proj::Q),
            Part::K => Some(Proj::K),
            Part::V => Some(Proj::V),
            Part::O => Some(Proj::O),
            Part::Gate => Some(Proj::Gate),
            Part::Up => Some(Proj::Up),
            Part::Down => Some(Proj::Down),
            Part::Expert(_, x) | Part::Experts(x) | Part::Shared(x) => Some(e(x)),
            _ => None,
        }
    }
}

/// One override of the weight format: the matrices of `layer` (None: every layer) of kind
/// `proj` (None: every projection) in `format`. `simulate` quantises and dequantises them
/// and keeps the values in the base format (simulated quantisation, the way per-layer
/// sensitivity is measured: the accuracy of the format without its kernel, and without
/// splitting the Q/K/V and gate/up stacks, which stack only parts of one format).
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
    spec: &'a ModelSpec,
    naming: Naming,
    weights: Option<WeightFormat>,
    overrides: &'a [WeightOverride],
}

/// Rows `at..at + n` of `m`, in its format.
fn rows_of(m: &QuantMatrix, at: usize, n: usize) -> Result<QuantMatrix> {
    let rb = m.format.row_bytes(m.cols);
    QuantMatrix::from_bytes(
        m.format,
        n,
        m.cols,
        m.bytes()[at * rb..(at + n) * rb].to_vec(),
    )
}

impl Builder<'_> {
    fn err(&self, m: impl std::fmt::Display) -> KernelError {
        KernelError::BadFile(format!("{}: {m}", self.src.origin()))
    }

    /// The full name of `part`'s `suffix` tensor (`weight`, `bias`), if the architecture has one.
    fn name(&self, part: Part, layer: usize, suffix: &str) -> Option<String> {
        self.spec
            .arch
            .name(self.naming, part, layer)
            .map(|stem| format!("{stem}.{suffix}"))
    }

    /// Whether the source has `part`'s weight.
    fn present(&self, part: Part, layer: usize) -> bool {
        self.name(part, layer, "weight")
            .is_some_and(|n| self.src.has(&n))
    }

    /// `part`'s tensor as stored, `rows` × `cols`.
    fn raw(
        &self,
        part: Part,
        layer: usize,
        suffix: &str,
        rows: usize,
        cols: usize,
    ) -> Result<QuantMatrix> {
        let n = self.name(part, layer, suffix).ok_or_else(|| {
            self.err(format!(
                "layer {layer}: {} has no {part:?} {suffix} in its {:?} naming",
                self.spec.arch.name, self.naming
            ))
        })?;
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
        Ok(m)
    }

    /// `m` (part of `part`'s tensor) in the format the options ask for.
    fn convert(&self, m: QuantMatrix, part: Part, layer: usize) -> Result<QuantMatrix> {
        let what = self.name(part, layer, "weight").unwrap_or_default();
        let wanted = Proj::of(part).and_then(|p| {
            self.overrides
                .iter()
                .rev()
                .find(|o| o.layer.is_none_or(|l| l == layer) && o.proj.is_none_or(|q| q == p))
        });
        let (rows, cols) = (m.rows, m.cols);
        let to = |m: QuantMatrix, f: WeightFormat| {
            QuantMatrix::quantize(f, rows, cols, &m.dequantize())
                .map_err(|e| self.err(format!("tensor '{what}' as {f}: {e}")))
        };
        let m = match wanted {
            Some(o) if o.simulate => {
                let round_trip = to(m, o.format)?;
                QuantMatrix::quantize(WeightFormat::F32, rows, cols, &round_trip.dequantize())
                    .map_err(|e| self.err(format!("tensor '{what}': {e}")))?
            }
            Some(o) => return to(m, o.format),
            None => m,
        };
        match self.weights.map(|f| row_fallback(f, cols)) {
            Some(f) if f != m.format => to(m, f),
            _ => Ok(m),
        }
    }

    /// A weight matrix, shape-checked and converted.
    fn matrix(&self, part: Part, layer: usize, rows: usize, cols: usize) -> Result<QuantMatrix> {
        let m = self.raw(part, layer, "weight", rows, cols)?;
        self.convert(m, part, layer)
    }

    /// A vector of `len` values (`suffix` weight or bias) in f32.
    fn floats(&self, part: Part, layer: usize, suffix: &str, len: usize) -> Result<Vec<f32>> {
        let n = self.name(part, layer, suffix).unwrap_or_default();
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

    /// A norm's gain, plus the architecture's offset (Gemma's 1 + w).
    fn norm(&self, part: Part, layer: usize, len: usize) -> Result<Vec<f32>> {
        let mut g = self.floats(part, layer, "weight", len)?;
        if self.spec.norm_offset != 0.0 {
            g.iter_mut().for_each(|v| *v += self.spec.norm_offset);
        }
        Ok(g)
    }

    /// The concatenated biases of `parts` (each `len` wide), or of the fused tensor.
    fn biases(
        &self,
        fused: Option<Part>,
        parts: &[(Part, usize)],
        layer: usize,
    ) -> Result<Vec<f32>> {
        match fused {
            Some(f) => self.floats(f, layer, "bias", parts.iter().map(|p| p.1).sum()),
            None => Ok(parts
                .iter()
                .map(|&(p, n)| self.floats(p, layer, "bias", n))
                .collect::<Result<Vec<_>>>()?
                .concat()),
        }
    }

    /// The matrices of `parts` (rows each, `cols` wide), from the fused tensor when the source
    /// has one (split by rows, then converted part by part), else one tensor each.
    fn parts(
        &self,
        fused: Option<Part>,
        parts: &[(Part, usize)],
        layer: usize,
        cols: usize,
    ) -> Result<Vec<QuantMatrix>> {
        match fused {
            Some(f) => {
                let all = self.raw(f, layer, "weight", parts.iter().map(|p| p.1).sum(), cols)?;
                let mut at = 0;
                parts
                    .iter()
                    .map(|&(p, n)| {
                        let m = rows_of(&all, at, n)?;
                        at += n;
                        self.convert(m, p, layer)
                    })
                    .collect()
            }
            None => parts
                .iter()
                .map(|&(p, n)| self.matrix(p, layer, n, cols))
                .collect(),
        }
    }

    /// One projection over `mats` in order: each run of one format stacked into one product.
    fn projection(&self, mats: Vec<QuantMatrix>, bias: Option<Vec<f32>>) -> Result<Projection> {
        let mut runs: Vec<Vec<QuantMatrix>> = vec![];
        for m in mats {
            match runs.last_mut() {
                Some(run) if run[0].format == m.format => run.push(m),
                _ => runs.push(vec![m]),
            }
        }
        let parts = runs
            .into_iter()
            .map(|run| match run.len() {
                1 => Ok(run.into_iter().next().expect("one").into()),
                _ => QuantMatrix::stack(&run.iter().collect::<Vec<_>>())
                    .map(Into::into)
                    .map_err(|e| self.err(e)),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Projection { parts, bias })
    }

    /// Q, K and V (Phi-3: split from `qkv_proj`), biases as the blocks say.
    fn qkv(&self, i: usize) -> Result<Projection> {
        let cfg = &self.spec.cfg;
        let (d, qd, kvd) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim());
        let parts = [(Part::Q, qd), (Part::K, kvd), (Part::V, kvd)];
        let fused = (self.present(Part::Qkv, i) && !self.present(Part::Q, i)).then_some(Part::Qkv);
        let bias = match cfg.blocks.qkv_bias {
            true => Some(self.biases(fused, &parts, i)?),
            false => None,
        };
        self.projection(self.parts(fused, &parts, i, d)?, bias)
    }

    /// One gated expert of hidden width `f` whose tensors are `gate`, `up` and `down` (the
    /// dense MLP: gate and up fused in Phi-3's `gate_up_proj`), biases when `bias`.
    fn expert(
        &self,
        gate: Part,
        up: Part,
        down: Part,
        i: usize,
        f: usize,
        bias: bool,
    ) -> Result<Expert> {
        let d = self.spec.cfg.d_model;
        let parts = [(gate, f), (up, f)];
        let fused =
            (gate == Part::Gate && self.present(Part::GateUp, i) && !self.present(Part::Gate, i))
                .then_some(Part::GateUp);
        let (gu_bias, down_bias) = match bias {
            true => (
                Some(self.biases(fused, &parts, i)?),
                Some(self.floats(down, i, "bias", d)?),
            ),
            false => (None, None),
        };
        Ok(Expert {
            gate_up: self.projection(self.parts(fused, &parts, i, d)?, gu_bias)?,
            down: self.projection(vec![self.matrix(down, i, d, f)?], down_bias)?,
        })
    }

    /// The routed experts of layer `i`: one tensor per expert, or llama.cpp's 3-D tensors
    /// (all experts' rows in one matrix) split per expert.
    fn experts(&self, i: usize, n: usize, f: usize) -> Result<Vec<Expert>> {
        use ExpertPart::*;
        let d = self.spec.cfg.d_model;
        if !self.present(Part::Experts(Gate), i) {
            return (0..n)
                .map(|j| {
                    let p = |e| Part::Expert(j, e);
                    self.expert(p(Gate), p(Up), p(Down), i, f, false)
                })
                .collect();
        }
        let all = |e: ExpertPart, rows: usize, cols: usize| -> Result<Vec<QuantMatrix>> {
            let m = self.raw(Part::Experts(e), i, "weight", n * rows, cols)?;
            (0..n)
                .map(|j| self.convert(rows_of(&m, j * rows, rows)?, Part::Experts(e), i))
                .collect()
        };
        let (gates, ups, downs) = (all(Gate, f, d)?, all(Up, f, d)?, all(Down, d, f)?);
        gates
            .into_iter()
            .zip(ups)
            .zip(downs)
            .map(|((g, u), dn)| {
                Ok(Expert {
                    gate_up: self.projection(vec![g, u], None)?,
                    down: dn.into(),
                })
            })
            .collect()
    }

    fn ffn(&self, i: usize) -> Result<Ffn> {
        let cfg = &self.spec.cfg;
        let d = cfg.d_model;
        let moe = match (self.spec.layers[i].moe, cfg.moe) {
            (false, _) => None,
            (true, Some(m)) => Some(m),
            (true, None) => {
                return Err(self.err(format!("layer {i} is sparse but the config has no experts")))
            }
        };
        let Some(m) = moe else {
            return Ok(Ffn::Dense(self.expert(
                Part::Gate,
                Part::Up,
                Part::Down,
                i,
                cfg.d_ff,
                cfg.blocks.mlp_bias,
            )?));
        };
        // Stored as [experts, d_model]; the router kernel takes x·W.
        let r = self
            .raw(Part::Router, i, "weight", m.experts, d)?
            .dequantize();
        let mut router = vec![0.0f32; d * m.experts];
        for e in 0..m.experts {
            for c in 0..d {
                router[c * m.experts + e] = r[e * d + c];
            }
        }
        let shared = match m.shared {
            None => None,
            Some(f) => {
                use ExpertPart::*;
                let gate = self.raw(Part::SharedRouter, i, "weight", 1, d)?;
                Some(SharedExpert {
                    expert: self.expert(
                        Part::Shared(Gate),
                        Part::Shared(Up),
                        Part::Shared(Down),
                        i,
                        f,
                        false,
                    )?,
                    gate: gate.into(),
                })
            }
        };
        Ok(Ffn::Moe {
            router,
            experts: self.experts(i, m.experts, m.d_ff)?,
            shared,
        })
    }

    fn layer(&self, i: usize) -> Result<Layer> {
        let cfg = &self.spec.cfg;
        let b = &cfg.blocks;
        let (d, qd, kvd) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim());
        let (q_norm, k_norm) = match b.qk_norm {
            QkNorm::None => (None, None),
            QkNorm::PerHead => (
                Some(self.norm(Part::QNorm, i, cfg.head_dim)?),
                Some(self.norm(Part::KNorm, i, cfg.head_dim)?),
            ),
            QkNorm::Whole => (
                Some(self.norm(Part::QNorm, i, qd)?),
                Some(self.norm(Part::KNorm, i, kvd)?),
            ),
        };
        let post = |p: Part| -> Result<Option<Vec<f32>>> {
            b.post_norms.then(|| self.norm(p, i, d)).transpose()
        };
        let o_bias = b
            .o_bias
            .then(|| self.floats(Part::O, i, "bias", d))
            .transpose()?;
        let spec = self.spec.layers[i];
        Ok(Layer {
            attn_norm: self.norm(Part::AttnNorm, i, d)?,
            wqkv: self.qkv(i)?,
            q_norm,
            k_norm,
            wo: self.projection(vec![self.matrix(Part::O, i, d, qd)?], o_bias)?,
            post_attn_norm: post(Part::PostAttnNorm)?,
            ffn_norm: self.norm(Part::FfnNorm, i, d)?,
            ffn: self.ffn(i)?,
            post_ffn_norm: post(Part::PostFfnNorm)?,
            window: spec.window,
            rope: spec.rope,
        })
    }
}

/// Builds the model `spec` describes from `src` (named as `naming`); the head is `lm_head` /
/// `output` when the source has one and the spec is not tied, else the embedding.
pub fn build(
    spec: &ModelSpec,
    src: &dyn TensorSource,
    naming: Naming,
    opts: &LoadOptions,
) -> Result<Llama> {
    let bad = |e: KernelError| KernelError::BadFile(format!("{}: {e}", src.origin()));
    spec.cfg.validate().map_err(bad)?;
    if spec.layers.len() != spec.cfg.layers {
        return Err(bad(KernelError::InvalidShape(format!(
            "{} layer specs for {} layers",
            spec.layers.len(),
            spec.cfg.layers
        ))));
    }
    let b = Builder {
        src,
        spec,
        naming,
        weights: opts.weights,
        overrides: &opts.overrides,
    };
    let cfg = spec.cfg;
    let layers = (0..cfg.layers)
        .map(|i| b.layer(i))
        .collect::<Result<Vec<_>>>()?;
    let embed = b.matrix(Part::Embed, 0, cfg.vocab, cfg.d_model)?;
    let head = if !spec.tied && b.present(Part::Head, 0) {
        Some(b.matrix(Part::Head, 0, cfg.vocab, cfg.d_model)?)
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
        b.norm(Part::OutNorm, 0, cfg.d_model)?,
        layers,
        &spec.ropes,
        &opts.attention,
    )
    .map_err(|e| match e {
        KernelError::InvalidShape(_) => bad(e),
        other => other,
    })?;
    model.set_matmul(opts.matmul)?;
    model.set_kv_cache(opts.kv_cache);
    Ok(model)
}
