//! Tree attention over a paged KV cache: the target scores every node of a draft tree in one
//! pass. The committed context is positions 0..ctx of the sequence's block table; tree node j
//! has its K/V at position ctx + j (written there before the call, rotated for position
//! ctx + depth). The queries are those of some of the nodes (all of them for the target's
//! pass; the newest level when a drafter grows the tree level by level, its earlier levels
//! already in the cache). Query of node i attends to the whole context and to the tree nodes
//! on its own path (the tree mask): its scores, their softmax, the weighted sum of V, each a
//! vector loop at the tier of the caller (two passes over the keys; a row's keys are at most
//! the context plus the tree's depth). One task per (node, query head) on the team; GQA by
//! index. A
//! sliding window is measured in RoPE positions (node a at ctx + depth(a)): the context walk
//! starts at the node's window start and ancestors more than window − 1 levels up are left
//! out; soft-capped scores (Gemma-2) take one tanh each. The reference computes the same in
//! f64, materialising the scores.

use crate::tree::DraftTree;
use kernel_attention::cpu::softcap::cap_score;
use kernel_attention::reference::softcap;
use kernel_attention::shape::{validate_window_softcap, window_start};
use kernel_common::{error::Result, Buffer, KernelError};
use kernel_cpu::simd::{self, axpy_plain, dot_plain};
use kernel_cpu::{team, Isa};
use kernel_paged::KvPool;

/// Where a tree attention call reads: the pool, the sequence's block table, the committed
/// context length, the tree, and the nodes whose queries are given.
#[derive(Debug, Clone, Copy)]
pub struct TreeContext<'a> {
    pub pool: &'a KvPool,
    pub table: &'a [u32],
    pub ctx: usize,
    pub tree: &'a DraftTree,
    pub nodes: &'a [usize],
}

/// Heads, scale, sliding window and soft-cap of a tree attention call. Positions are those
/// of RoPE: context key j at j, tree node a at ctx + depth(a); the query of node i (at
/// p = ctx + depth(i)) sees a key at position j iff j ≤ p and p − j < window (as
/// `kernel_attention::AttentionShape`), and scores are cap · tanh(scale · q·k / cap).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TreeAttnShape {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Sliding window in positions (`None`: the whole context).
    pub window: Option<usize>,
    /// Logit soft-cap (`None`: plain scores).
    pub softcap: Option<f32>,
}

impl TreeAttnShape {
    /// The same shape with a sliding window.
    pub fn with_window(self, window: Option<usize>) -> TreeAttnShape {
        TreeAttnShape { window, ..self }
    }

    /// The same shape with a logit soft-cap.
    pub fn with_softcap(self, softcap: Option<f32>) -> TreeAttnShape {
        TreeAttnShape { softcap, ..self }
    }
}

fn f32_pool(pool: &KvPool) -> Result<(&[f32], &[f32])> {
    match (&pool.k, &pool.v) {
        (Buffer::F32(k), Buffer::F32(v)) => Ok((k, v)),
        _ => Err(KernelError::Unsupported(
            "tree attention takes an f32 pool".into(),
        )),
    }
}

pub(crate) fn check(
    shape: &TreeAttnShape,
    at: &TreeContext,
    q: &[f32],
    out_len: usize,
) -> Result<()> {
    let TreeContext {
        pool,
        table,
        ctx,
        tree,
        nodes,
    } = *at;
    pool.validate()?;
    let l = pool.layout;
    let bad = |m: String| Err(KernelError::InvalidShape(m));
    if shape.kv_heads != l.kv_heads || shape.head_dim != l.head_dim {
        return bad(format!(
            "shape has {} KV heads of {}, the pool {} of {}",
            shape.kv_heads, shape.head_dim, l.kv_heads, l.head_dim
        ));
    }
    if shape.kv_heads == 0 || !shape.q_heads.is_multiple_of(shape.kv_heads) {
        return bad(format!(
            "{} query heads are not a multiple of {} KV heads",
            shape.q_heads, shape.kv_heads
        ));
    }
    if !(shape.scale.is_finite() && shape.scale > 0.0) {
        return bad(format!(
            "softmax scale must be finite and > 0, got {}",
            shape.scale
        ));
    }
    validate_window_softcap(shape.window, shape.softcap)?;
    let need = (ctx + tree.len()).div_ceil(l.block_size);
    if table.len() < need || table[..need].iter().any(|&b| b as usize >= l.num_blocks) {
        return bad(format!(
            "the block table does not cover {} positions of a {}-block pool",
            ctx + tree.len(),
            l.num_blocks
        ));
    }
    if let Some(n) = nodes.iter().find(|&&n| n >= tree.len()) {
        return bad(format!("query node {n} is not in a tree of {}", tree.len()));
    }
    let want = nodes.len() * shape.q_heads * shape.head_dim;
    if q.len() != want || out_len != want {
        return bad(format!(
            "q and out need {want} values ([nodes, q_heads, head_dim]), got {} and {out_len}",
            q.len()
        ));
    }
    Ok(())
}

