//! The forward pass of the Llama/Mixtral decoder (`llama.rs`): one pass runs a batch of
//! sequence chunks (prefill chunks and decode tokens of different requests together, as
//! continuous batching in Orca/vLLM needs) over a paged KV cache (`KvPools`). Per layer:
//! RMSNorm, one stacked QKV product, RoPE per chunk, K/V written for all chunks before any
//! chunk's attention, attention by tree attention for draft-tree chunks (SpecInfer), paged
//! decode on the pool (vLLM PagedAttention) or a contiguous kernel on gathered K/V, the O
//! product, SwiGLU or the MoE routed by `moe_kernels::route`; logits of the last or all tokens.
//! Every attention reads the cache as stored: paged decode each block in its format, the
//! contiguous kernels the gathered K/V dequantised, so a narrow `--kv-cache` reaches every
//! token's attention, the prompt's included (written first, then read back).

use crate::model::kv::KvPools;
use crate::model::llama::{product_for, AttentionChoice, Expert, Ffn, Llama, Result};
use attention_kernels::{AttentionInputs, AttentionShape};
use kernel_common::{Buffer, DType, Device, KernelError};
use moe_kernels::{route, MoeConfig, Priority, WeightNorm};
use paged_kernels::{paged_decode_cache, PagedBatch, PagedDecodeShape, MAX_Q_LEN};
use quant_kernels::{MatVecVariant, Prepared};
use spec_kernels::{tree_attention, DraftTree, TreeAttnShape, TreeContext};

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
    fn slots(&self) -> Vec<usize> {
        match &self.tree {
            Some(t) => t.nodes.iter().map(|&n| self.start + n).collect(),
            None => (self.start..self.start + self.tokens.len()).collect(),
        }
    }

    /// Rotary positions of the chunk's tokens.
    fn positions(&self) -> Vec<usize> {
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
    fn extent(&self) -> usize {
        match &self.tree {
            Some(t) => self.start + t.tree.len(),
            None => self.start + self.tokens.len(),
        }
    }
}

fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    kernel_cpu::ops::rmsnorm(x, w, eps, &mut out);
    out
}

/// y = X·Wᵀ for `n` rows of X with `variant`, or the default product for a format the
/// variant does not take.
fn proj(w: &Prepared, x: &[f32], n: usize, variant: MatVecVariant) -> Result<Vec<f32>> {
    let mut y = vec![0.0f32; n * w.rows()];
    w.matmul(x, n, &mut y, product_for(variant, w.format()))?;
    Ok(y)
}

/// SwiGLU of rows [gate | up] → silu(gate) · up.
fn swiglu(gu: &[f32], f: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; gu.len() / 2];
    kernel_cpu::ops::swiglu(gu, f, &mut out);
    out
}

impl Expert {
    fn forward(&self, x: &[f32], n: usize, f: usize, v: MatVecVariant) -> Result<Vec<f32>> {
        proj(&self.down, &swiglu(&proj(&self.gate_up, x, n, v)?, f), n, v)
    }
}

