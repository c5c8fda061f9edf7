//! The forward pass of the decoder (`llama.rs`, every architecture of `arch/`): one pass runs a
//! batch of sequence chunks (prefill chunks and decode tokens of different requests together,
//! as continuous batching in Orca/vLLM needs) over a paged KV cache (`KvPools`). Per layer:
//! RMSNorm, the Q/K/V projection (one stacked product where the formats agree, biases after
//! it), QK RMSNorm (per head or whole) where the architecture has it, RoPE of the layer's kind
//! per chunk, K/V written for all chunks before any chunk's attention (`attention.rs`: tree
//! attention, paged decode or a contiguous kernel, with the layer's window and the model's
//! scale), the O product, Gemma's post-attention norm, the residual; the feed-forward
//! (`ffn.rs`) between its pre- and post-norms; the final norm, the logits of the last or all
//! tokens, soft-capped where the architecture says. Every attention reads the cache as
//! stored, so a narrow `--kv-cache` reaches every token's attention, the prompt's included.

use crate::model::kv::KvPools;
use crate::model::llama::{product_for, Llama, Projection, Result};
use kernel_common::KernelError;
use kernel_quant::{MatVecVariant, Prepared};
use kernel_speculative::DraftTree;

/// Some tokens of one sequence, run at positions `start..start + tokens.len()`.
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'a> {
    pub tokens: &'a [u32],
    /// Tokens of this sequence already in the cache.
    pub start: usize,
    /// Block table covering positions `0..start + tokens.len()`.
    pub table: &'a [u32],
    /// Logits of every token of the chunk (else only of the last).
    pub all_logits: bool,
    /// A verification pass: every token's logits must be those of decoding the chunk one
    /// token at a time. Under paged attention each token is then scored as its own decode
    /// step (bit-identical, each reading its own context); otherwise the chunk's tokens share
    /// one multi-token call (a prompt's, an evaluation's).
    pub verify: bool,
    /// The tokens are nodes of a draft tree (speculative decoding): see `TreeChunk`.
    pub tree: Option<TreeChunk<'a>>,
}

/// Tokens that are nodes of a draft tree over a committed context of `start` tokens: token r
/// is node `nodes[r]`, stored at position start + nodes[r], rotated for position
/// start + depth, attending to the context and its own path (the tree mask). Nodes on those
/// paths that are not in the chunk must already be in the cache.
#[derive(Debug, Clone, Copy)]
pub struct TreeChunk<'a> {
    pub tree: &'a DraftTree,
    pub nodes: &'a [usize],
}

impl SeqChunk<'_> {
    /// Positions the chunk's K/V are stored at.
    pub(super) fn slots(&self) -> Vec<usize> {
        match &self.tree {
            Some(t) => t.nodes.iter().map(|&n| self.start + n).collect(),
            None => (self.start..self.start + self.tokens.len()).collect(),
        }
    }

    /// Rotary positions of the chunk's tokens.
    pub(super) fn positions(&self) -> Vec<usize> {
        match &self.tree {
            Some(t) => t
                .nodes
                .iter()
                .map(|&n| self.start + t.tree.depth(n))
                .collect(),
            None => (self.start..self.start + self.tokens.len()).collect(),
        }
    }

    /// Positions the block table must cover.
    pub(super) fn extent(&self) -> usize {
        match &self.tree {
            Some(t) => self.start + t.tree.len(),
            None => self.start + self.tokens.len(),
        }
    }
}

pub(super) fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![];
    rmsnorm_into(x, w, eps, &mut out);
    out
}

/// `rmsnorm` into `out`, resized to `x`'s length (a buffer reused from layer to layer).
pub(super) fn rmsnorm_into(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    kernel_cpu::ops::rmsnorm(x, w, eps, out);
}

/// y = X·Wᵀ for `n` rows of X with `variant`, or the default product for a format the
/// variant does not take.
fn product(w: &Prepared, x: &[f32], n: usize, variant: MatVecVariant) -> Result<Vec<f32>> {
    let mut y = vec![];
    product_into(w, x, n, variant, &mut y)?;
    Ok(y)
}

