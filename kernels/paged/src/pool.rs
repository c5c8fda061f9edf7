//! The KV block pool (vLLM layout `[num_blocks, kv_heads, block_size, head_dim]`, one pool for
//! K and one for V), per-sequence block tables mapping logical block i to a physical block in
//! any order, the append kernel that writes new tokens into their slots, and `gather`, the
//! plain-indexing inverse used by the reference.

use kernel_common::error::Result;
use kernel_common::{with_buffer, Buffer, DType, Element, KernelError};

/// Largest block size accepted.
pub const MAX_BLOCK_SIZE: usize = 256;

/// Geometry of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLayout {
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl PoolLayout {
    /// Checks the geometry: block size 1..=256, every dimension > 0, ids fit in u32.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(KernelError::InvalidShape(m));
        if self.block_size == 0 || self.block_size > MAX_BLOCK_SIZE {
            return bad(format!(
                "block size {} must be in 1..={MAX_BLOCK_SIZE}",
                self.block_size
            ));
        }
        if self.kv_heads == 0 || self.head_dim == 0 || self.num_blocks == 0 {
            return bad("pool needs num_blocks, kv_heads and head_dim > 0".into());
        }
        if self.num_blocks > u32::MAX as usize {
            return bad(format!(
                "{} blocks do not fit u32 block ids",
                self.num_blocks
            ));
        }
        match self.block_elems().checked_mul(self.num_blocks) {
            Some(n) if n <= isize::MAX as usize / 8 => Ok(()),
            _ => bad("pool too large to address".into()),
        }
    }

    /// Elements of one block (all KV heads).
    pub fn block_elems(&self) -> usize {
        self.kv_heads * self.block_size * self.head_dim
    }

    /// Element offset of (physical block, head, slot).
    #[inline(always)]
    pub fn offset(&self, block: usize, head: usize, slot: usize) -> usize {
        ((block * self.kv_heads + head) * self.block_size + slot) * self.head_dim
    }

    /// Element offset of sequence position `pos` of KV head `head`, through the sequence's
    /// block table.
    #[inline(always)]
    pub fn position_offset(&self, table: &[u32], head: usize, pos: usize) -> usize {
        self.offset(
            table[pos / self.block_size] as usize,
            head,
            pos % self.block_size,
        )
    }

    /// Logical blocks needed for `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }
}

/// K and V pools of one layer.
#[derive(Debug, Clone)]
pub struct KvPool {
    pub layout: PoolLayout,
    pub k: Buffer,
    pub v: Buffer,
}

impl KvPool {
    /// A pool whose every slot is NaN: a slot read before it was written poisons the output.
    pub fn poisoned(layout: PoolLayout, dtype: DType) -> Result<KvPool> {
        layout.validate()?;
        let n = layout.num_blocks * layout.block_elems();
        Ok(KvPool {
            layout,
            k: Buffer::poisoned(dtype, n),
            v: Buffer::poisoned(dtype, n),
        })
    }

    /// Storage dtype.
    pub fn dtype(&self) -> DType {
        self.k.dtype()
    }

    /// Checks the geometry and that K and V share one dtype and hold exactly the layout's
    /// elements (the fields are public: a kernel indexing by the layout must not trust them).
    pub fn validate(&self) -> Result<()> {
        self.layout.validate()?;
        let n = self.layout.num_blocks * self.layout.block_elems();
        self.k.expect("pool K", self.dtype(), n)?;
        self.v.expect("pool V", self.dtype(), n)
    }
}

/// The sequences of one batch: context length and block table of each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PagedBatch {
    pub context_lens: Vec<usize>,
    pub block_tables: Vec<Vec<u32>>,
}

impl PagedBatch {
    /// Checks that every table covers its context and points inside the pool.
    pub fn validate(&self, layout: &PoolLayout) -> Result<()> {
        let bad = |m: String| Err(KernelError::InvalidShape(m));
        if self.context_lens.len() != self.block_tables.len() {
            return bad(format!(
                "{} context lengths but {} block tables",
                self.context_lens.len(),
                self.block_tables.len()
            ));
        }
        if self.context_lens.is_empty() {
            return bad("the batch has no sequence".into());
        }
        for (s, (&len, table)) in self.context_lens.iter().zip(&self.block_tables).enumerate() {
            check_table(layout, s, table, len)?;
        }
        Ok(())
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.context_lens.len()
    }

    /// True when the batch holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.context_lens.is_empty()
    }

    /// Total tokens over all contexts.
    pub fn total_tokens(&self) -> usize {
        self.context_lens.iter().sum()
    }
}

/// Checks that `table` covers `tokens` positions of sequence `seq` with in-range entries.
pub(crate) fn check_table(
    layout: &PoolLayout,
    seq: usize,
    table: &[u32],
    tokens: usize,
) -> Result<()> {
    let need = layout.blocks_for(tokens);
    if table.len() < need {
        return Err(KernelError::InvalidShape(format!(
            "sequence {seq}: {tokens} tokens need {need} blocks but its table has {}",
            table.len()
        )));
    }
    if let Some(&b) = table[..need]
        .iter()
        .find(|&&b| b as usize >= layout.num_blocks)
    {
        return Err(KernelError::InvalidShape(format!(
            "sequence {seq}: block table entry {b} out of range (pool has {} blocks)",
            layout.num_blocks
        )));
    }
    Ok(())
}