impl Llama {
    /// Rotary embedding of `heads` heads in each row, row r rotated by row r of `table`
    /// (cos, sin from `kernel_cpu::ops::rope_table` for the rows' positions).
    fn rope(&self, x: &mut [f32], heads: usize, table: &(Vec<f32>, Vec<f32>)) {
        let d = self.cfg.head_dim;
        let half = d / 2;
        for (r, row) in x.chunks_mut(heads * d).enumerate() {
            let at = r * half..(r + 1) * half;
            kernel_cpu::ops::rope(
                row,
                heads,
                &table.0[at.clone()],
                &table.1[at],
                self.cfg.rope,
            );
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
        // cos/sin of every chunk's positions, once for all heads and layers.
        let rope_tables: Vec<(Vec<f32>, Vec<f32>)> = placement
            .iter()
            .map(|(pos, _)| kernel_cpu::ops::rope_table(&self.inv_freq, pos))
            .collect();
        let mut codes = vec![];
        let mut x = vec![0.0f32; n_total * d];
        for (i, &t) in chunks.iter().flat_map(|c| c.tokens).enumerate() {
            self.embed
                .decode_row(t as usize, &mut x[i * d..(i + 1) * d], &mut codes);
        }
        for (li, l) in self.layers.iter().enumerate() {
            let h = rmsnorm(&x, &l.attn_norm, cfg.eps);
            let qkv = proj(&l.wqkv, &h, n_total, self.matmul)?;
            let (mut q, mut k, mut v) = (
                Vec::with_capacity(n_total * qd),
                Vec::with_capacity(n_total * kvd),
                Vec::with_capacity(n_total * kvd),
            );
            for row in qkv.chunks(qd + 2 * kvd) {
                q.extend_from_slice(&row[..qd]);
                k.extend_from_slice(&row[qd..qd + kvd]);
                v.extend_from_slice(&row[qd + kvd..]);
            }
            for (((c, &at), (_, slots)), table) in chunks
                .iter()
                .zip(&offsets)
                .zip(&placement)
                .zip(&rope_tables)
            {
                let n = c.tokens.len();
                self.rope(&mut q[at * qd..(at + n) * qd], cfg.heads, table);
                self.rope(&mut k[at * kvd..(at + n) * kvd], cfg.kv_heads, table);
                kv.write(
                    li,
                    c.table,
                    slots,
                    &k[at * kvd..(at + n) * kvd],
                    &v[at * kvd..(at + n) * kvd],
                )?;
            }
            let attn = self.attention(kv, li, chunks, &offsets, &q)?;
            let o = proj(&l.wo, &attn, n_total, self.matmul)?;
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h2 = rmsnorm(&x, &l.ffn_norm, cfg.eps);
            let ffn = match &l.ffn {
                Ffn::Dense(e) => e.forward(&h2, n_total, cfg.d_ff, self.matmul)?,
                Ffn::Moe { router, experts } => self.moe(router, experts, &h2, n_total)?,
            };
            x.iter_mut().zip(&ffn).for_each(|(a, b)| *a += b);
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
        let logits = proj(
            self.head.as_ref().unwrap_or(&self.embed),
            &normed,
            m,
            self.matmul,
        )?;
        let mut out = vec![];
        let mut at = 0;
        for &(_, n) in &picked {
            out.push(logits[at * cfg.vocab..(at + n) * cfg.vocab].to_vec());
            at += n;
        }
        Ok(out)
    }

    /// Attention of every chunk's queries (rows of `q`, `[rows, heads·hd]`) over its cached
    /// context; returns rows in the same layout.
    fn attention(
        &self,
        kv: &KvPools,
        li: usize,
        chunks: &[SeqChunk],
        offsets: &[usize],
        q: &[f32],
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (hd, qd, heads) = (cfg.head_dim, cfg.q_dim(), cfg.heads);
        let mut attn = vec![f32::NAN; q.len()];
        let mut done = vec![false; chunks.len()];
        for (i, c) in chunks.iter().enumerate() {
            let Some(t) = &c.tree else { continue };
            let n = c.tokens.len();
            let shape = TreeAttnShape {
                q_heads: heads,
                kv_heads: cfg.kv_heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                window: None,
                softcap: None,
            };
            let rows = offsets[i] * qd..(offsets[i] + n) * qd;
            let pool = kv.layers[li].float_pool().ok_or_else(|| {
                KernelError::Unsupported(format!(
                    "tree attention (speculative decoding) reads an f32 KV cache; this one is {}",
                    kv.format
                ))
            })?;
            let at = TreeContext {
                pool,
                table: c.table,
                ctx: c.start,
                tree: t.tree,
                nodes: t.nodes,
            };
            tree_attention(&shape, &at, &q[rows.clone()], &mut attn[rows])?;
            done[i] = true;
        }
        if let AttentionChoice::Paged(split) = self.attention {
            // One paged decode call per distinct chunk length ≤ MAX_Q_LEN.
            for q_len in 1..=MAX_Q_LEN {
                let group: Vec<usize> = (0..chunks.len())
                    .filter(|&i| !done[i] && chunks[i].tokens.len() == q_len)
                    .collect();
                if group.is_empty() {
                    continue;
                }
                let mut qh = vec![0.0f32; group.len() * qd * q_len];
                for (s, &i) in group.iter().enumerate() {
                    for r in 0..q_len {
                        for h in 0..heads {
                            let src = (offsets[i] + r) * qd + h * hd;
                            let dst = ((s * heads + h) * q_len + r) * hd;
                            qh[dst..dst + hd].copy_from_slice(&q[src..src + hd]);
                        }
                    }
                }
                let batch = PagedBatch {
                    context_lens: group.iter().map(|&i| chunks[i].start + q_len).collect(),
                    block_tables: group.iter().map(|&i| chunks[i].table.to_vec()).collect(),
                };
                let shape = PagedDecodeShape {
                    q_heads: heads,
                    kv_heads: cfg.kv_heads,
                    head_dim: hd,
                    q_len,
                    scale: 1.0 / (hd as f32).sqrt(),
                    window: None,
                    softcap: None,
                };
                let mut out = vec![f32::NAN; qh.len()];
                paged_decode_cache(&shape, &batch, &kv.layers[li], &qh, &mut out, split)?;
                for (s, &i) in group.iter().enumerate() {
                    for r in 0..q_len {
                        for h in 0..heads {
                            let src = ((s * heads + h) * q_len + r) * hd;
                            let dst = (offsets[i] + r) * qd + h * hd;
                            attn[dst..dst + hd].copy_from_slice(&out[src..src + hd]);
                        }
                    }
                    done[i] = true;
                }
            }
        }
        for (i, c) in chunks.iter().enumerate().filter(|(i, _)| !done[*i]) {
            let n = c.tokens.len();
            let total = c.start + n;
            let (k, v) = kv.gather(li, c.table, total)?;
            let mut qh = vec![0.0f32; n * qd];
            for r in 0..n {
                for h in 0..heads {
                    let (src, dst) = ((offsets[i] + r) * qd + h * hd, (h * n + r) * hd);
                    qh[dst..dst + hd].copy_from_slice(&q[src..src + hd]);
                }
            }
            let shape = AttentionShape::new(1, heads, cfg.kv_heads, n, total, hd, true);
            let inputs = AttentionInputs {
                q: Buffer::F32(qh),
                k,
                v,
            };
            let kernel = match &self.attention {
                AttentionChoice::Contiguous(k)
                    if k.supports(&shape, DType::F32, Device::Cpu).is_ok() =>
                {
                    k
                }
                _ => &self.fallback,
            };
            let mut out = Buffer::poisoned(DType::F32, n * qd);
            kernel.prepare(&shape, &inputs)?.run(&mut out)?;
            let out = out.to_f32();
            for r in 0..n {
                for h in 0..heads {
                    let (src, dst) = ((h * n + r) * hd, (offsets[i] + r) * qd + h * hd);
                    attn[dst..dst + hd].copy_from_slice(&out[src..src + hd]);
                }
            }
        }
        Ok(attn)
    }

    /// The sparse feed-forward: route (softmax, top-k, renormalise, capacity), then each
    /// expert's SwiGLU on the rows routed to it, combined with the routing weights.
    fn moe(&self, router: &[f32], experts: &[Expert], x: &[f32], n: usize) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let spec = cfg.moe.expect("an MoE layer has a spec");
        let mcfg = MoeConfig::token_choice(
            n,
            cfg.d_model,
            cfg.d_ff,
            spec.experts,
            spec.top_k,
            Priority::TokenOrder,
            WeightNorm::Renormalize,
            spec.capacity,
        );
        let routing = route(&mcfg, x, router, &vec![0.0; spec.experts])?;
        let d = cfg.d_model;
        let mut out = vec![0.0f32; n * d];
        for (e, expert) in experts.iter().enumerate() {
            let mine: Vec<_> = routing
                .assignments
                .iter()
                .filter(|a| a.kept && a.expert == e)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let rows: Vec<f32> = mine
                .iter()
                .flat_map(|a| x[a.token * d..(a.token + 1) * d].iter().copied())
                .collect();
            let y = expert.forward(&rows, mine.len(), cfg.d_ff, self.matmul)?;
            for (a, yr) in mine.iter().zip(y.chunks(d)) {
                let w = a.weight as f32;
                out[a.token * d..(a.token + 1) * d]
                    .iter_mut()
                    .zip(yr)
                    .for_each(|(o, v)| *o += w * v);
            }
        }
        Ok(out)
    }
}