/// `product` into `y`, resized to `n × rows`. Every product writes each output element (the
/// quant family's checks run them on NaN-poisoned outputs), so a buffer reused from layer to
/// layer needs no zeroing: at batch 32 the zeroing of fresh outputs was ~40 MB a Qwen2.5-0.5B
/// step, on the leading thread while the team waited.
fn product_into(
    w: &Prepared,
    x: &[f32],
    n: usize,
    variant: MatVecVariant,
    y: &mut Vec<f32>,
) -> Result<()> {
    y.resize(n * w.rows(), 0.0);
    w.matmul(x, n, y, product_for(variant, w.format()))
}

impl Projection {
    /// Y = X·Wᵀ + b for `n` rows of X: each part's product, their outputs side by side.
    pub(super) fn forward(&self, x: &[f32], n: usize, variant: MatVecVariant) -> Result<Vec<f32>> {
        let mut y = vec![];
        self.forward_into(x, n, variant, &mut y)?;
        Ok(y)
    }

    /// `forward` into `y` (resized to `n × rows`; a buffer reused from layer to layer).
    pub(super) fn forward_into(
        &self,
        x: &[f32],
        n: usize,
        variant: MatVecVariant,
        y: &mut Vec<f32>,
    ) -> Result<()> {
        let rows = self.rows();
        match &self.parts[..] {
            [one] => product_into(one, x, n, variant, y)?,
            parts => {
                y.resize(n * rows, 0.0);
                let mut at = 0;
                for p in parts {
                    let (part, r) = (product(p, x, n, variant)?, p.rows());
                    for (dst, src) in y.chunks_mut(rows).zip(part.chunks(r)) {
                        dst[at..at + r].copy_from_slice(src);
                    }
                    at += r;
                }
            }
        }
        if let Some(b) = &self.bias {
            for row in y.chunks_mut(rows) {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
        }
        Ok(())
    }
}

/// Buffers a forward pass reuses from layer to layer (same sizes in every layer of a dense
/// model, so after the first layer nothing is allocated or zeroed for them).
#[derive(Default)]
pub(super) struct LayerScratch {
    normed: Vec<f32>,
    qkv: Vec<f32>,
    o: Vec<f32>,
    /// The feed-forward's gate|up product, its gated activation and its down product.
    pub(super) gate_up: Vec<f32>,
    pub(super) gated: Vec<f32>,
    pub(super) ffn_out: Vec<f32>,
}

/// cap · tanh(x / cap) in place (Gemma-2's soft-capping).
fn softcap(x: &mut [f32], cap: f32) {
    x.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
}

impl Llama {
    /// Rotary embedding of `heads` heads of each row, row r by row r of `table` (cos, sin of
    /// `Rope::table`); the first `rope.dim` dimensions of each head (all of them unless the
    /// config has a partial rotary factor).
    fn rope(&self, rope: usize, x: &mut [f32], heads: usize, table: &(Vec<f32>, Vec<f32>)) {
        let d = self.cfg.head_dim;
        let rot = self.ropes[rope].dim;
        let half = rot / 2;
        for (r, row) in x.chunks_mut(heads * d).enumerate() {
            let (cos, sin) = (
                &table.0[r * half..(r + 1) * half],
                &table.1[r * half..(r + 1) * half],
            );
            if rot == d {
                kernel_cpu::ops::rope(row, heads, cos, sin, self.cfg.rope);
            } else {
                for head in row.chunks_mut(d) {
                    kernel_cpu::ops::rope(&mut head[..rot], 1, cos, sin, self.cfg.rope);
                }
            }
        }
    }