fn append_typed<T: Element>(
    layout: &PoolLayout,
    pool: &mut [T],
    table: &[u32],
    start: usize,
    new: &[T],
    n_new: usize,
) {
    let d = layout.head_dim;
    for h in 0..layout.kv_heads {
        for t in 0..n_new {
            let dst = layout.position_offset(table, h, start + t);
            let src = (h * n_new + t) * d;
            pool[dst..dst + d].copy_from_slice(&new[src..src + d]);
        }
    }
}

/// Writes `n_new` tokens of one sequence into the pool at positions `start..start+n_new`.
/// `k_new`/`v_new` are `[kv_heads, n_new, head_dim]` in the pool's dtype.
pub fn append(
    pool: &mut KvPool,
    table: &[u32],
    start: usize,
    k_new: &Buffer,
    v_new: &Buffer,
) -> Result<()> {
    let layout = pool.layout;
    let per_token = layout.kv_heads * layout.head_dim;
    if !k_new.len().is_multiple_of(per_token) {
        return Err(KernelError::BadBuffer(format!(
            "k_new has {} elements, not a multiple of kv_heads·head_dim = {per_token}",
            k_new.len()
        )));
    }
    let n_new = k_new.len() / per_token;
    let dt = pool.dtype();
    k_new.expect("k_new", dt, n_new * per_token)?;
    v_new.expect("v_new", dt, n_new * per_token)?;
    check_table(&layout, 0, table, start + n_new)?;
    for (dst, src) in [(&mut pool.k, k_new), (&mut pool.v, v_new)] {
        match (dst, src) {
            (Buffer::F32(p), Buffer::F32(s)) => append_typed(&layout, p, table, start, s, n_new),
            (Buffer::F16(p), Buffer::F16(s)) => append_typed(&layout, p, table, start, s, n_new),
            (Buffer::BF16(p), Buffer::BF16(s)) => append_typed(&layout, p, table, start, s, n_new),
            _ => unreachable!("dtypes were checked above"),
        }
    }
    Ok(())
}

/// Reads positions `0..tokens` of one sequence back into contiguous `[kv_heads, tokens, d]`
/// (K, V). Plain indexing, no kernel code: the reference and the tests use it.
pub fn gather(pool: &KvPool, table: &[u32], tokens: usize) -> Result<(Buffer, Buffer)> {
    let layout = pool.layout;
    check_table(&layout, 0, table, tokens)?;
    let d = layout.head_dim;
    let read = |buf: &Buffer| -> Buffer {
        let mut out = Buffer::poisoned(buf.dtype(), layout.kv_heads * tokens * d);
        with_buffer!(&mut out, o => {
            for h in 0..layout.kv_heads {
                for t in 0..tokens {
                    let off = layout.position_offset(table, h, t);
                    for e in 0..d {
                        o[(h * tokens + t) * d + e] = Element::from_f32(element_f32(buf, off + e));
                    }
                }
            }
        });
        out
    };
    Ok((read(&pool.k), read(&pool.v)))
}

fn element_f32(buf: &Buffer, i: usize) -> f32 {
    with_buffer!(buf, v => v[i].to_f32())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(num_blocks: usize, block_size: usize) -> PoolLayout {
        PoolLayout {
            num_blocks,
            block_size,
            kv_heads: 2,
            head_dim: 3,
        }
    }

    #[test]
    fn append_then_gather_round_trips_with_permuted_blocks() {
        let mut pool = KvPool::poisoned(layout(5, 2), DType::F32).unwrap();
        let table = vec![4, 0, 2];
        let k: Vec<f32> = (0..2 * 5 * 3).map(|i| i as f32).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        // Three tokens, then two more: appends compose.
        let split = |x: &[f32], t0: usize, n: usize| -> Buffer {
            let mut out = vec![];
            for h in 0..2 {
                out.extend_from_slice(&x[(h * 5 + t0) * 3..(h * 5 + t0 + n) * 3]);
            }
            Buffer::F32(out)
        };
        append(&mut pool, &table, 0, &split(&k, 0, 3), &split(&v, 0, 3)).unwrap();
        append(&mut pool, &table, 3, &split(&k, 3, 2), &split(&v, 3, 2)).unwrap();
        let (gk, gv) = gather(&pool, &table, 5).unwrap();
        assert_eq!(gk, Buffer::F32(k));
        assert_eq!(gv, Buffer::F32(v));
        // Block 1 and 3 were never used: still NaN; the last slot of block 2 too.
        let Buffer::F32(raw) = &pool.k else {
            unreachable!()
        };
        assert!(raw[layout(5, 2).offset(1, 0, 0)].is_nan());
        assert!(raw[layout(5, 2).offset(2, 1, 1)].is_nan());
    }

    #[test]
    fn bad_tables_and_layouts_are_named() {
        let l = layout(4, 2);
        let batch = PagedBatch {
            context_lens: vec![3],
            block_tables: vec![vec![0, 9]],
        };
        let err = batch.validate(&l).unwrap_err().to_string();
        assert!(
            err.contains("block table entry 9 out of range (pool has 4 blocks)"),
            "{err}"
        );
        let short = PagedBatch {
            context_lens: vec![5],
            block_tables: vec![vec![0, 1]],
        };
        assert!(short
            .validate(&l)
            .unwrap_err()
            .to_string()
            .contains("need 3 blocks"));
        assert!(PoolLayout {
            block_size: 257,
            ..l
        }
        .validate()
        .is_err());
        assert!(PoolLayout { block_size: 0, ..l }.validate().is_err());
        let mut pool = KvPool::poisoned(l, DType::F16).unwrap();
        let wrong = Buffer::F32(vec![0.0; 6]);
        assert!(append(&mut pool, &[0], 0, &wrong, &wrong).is_err());
    }
}