/// `out[r, h]` = attention of node `nodes[r]`'s query head h over the context and that node's
/// path. `q` and `out` are `[nodes.len(), q_heads, head_dim]`; every node on those paths has
/// its K/V in the pool.
pub fn tree_attention(
    shape: &TreeAttnShape,
    at: &TreeContext,
    q: &[f32],
    out: &mut [f32],
) -> Result<()> {
    check(shape, at, q, out.len())?;
    let TreeContext {
        pool,
        table,
        ctx,
        tree,
        nodes,
    } = *at;
    let (k, v) = f32_pool(pool)?;
    let l = pool.layout;
    let d = shape.head_dim;
    let group = shape.q_heads / shape.kv_heads;
    // Each query's window-admitted ancestors (itself included) and first context position.
    let seen: Vec<(usize, Vec<usize>)> = nodes
        .iter()
        .map(|&i| {
            let depth = tree.depth(i);
            let first = window_start(ctx + depth + 1, shape.window).min(ctx);
            let path = tree.path_to(i);
            let lo = window_start(depth + 1, shape.window);
            (first, path[lo..].to_vec())
        })
        .collect();
    // Resolved here, before work is forked: a worker thread does not see this thread's choice.
    let isa = Isa::active();
    team::for_each_chunk_mut(out, d, |row, o| {
        let (i, h) = (row / shape.q_heads, row % shape.q_heads);
        let kvh = h / group;
        let (first, path) = &seen[i];
        let keys: Vec<usize> = (*first..ctx)
            .chain(path.iter().map(|&j| ctx + j))
            .map(|pos| l.position_offset(table, kvh, pos))
            .collect();
        let row = Row {
            q: &q[row * d..(row + 1) * d],
            k,
            v,
            keys: &keys,
            scale: shape.scale,
            softcap: shape.softcap,
        };
        #[cfg(target_arch = "x86_64")]
        {
            if isa.has_avx512() {
                // SAFETY: the active tier includes AVX-512 F (with AVX2 and FMA), so this
                // CPU has them.
                return unsafe { attend_row_avx512(&row, o) };
            }
            if isa.has_avx2() {
                // SAFETY: the active tier includes AVX2 and FMA, so this CPU has them.
                return unsafe { attend_row_avx2(&row, o) };
            }
        }
        attend_row(&row, o)
    });
    let _ = isa;
    Ok(())
}

/// One query row's inputs: its query, the pool's K and V, the offsets of the keys it sees
/// (context, then its path), the scale and the soft-cap.
struct Row<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    keys: &'a [usize],
    scale: f32,
    softcap: Option<f32>,
}

/// Softmax attention of one row over its keys in two passes — every score (a dot product),
/// then the exponentials shifted by their max with their sum, then P·V — so the loops are
/// vector loops with the vectorised `exp_f32` (an earlier one-pass online softmax called
/// libm's `expf` once or twice per key: 40% of a SmolLM2 speculative run).
#[inline(always)]
fn attend_row(r: &Row, o: &mut [f32]) {
    let d = o.len();
    // Plain loops, not iterator closures: a closure does not inherit the wrapper's target
    // features, and its dot products ran as SSE2 (20% of a speculative run).
    let mut p = vec![0.0f32; r.keys.len()];
    for (p, &at) in p.iter_mut().zip(r.keys) {
        let s = dot_plain(r.q, &r.k[at..at + d]) * r.scale;
        *p = match r.softcap {
            Some(cap) => cap_score(cap, s),
            None => s,
        };
    }
    let m = simd::max(&p);
    let sum = simd::exp_shifted_sum(&mut p, m);
    o.fill(0.0);
    for (&w, &at) in p.iter().zip(r.keys) {
        axpy_plain(w, &r.v[at..at + d], o);
    }
    let inv = 1.0 / sum;
    o.iter_mut().for_each(|x| *x *= inv);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn attend_row_avx512(r: &Row, o: &mut [f32]) {
    attend_row(r, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_row_avx2(r: &Row, o: &mut [f32]) {
    attend_row(r, o)
}

/// The f64 reference: each node's scores over the context and its path (found by walking
/// parent pointers, not from the mask), kept where the window admits their positions
/// (ctx + depth for nodes), soft-capped when asked, a softmax, the weighted sum of V.
pub fn tree_attention_reference(
    shape: &TreeAttnShape,
    at: &TreeContext,
    q: &[f32],
) -> Result<Vec<f64>> {
    let want = at.nodes.len() * shape.q_heads * shape.head_dim;
    check(shape, at, q, want)?;
    let TreeContext {
        pool,
        table,
        ctx,
        tree,
        nodes,
    } = *at;
    let (k, v) = f32_pool(pool)?;
    let l = pool.layout;
    let d = shape.head_dim;
    let group = shape.q_heads / shape.kv_heads;
    let mut out = vec![0.0f64; want];
    let sees = |p: usize, j: usize| j <= p && shape.window.is_none_or(|w| p - j < w);
    for (r, &i) in nodes.iter().enumerate() {
        let p = ctx + tree.depth(i);
        let mut visible: Vec<usize> = (0..ctx).filter(|&j| sees(p, j)).collect();
        let mut at = Some(i);
        while let Some(a) = at {
            if sees(p, ctx + tree.depth(a)) {
                visible.push(ctx + a);
            }
            at = tree.parent(a);
        }
        for h in 0..shape.q_heads {
            let kvh = h / group;
            let qv = &q[(r * shape.q_heads + h) * d..][..d];
            let rows: Vec<usize> = visible
                .iter()
                .map(|&pos| l.position_offset(table, kvh, pos))
                .collect();
            let scores: Vec<f64> = rows
                .iter()
                .map(|&r| {
                    let s = (0..d).map(|c| qv[c] as f64 * k[r + c] as f64).sum::<f64>();
                    softcap(shape.softcap, s * shape.scale as f64)
                })
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let total: f64 = e.iter().sum();
            let o = &mut out[(r * shape.q_heads + h) * d..][..d];
            for (w, &r) in e.iter().zip(&rows) {
                for c in 0..d {
                    o[c] += w / total * v[r + c] as f64;
                }
            }
        }
    }
    Ok(out)
}