    fn check_chunks(&self, kv: &KvPools, chunks: &[SeqChunk]) -> Result<()> {
        let cfg = &self.cfg;
        if chunks.is_empty() {
            return Err(KernelError::InvalidShape("no sequences to run".into()));
        }
        if kv.layers.len() != cfg.layers
            || kv.layout.kv_heads != cfg.kv_heads
            || kv.layout.head_dim != cfg.head_dim
        {
            return Err(KernelError::InvalidShape(
                "the KV cache was built for another model shape".into(),
            ));
        }
        for c in chunks {
            if c.tokens.is_empty() {
                return Err(KernelError::InvalidShape("a chunk has no tokens".into()));
            }
            if let Some(&t) = c.tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
                return Err(KernelError::InvalidShape(format!(
                    "token id {t} is outside the vocabulary of {}",
                    cfg.vocab
                )));
            }
            if let Some(t) = &c.tree {
                if t.nodes.len() != c.tokens.len() || t.nodes.iter().any(|&n| n >= t.tree.len()) {
                    return Err(KernelError::InvalidShape(format!(
                        "a tree chunk has {} tokens for nodes {:?} of a {}-node tree",
                        c.tokens.len(),
                        t.nodes,
                        t.tree.len()
                    )));
                }
            }
            let end = c.extent().max(c.positions().last().map_or(0, |p| p + 1));
            if end > cfg.context {
                return Err(KernelError::InvalidShape(format!(
                    "{end} tokens exceed the context of {}",
                    cfg.context
                )));
            }
            let need = kv.layout.blocks_for(c.extent());
            if c.table.len() < need
                || c.table[..need]
                    .iter()
                    .any(|&b| b as usize >= kv.layout.num_blocks)
            {
                return Err(KernelError::InvalidShape(format!(
                    "block table {:?} does not cover {end} tokens in a pool of {} blocks",
                    c.table, kv.layout.num_blocks
                )));
            }
        }
        Ok(())
    }

    /// Runs a batch of chunks: appends their K/V to `kv` and returns, per chunk, the logits of
    /// its last token (`vocab` values) or of all its tokens (`n × vocab`, `all_logits`).
    /// In every layer all chunks' K/V are written before any chunk's attention reads the
    /// cache, so a chunk may attend to blocks another chunk of the same batch fills (a shared
    /// prefix admitted in the same step).
    pub fn forward(&self, kv: &mut KvPools, chunks: &[SeqChunk]) -> Result<Vec<Vec<f32>>> {
        self.check_chunks(kv, chunks)?;
        // One team for the whole pass: the ~5 parallel regions per layer are spin-joined
        // instead of rayon fork-joins (`kernel_cpu::team`).
        kernel_cpu::team::with_team(|| self.forward_checked(kv, chunks))
    }

