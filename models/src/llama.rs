//! A Llama decoder (HF `LlamaForCausalLM`, llama.cpp's `llama` architecture) loaded from GGUF:
//! RMSNorm, rotary embeddings on interleaved pairs (the layout GGUF llama files are converted
//! to), grouped-query attention through `attention_kernels` (flash2, causal, queries at the end
//! of the context), SwiGLU feed-forward, tied or untied output head. Every projection is a
//! `quant_kernels::matmul` on the file's own weight format (Q4_1, Q8_0, ... kept packed), so the
//! quantised kernels run end to end; Q/K/V and gate/up are stacked into one product each.
//! Batch 1, a contiguous KV cache per layer.

use crate::gguf::{Gguf, Result};
use attention_kernels::{kernel_from_spec, AttentionInputs, AttentionKernel, AttentionShape};
use kernel_common::{Buffer, DType, Device, KernelError, VariantSpec};
use quant_kernels::{matmul, Isa, MatVecVariant, QuantMatrix};

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
}

struct Layer {
    attn_norm: Vec<f32>,
    /// Q, K and V stacked: one product per step instead of three.
    wqkv: QuantMatrix,
    wo: QuantMatrix,
    ffn_norm: Vec<f32>,
    /// Gate and up stacked.
    w_gate_up: QuantMatrix,
    w_down: QuantMatrix,
}

/// A loaded model and its KV cache.
pub struct Llama {
    pub cfg: LlamaConfig,
    embed: QuantMatrix,
    head: Option<QuantMatrix>,
    out_norm: Vec<f32>,
    layers: Vec<Layer>,
    attention: Box<dyn AttentionKernel>,
    /// Used for the calls `attention` does not support (paged decode takes ≤ 16 new tokens,
    /// so a prompt goes through flash2).
    fallback: Box<dyn AttentionKernel>,
    /// Per layer: K and V as [kv_heads][position][head_dim], `len` positions filled.
    cache_k: Vec<Vec<Vec<f32>>>,
    cache_v: Vec<Vec<Vec<f32>>>,
    pub len: usize,
}

/// The greedy choice: the largest logit, the lowest id on ties.
pub fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .map(|(i, _)| i as u32)
        .expect("a non-empty vocabulary")
}

const PROJ: MatVecVariant = MatVecVariant::Fused(Isa::Auto);

fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    x.chunks(w.len())
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter().zip(w).map(move |(v, g)| v * inv * g)
        })
        .collect()
}

/// y = X·Wᵀ for `n` rows of X.
fn proj(w: &QuantMatrix, x: &[f32], n: usize) -> Result<Vec<f32>> {
    let mut y = vec![0.0f32; n * w.rows];
    matmul(w, x, n, &mut y, PROJ)?;
    Ok(y)
}

