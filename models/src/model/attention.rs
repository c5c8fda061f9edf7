//! The attention of one layer over the paged KV cache, for a batch of chunks: verification
//! chunks (draft trees, SpecInfer; draft chains: `SeqChunk::verify`) scored with the bits of
//! the decode steps at their positions under paged attention — a chain in multi-token paged
//! decode calls of ≤ 16 rows where `shared_call_is_exact` says its rows then get those bits
//! (the context read once for a call's rows), otherwise row by row (remapped paged decode) —
//! or draft trees by tree attention under a contiguous `--attention`; paged decode on the
//! pool for other chunks of ≤ 16 tokens
//! (vLLM PagedAttention), or a contiguous kernel on K/V gathered from the cache (prompts, and
//! every chunk under a contiguous `--attention`), at the model's scale (1/√head_dim, or the
//! architecture's: Gemma's query_pre_attn_scalar), within the layer's sliding window (a query
//! at position p sees key j iff j ≤ p and p − j < window: transformers' sliding-window mask)
//! and with the architecture's score soft-cap (cap · tanh(s / cap), Gemma-2).

use crate::model::forward::SeqChunk;
use crate::model::kv::KvPools;
use crate::model::llama::{AttentionChoice, Llama, Result};
use kernel_attention::{AttentionInputs, AttentionShape};
use kernel_common::{Buffer, DType, Device, KernelError};
use kernel_paged::{
    paged_decode_cache, paged_decode_cache_remapped, shared_call_is_exact, PagedBatch,
    PagedDecodeShape, RemappedTail, SplitKv, MAX_Q_LEN,
};
use kernel_speculative::{tree_attention, TreeAttnShape, TreeContext};