    fn forward_checked(&self, kv: &mut KvPools, chunks: &[SeqChunk]) -> Result<Vec<Vec<f32>>> {
        let cfg = self.cfg;
        let (d, qd, kvd) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim());
        let rows: Vec<usize> = chunks.iter().map(|c| c.tokens.len()).collect();
        let offsets: Vec<usize> = rows
            .iter()
            .scan(0, |acc, &n| {
                let at = *acc;
                *acc += n;
                Some(at)
            })
            .collect();
        let n_total: usize = rows.iter().sum();
        let placement: Vec<(Vec<usize>, Vec<usize>)> =
            chunks.iter().map(|c| (c.positions(), c.slots())).collect();
        // cos/sin of every chunk's positions per RoPE kind, once for all heads and layers.
        let rope_tables: Vec<Vec<(Vec<f32>, Vec<f32>)>> = self
            .ropes
            .iter()
            .map(|r| {
                placement
                    .iter()
                    .map(|(pos, _)| r.table(pos, pos.iter().max().map_or(0, |p| p + 1)))
                    .collect()
            })
            .collect();
        let mut codes = vec![];
        let mut x = vec![0.0f32; n_total * d];
        for (i, &t) in chunks.iter().flat_map(|c| c.tokens).enumerate() {
            let row = &mut x[i * d..(i + 1) * d];
            self.embed.decode_row(t as usize, row, &mut codes);
            if let Some(s) = cfg.blocks.embed_scale {
                row.iter_mut().for_each(|v| *v *= s);
            }
        }
        let mut scratch = LayerScratch::default();
        for (li, l) in self.layers.iter().enumerate() {
            let s = &mut scratch;
            rmsnorm_into(&x, &l.attn_norm, cfg.eps, &mut s.normed);
            l.wqkv
                .forward_into(&s.normed, n_total, self.matmul, &mut s.qkv)?;
            let (mut q, mut k, mut v) = (
                Vec::with_capacity(n_total * qd),
                Vec::with_capacity(n_total * kvd),
                Vec::with_capacity(n_total * kvd),
            );
            for row in s.qkv.chunks(qd + 2 * kvd) {
                q.extend_from_slice(&row[..qd]);
                k.extend_from_slice(&row[qd..qd + kvd]);
                v.extend_from_slice(&row[qd + kvd..]);
            }
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                q = rmsnorm(&q, qn, cfg.eps);
                k = rmsnorm(&k, kn, cfg.eps);
            }
            for (((c, &at), (_, slots)), table) in chunks
                .iter()
                .zip(&offsets)
                .zip(&placement)
                .zip(&rope_tables[l.rope])
            {
                let n = c.tokens.len();
                self.rope(l.rope, &mut q[at * qd..(at + n) * qd], cfg.heads, table);
                self.rope(
                    l.rope,
                    &mut k[at * kvd..(at + n) * kvd],
                    cfg.kv_heads,
                    table,
                );
                kv.write(
                    li,
                    c.table,
                    slots,
                    &k[at * kvd..(at + n) * kvd],
                    &v[at * kvd..(at + n) * kvd],
                )?;
            }
            let attn = self.attention(kv, li, chunks, &offsets, &q)?;
            let s = &mut scratch;
            l.wo.forward_into(&attn, n_total, self.matmul, &mut s.o)?;
            if let Some(w) = &l.post_attn_norm {
                rmsnorm_into(&s.o, w, cfg.eps, &mut s.normed);
                std::mem::swap(&mut s.o, &mut s.normed);
            }
            x.iter_mut().zip(&s.o).for_each(|(a, b)| *a += b);
            rmsnorm_into(&x, &l.ffn_norm, cfg.eps, &mut s.normed);
            let normed = std::mem::take(&mut s.normed);
            self.ffn_into(&l.ffn, &normed, n_total, s)?;
            s.normed = normed;
            if let Some(w) = &l.post_ffn_norm {
                rmsnorm_into(&s.ffn_out, w, cfg.eps, &mut s.normed);
                std::mem::swap(&mut s.ffn_out, &mut s.normed);
            }
            x.iter_mut().zip(&s.ffn_out).for_each(|(a, b)| *a += b);
        }
        // Output rows: the last of each chunk, or all of it.
        let picked: Vec<(usize, usize)> = chunks
            .iter()
            .zip(&offsets)
            .map(|(c, &at)| {
                let n = c.tokens.len();
                if c.all_logits {
                    (at, n)
                } else {
                    (at + n - 1, 1)
                }
            })
            .collect();
        let mut last = vec![];
        for &(at, n) in &picked {
            last.extend_from_slice(&x[at * d..(at + n) * d]);
        }
        let normed = rmsnorm(&last, &self.out_norm, cfg.eps);
        let m: usize = picked.iter().map(|p| p.1).sum();
        let mut logits = product(
            self.head.as_ref().unwrap_or(&self.embed),
            &normed,
            m,
            self.matmul,
        )?;
        if let Some(cap) = cfg.blocks.final_softcap {
            softcap(&mut logits, cap);
        }
        if let [_] = picked[..] {
            // One chunk: its logits are the whole product (no copy of m × vocab values).
            return Ok(vec![logits]);
        }
        let mut out = vec![];
        let mut at = 0;
        for &(_, n) in &picked {
            out.push(logits[at * cfg.vocab..(at + n) * cfg.vocab].to_vec());
            at += n;
        }
        Ok(out)
    }
}