impl Llama {
    /// Loads the `llama` architecture from `g`; `attention` is an attention variant spec.
    pub fn from_gguf(g: &Gguf, attention: &str) -> Result<Llama> {
        let arch = g.string("general.architecture")?;
        if arch != "llama" {
            return Err(KernelError::BadBuffer(format!(
                "{}: architecture '{arch}' is not llama",
                g.path.display()
            )));
        }
        let d_model = g.uint("llama.embedding_length")?;
        let heads = g.uint("llama.attention.head_count")?;
        let cfg = LlamaConfig {
            layers: g.uint("llama.block_count")?,
            d_model,
            heads,
            kv_heads: g.uint("llama.attention.head_count_kv").unwrap_or(heads),
            head_dim: d_model / heads,
            d_ff: g.uint("llama.feed_forward_length")?,
            vocab: g.strings("tokenizer.ggml.tokens").map(|t| t.len())?,
            context: g.uint("llama.context_length")?,
            eps: g.float("llama.attention.layer_norm_rms_epsilon")? as f32,
            rope_base: g.float("llama.rope.freq_base").unwrap_or(10000.0) as f32,
        };
        let kvd = cfg.kv_heads * cfg.head_dim;
        let layers = (0..cfg.layers)
            .map(|i| {
                let t = |n: &str| format!("blk.{i}.{n}.weight");
                let (wq, wk, wv) = (g.matrix(&t("attn_q"))?, g.matrix(&t("attn_k"))?, g.matrix(&t("attn_v"))?);
                let (wo, w_gate, w_up) = (g.matrix(&t("attn_output"))?, g.matrix(&t("ffn_gate"))?, g.matrix(&t("ffn_up"))?);
                let w_down = g.matrix(&t("ffn_down"))?;
                let shapes = [
                    (&wq, d_model, d_model),
                    (&wk, kvd, d_model),
                    (&wv, kvd, d_model),
                    (&wo, d_model, d_model),
                    (&w_gate, cfg.d_ff, d_model),
                    (&w_up, cfg.d_ff, d_model),
                    (&w_down, d_model, cfg.d_ff),
                ];
                if shapes.iter().any(|(m, r, c)| m.rows != *r || m.cols != *c) {
                    return Err(KernelError::BadBuffer(format!(
                        "{}: layer {i} has a projection whose shape does not fit d_model {d_model}, kv {kvd}, d_ff {}",
                        g.path.display(),
                        cfg.d_ff
                    )));
                }
                let stack = |parts: &[&QuantMatrix]| {
                    QuantMatrix::stack(parts).map_err(|e| {
                        KernelError::BadBuffer(format!("{}: layer {i}: {e}", g.path.display()))
                    })
                };
                Ok(Layer {
                    attn_norm: g.floats(&t("attn_norm"))?,
                    wqkv: stack(&[&wq, &wk, &wv])?,
                    wo,
                    ffn_norm: g.floats(&t("ffn_norm"))?,
                    w_gate_up: stack(&[&w_gate, &w_up])?,
                    w_down,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let embed = g.matrix("token_embd.weight")?;
        let head = if g.tensors.contains_key("output.weight") {
            Some(g.matrix("output.weight")?)
        } else {
            None
        };
        let spec = VariantSpec::parse(attention)?;
        let attention = match kernel_from_spec(&spec)? {
            Some(k) => k,
            None => paged_kernels::kernel_from_spec(&spec)?.ok_or_else(|| {
                KernelError::Unsupported(format!(
                    "unknown attention variant '{attention}' (naive, flash2, paged, with parameters)"
                ))
            })?,
        };
        let fallback = kernel_from_spec(&VariantSpec::parse("flash2")?)?.expect("flash2 exists");
        Ok(Llama {
            fallback,
            cache_k: vec![vec![vec![]; cfg.kv_heads]; cfg.layers],
            cache_v: vec![vec![vec![]; cfg.kv_heads]; cfg.layers],
            len: 0,
            cfg,
            embed,
            head,
            out_norm: g.floats("output_norm.weight")?,
            layers,
            attention,
        })
    }

    /// Forgets the context.
    pub fn reset(&mut self) {
        for l in self.cache_k.iter_mut().chain(self.cache_v.iter_mut()) {
            l.iter_mut().for_each(Vec::clear);
        }
        self.len = 0;
    }

    /// Rotary embedding on interleaved pairs (x[2i], x[2i+1]) of every head of `n` rows.
    fn rope(&self, x: &mut [f32], heads: usize, start: usize) {
        let d = self.cfg.head_dim;
        for (r, row) in x.chunks_mut(heads * d).enumerate() {
            let pos = (start + r) as f32;
            for h in row.chunks_mut(d) {
                for i in 0..d / 2 {
                    let theta = pos * self.cfg.rope_base.powf(-2.0 * i as f32 / d as f32);
                    let (s, c) = theta.sin_cos();
                    let (a, b) = (h[2 * i], h[2 * i + 1]);
                    h[2 * i] = a * c - b * s;
                    h[2 * i + 1] = a * s + b * c;
                }
            }
        }
    }

    /// Runs `tokens` at the end of the context; returns the logits of the last one.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let cfg = self.cfg;
        let (n, d, hd) = (tokens.len(), cfg.d_model, cfg.head_dim);
        if n == 0 {
            return Err(KernelError::InvalidShape("no tokens to run".into()));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
            return Err(KernelError::InvalidShape(format!(
                "token id {t} is outside the vocabulary of {}",
                cfg.vocab
            )));
        }
        if self.len + n > cfg.context {
            return Err(KernelError::InvalidShape(format!(
                "{} tokens exceed the context of {}",
                self.len + n,
                cfg.context
            )));
        }
        let mut codes = vec![];
        let mut x = vec![0.0f32; n * d];
        for (i, &t) in tokens.iter().enumerate() {
            self.embed
                .decode_row_range(t as usize, 0, &mut x[i * d..(i + 1) * d], &mut codes);
        }
        let start = self.len;
        let total = start + n;
        for li in 0..cfg.layers {
            let l = &self.layers[li];
            let h = rmsnorm(&x, &l.attn_norm, cfg.eps);
            let qkv = proj(&l.wqkv, &h, n)?;
            let kvd = cfg.kv_heads * hd;
            let (mut q, mut k, mut v) = (
                Vec::with_capacity(n * d),
                Vec::with_capacity(n * kvd),
                Vec::with_capacity(n * kvd),
            );
            for row in qkv.chunks(d + 2 * kvd) {
                q.extend_from_slice(&row[..d]);
                k.extend_from_slice(&row[d..d + kvd]);
                v.extend_from_slice(&row[d + kvd..]);
            }
            self.rope(&mut q, cfg.heads, start);
            self.rope(&mut k, cfg.kv_heads, start);
            for r in 0..n {
                for kh in 0..cfg.kv_heads {
                    let at = (r * cfg.kv_heads + kh) * hd;
                    self.cache_k[li][kh].extend_from_slice(&k[at..at + hd]);
                    self.cache_v[li][kh].extend_from_slice(&v[at..at + hd]);
                }
            }
            // q [n, heads, d] → [1, heads, n, d]; cache → [1, kv_heads, total, d].
            let mut qh = vec![0.0f32; n * d];
            for r in 0..n {
                for hh in 0..cfg.heads {
                    let (src, dst) = ((r * cfg.heads + hh) * hd, (hh * n + r) * hd);
                    qh[dst..dst + hd].copy_from_slice(&q[src..src + hd]);
                }
            }
            let shape = AttentionShape::new(1, cfg.heads, cfg.kv_heads, n, total, hd, true);
            let inputs = AttentionInputs {
                q: Buffer::F32(qh),
                k: Buffer::F32(self.cache_k[li].concat()),
                v: Buffer::F32(self.cache_v[li].concat()),
            };
            let mut out = Buffer::poisoned(DType::F32, n * d);
            let kernel = match self.attention.supports(&shape, DType::F32, Device::Cpu) {
                Ok(()) => &self.attention,
                Err(_) => &self.fallback,
            };
            kernel.prepare(&shape, &inputs)?.run(&mut out)?;
            let out = out.to_f32();
            let mut attn = vec![0.0f32; n * d];
            for r in 0..n {
                for hh in 0..cfg.heads {
                    let (src, dst) = ((hh * n + r) * hd, (r * cfg.heads + hh) * hd);
                    attn[dst..dst + hd].copy_from_slice(&out[src..src + hd]);
                }
            }
            let o = proj(&l.wo, &attn, n)?;
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h2 = rmsnorm(&x, &l.ffn_norm, cfg.eps);
            let gu = proj(&l.w_gate_up, &h2, n)?;
            let f = cfg.d_ff;
            let act: Vec<f32> = gu
                .chunks(2 * f)
                .flat_map(|row| {
                    let (g, u) = row.split_at(f);
                    g.iter()
                        .zip(u)
                        .map(|(gv, uv)| gv / (1.0 + (-gv).exp()) * uv)
                })
                .collect();
            let down = proj(&l.w_down, &act, n)?;
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        }
        self.len = total;
        let last = rmsnorm(&x[(n - 1) * d..], &self.out_norm, cfg.eps);
        proj(self.head.as_ref().unwrap_or(&self.embed), &last, 1)
    }

    /// Greedy continuation of `prompt`: `max_new` tokens, stopping early at `eos` unless None.
    pub fn greedy(&mut self, prompt: &[u32], max_new: usize, eos: Option<u32>) -> Result<Vec<u32>> {
        self.reset();
        let mut out = vec![];
        let mut logits = self.forward(prompt)?;
        for _ in 0..max_new {
            let next = argmax(&logits);
            out.push(next);
            if Some(next) == eos || out.len() == max_new {
                break;
            }
            logits = self.forward(&[next])?;
        }
        Ok(out)
    }
}
