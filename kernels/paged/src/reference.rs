//! The f64 reference for paged decode: gather each sequence's K/V out of the pool (or, for a
//! `KvCache`, its stored values dequantised by the scalar codec) with plain indexing into
//! contiguous tensors and run the attention oracle on them (causal, the new queries being the
//! last q_len positions, with the shape's sliding window and soft-cap). Shares no code with
//! the kernels.

use crate::cache::KvCache;
use crate::decode::PagedDecodeShape;
use crate::pool::{gather, KvPool, PagedBatch};
use kernel_attention::reference::attention;
use kernel_attention::{AttentionInputs, AttentionShape};
use kernel_common::error::Result;
use kernel_common::Buffer;

/// The oracle for one sequence of `ctx` tokens.
fn sequence(shape: &PagedDecodeShape, ctx: usize, inputs: &AttentionInputs) -> Vec<f64> {
    let one = AttentionShape {
        batch: 1,
        q_heads: shape.q_heads,
        kv_heads: shape.kv_heads,
        q_len: shape.q_len,
        kv_len: ctx,
        head_dim: shape.head_dim,
        causal: true,
        scale: shape.scale,
        window: shape.window,
        softcap: shape.softcap,
    };
    attention(&one, inputs)
}

/// Reference output `[seqs, q_heads, q_len, head_dim]` in f64.
pub fn paged_reference(
    shape: &PagedDecodeShape,
    batch: &PagedBatch,
    pool: &KvPool,
    q: &Buffer,
) -> Result<Vec<f64>> {
    shape.validate(&pool.layout, batch)?;
    let per_seq = shape.q_elems(1);
    let mut out = Vec::with_capacity(per_seq * batch.len());
    for (s, (&ctx, table)) in batch
        .context_lens
        .iter()
        .zip(&batch.block_tables)
        .enumerate()
    {
        let (k, v) = gather(pool, table, ctx)?;
        let inputs = AttentionInputs {
            q: q.slice(s * per_seq, per_seq),
            k,
            v,
        };
        out.extend(sequence(shape, ctx, &inputs));
    }
    Ok(out)
}

/// Reference output of the cache as stored (each block dequantised from its own format),
/// for f32 queries `[seqs, q_heads, q_len, head_dim]`.
pub fn cache_reference(
    shape: &PagedDecodeShape,
    batch: &PagedBatch,
    cache: &KvCache,
    q: &[f32],
) -> Result<Vec<f64>> {
    shape.validate(&cache.layout(), batch)?;
    let per_seq = shape.q_elems(1);
    let mut out = Vec::with_capacity(per_seq * batch.len());
    for (s, (&ctx, table)) in batch
        .context_lens
        .iter()
        .zip(&batch.block_tables)
        .enumerate()
    {
        let (k, v) = cache.gather(table, ctx)?;
        let inputs = AttentionInputs {
            q: Buffer::F32(q[s * per_seq..(s + 1) * per_seq].to_vec()),
            k: Buffer::F32(k),
            v: Buffer::F32(v),
        };
        out.extend(sequence(shape, ctx, &inputs));
    }
    Ok(out)
}