impl Llama {
    /// Attention of every chunk's queries (rows of `q`, `[rows, heads·hd]`) over its cached
    /// context; returns rows in the same layout.
    pub(super) fn attention(
        &self,
        kv: &KvPools,
        li: usize,
        chunks: &[SeqChunk],
        offsets: &[usize],
        q: &[f32],
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (hd, qd, heads) = (cfg.head_dim, cfg.q_dim(), cfg.heads);
        let scale = cfg.attn_scale();
        let (window, softcap) = (self.layers[li].window, cfg.blocks.attn_softcap);
        let mut attn = vec![f32::NAN; q.len()];
        let mut done = vec![false; chunks.len()];
        if let AttentionChoice::Paged(split) = self.attention {
            let by_row: Vec<bool> = chunks
                .iter()
                .map(|c| self.verified_row_by_row(li, c, split))
                .collect();
            self.verified_rows_as_decode_steps(
                kv, li, chunks, &by_row, offsets, q, split, &mut attn,
            )?;
            for (d, r) in done.iter_mut().zip(by_row) {
                *d |= r;
            }
        }
        for (i, c) in chunks.iter().enumerate() {
            let Some(t) = &c.tree else { continue };
            if done[i] {
                continue;
            }
            let n = c.tokens.len();
            let shape = TreeAttnShape {
                q_heads: heads,
                kv_heads: cfg.kv_heads,
                head_dim: hd,
                scale,
                window,
                softcap,
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
            // One paged decode call per distinct piece length: a piece is a chunk of
            // ≤ MAX_Q_LEN tokens, or MAX_Q_LEN tokens of a longer verified chain (its rows are
            // decode steps, so a piece stands for itself: `verified_row_by_row`).
            let pieces: Vec<(usize, std::ops::Range<usize>)> = (0..chunks.len())
                .filter(|&i| !done[i])
                .flat_map(|i| {
                    let n = chunks[i].tokens.len();
                    let cut = if n <= MAX_Q_LEN || chunks[i].verify {
                        n
                    } else {
                        0
                    };
                    chain_pieces(cut).map(move |p| (i, p))
                })
                .collect();
            for q_len in 1..=MAX_Q_LEN {
                let group: Vec<(usize, usize)> = pieces
                    .iter()
                    .filter(|(_, p)| p.len() == q_len)
                    .map(|(i, p)| (*i, p.start))
                    .collect();
                if group.is_empty() {
                    continue;
                }
                let mut qh = vec![0.0f32; group.len() * qd * q_len];
                for (s, &(i, first)) in group.iter().enumerate() {
                    for r in 0..q_len {
                        for h in 0..heads {
                            let src = (offsets[i] + first + r) * qd + h * hd;
                            let dst = ((s * heads + h) * q_len + r) * hd;
                            qh[dst..dst + hd].copy_from_slice(&q[src..src + hd]);
                        }
                    }
                }
                let batch = PagedBatch {
                    context_lens: group
                        .iter()
                        .map(|&(i, first)| chunks[i].start + first + q_len)
                        .collect(),
                    block_tables: group
                        .iter()
                        .map(|&(i, _)| chunks[i].table.to_vec())
                        .collect(),
                };
                let shape = self.paged_shape(li, q_len);
                let mut out = vec![f32::NAN; qh.len()];
                paged_decode_cache(&shape, &batch, &kv.layers[li], &qh, &mut out, split)?;
                for (s, &(i, first)) in group.iter().enumerate() {
                    for r in 0..q_len {
                        for h in 0..heads {
                            let src = ((s * heads + h) * q_len + r) * hd;
                            let dst = (offsets[i] + first + r) * qd + h * hd;
                            attn[dst..dst + hd].copy_from_slice(&out[src..src + hd]);
                        }
                    }
                }
            }
            for (i, _) in pieces {
                done[i] = true;
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
            let shape = AttentionShape {
                scale,
                ..AttentionShape::new(1, heads, cfg.kv_heads, n, total, hd, true)
            }
            .with_window(window)
            .with_softcap(softcap);
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

    /// Under paged attention, every row of a chunk marked in `by_row` (`verified_row_by_row`:
    /// trees, and chains a multi-token call would not score exactly) is scored as the decode
    /// step at its position would score it: one query token over the committed context and
    /// its own path — a draft tree's nodes read from their slots, a chain's tokens in place —
    /// with decode's partitions and summation order. Its logits are then the bits plain
    /// decoding would give, so greedy speculative output equals plain greedy output exactly
    /// (tree attention's two-pass softmax, or a multi-token call whose partitions are not
    /// each row's own, differs from decode in the last bits, enough to flip a near-tie). Each
    /// row reads its context once, where a multi-token call reads it once for all rows.
    #[allow(clippy::too_many_arguments)]
    fn verified_rows_as_decode_steps(
        &self,
        kv: &KvPools,
        li: usize,
        chunks: &[SeqChunk],
        by_row: &[bool],
        offsets: &[usize],
        q: &[f32],
        split: SplitKv,
        attn: &mut [f32],
    ) -> Result<()> {
        let cfg = &self.cfg;
        let qd = cfg.q_dim();
        let mut batch = PagedBatch {
            context_lens: vec![],
            block_tables: vec![],
        };
        let (mut tails, mut rows) = (vec![], vec![]);
        for (i, c) in chunks.iter().enumerate() {
            if !by_row[i] {
                continue;
            }
            for r in 0..c.tokens.len() {
                let tail = match &c.tree {
                    Some(t) => {
                        let path = t.tree.path_to(t.nodes[r]);
                        RemappedTail {
                            from: c.start,
                            slots: path.iter().map(|&j| c.start + j).collect(),
                        }
                    }
                    // A chain in place: nothing remapped.
                    None => RemappedTail {
                        from: c.start + r + 1,
                        slots: vec![],
                    },
                };
                batch.context_lens.push(tail.from + tail.slots.len());
                batch.block_tables.push(c.table.to_vec());
                tails.push(tail);
                rows.push(offsets[i] + r);
            }
        }
        if rows.is_empty() {
            return Ok(());
        }
        // `[nodes, q_heads, 1, head_dim]` is the row layout of `q` itself.
        let mut qn = Vec::with_capacity(rows.len() * qd);
        for &r in &rows {
            qn.extend_from_slice(&q[r * qd..(r + 1) * qd]);
        }
        let shape = self.paged_shape(li, 1);
        let mut out = vec![f32::NAN; qn.len()];
        paged_decode_cache_remapped(&shape, &batch, &tails, &kv.layers[li], &qn, &mut out, split)?;
        for (s, &r) in rows.iter().enumerate() {
            attn[r * qd..(r + 1) * qd].copy_from_slice(&out[s * qd..(s + 1) * qd]);
        }
        Ok(())
    }

    /// The query side of layer `li`'s paged decode calls with `q_len` new tokens per sequence.
    fn paged_shape(&self, li: usize, q_len: usize) -> PagedDecodeShape {
        let cfg = &self.cfg;
        PagedDecodeShape {
            q_heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            q_len,
            scale: cfg.attn_scale(),
            window: self.layers[li].window,
            softcap: cfg.blocks.attn_softcap,
        }
    }

    /// Chunks whose rows paged attention scores one at a time as decode steps: draft trees,
    /// and verification passes of several tokens (the engine's draft chains, the speculative
    /// cost measurements) except a chain whose pieces of ≤ `MAX_Q_LEN` tokens one multi-token
    /// call each scores with every row's decode bits (`shared_call_is_exact`: the usual case;
    /// not where a piece's contexts straddle a partition unit or a sliding window cuts them).
    fn verified_row_by_row(&self, li: usize, c: &SeqChunk, split: SplitKv) -> bool {
        let n = c.tokens.len();
        c.tree.is_some()
            || (c.verify
                && n > 1
                && !chain_pieces(n).all(|p| {
                    let shape = self.paged_shape(li, p.len());
                    shared_call_is_exact(&shape, c.start + p.end, split)
                }))
    }
}

/// The pieces of ≤ `MAX_Q_LEN` rows a chain of `n` tokens is scored in by multi-token calls.
fn chain_pieces(n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..n)
        .step_by(MAX_Q_LEN)
        .map(move |p| p..(p + MAX_Q_LEN).min(n))
}
