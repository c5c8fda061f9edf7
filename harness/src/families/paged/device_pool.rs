//! The pool `harness check --family paged --device cuda` gathers from: the layout and shuffled
//! block tables of `build_pool` (`pool_plan`), filled by the CUDA append kernel (vLLM's
//! reshape_and_cache) instead of the host, with two padding tokens at slot −1 that must land
//! nowhere.

use crate::error::Result;
use kernel_attention::{AttentionInputs, AttentionShape};
use kernel_common::Buffer;
use kernel_paged::adapter::pool_plan;
use kernel_paged::cuda::{paged_append_cuda, slots};
use kernel_paged::{KvPool, PagedBatch};

/// The pool `build_pool` makes (`pool_plan`: same layout and shuffled tables), filled by the
/// CUDA append kernel instead: every sequence's tokens in one launch (plus two padding tokens with
/// slot −1 that must land nowhere).
pub fn build_pool_on_device(
    shape: &AttentionShape,
    inputs: &AttentionInputs,
    block_size: usize,
    seed: u64,
) -> Result<(KvPool, PagedBatch)> {
    let (layout, batch) = pool_plan(shape, block_size, seed);
    let mut pool = KvPool::poisoned(layout, inputs.dtype())?;
    let (h, t, d) = (shape.kv_heads, shape.kv_len, shape.head_dim);
    let (k, v) = (inputs.k.to_f32(), inputs.v.to_f32());
    // [batch, kv_heads, kv_len, d] → [tokens, kv_heads, d] (vLLM's reshape_and_cache input).
    let mut k_new = Vec::with_capacity(k.len() + 2 * h * d);
    let mut v_new = Vec::with_capacity(v.len() + 2 * h * d);
    let mut slot_ids = Vec::with_capacity(shape.batch * t + 2);
    for (b, table) in batch.block_tables.iter().enumerate() {
        for pos in 0..t {
            for head in 0..h {
                let at = ((b * h + head) * t + pos) * d;
                k_new.extend_from_slice(&k[at..at + d]);
                v_new.extend_from_slice(&v[at..at + d]);
            }
        }
        slot_ids.extend(slots(&pool.layout, table, 0, t)?);
    }
    k_new.extend(std::iter::repeat_n(7.0, 2 * h * d));
    v_new.extend(std::iter::repeat_n(7.0, 2 * h * d));
    slot_ids.extend([-1, -1]);
    let dt = inputs.dtype();
    paged_append_cuda(
        &mut pool,
        &slot_ids,
        &Buffer::from_f32(dt, &k_new),
        &Buffer::from_f32(dt, &v_new),
    )?;
    Ok((pool, batch))
}
