//! `PagedAttention`: the paged decode kernel behind the `AttentionKernel` trait, so an
//! experiment can put it beside naive and flash2 on the same logical problem. The untimed
//! `prepare` builds a NaN-poisoned pool with spare blocks, gives each sequence a block table
//! from a seeded random permutation of physical blocks, and appends K/V with the append
//! kernel; `run` is one paged decode call.

use crate::decode::{paged_decode, PagedDecodeShape, SplitKv, MAX_Q_LEN};
use crate::pool::{append, KvPool, PagedBatch, PoolLayout};
use kernel_attention::{
    cpu_only, AttentionInputs, AttentionKernel, AttentionShape, PreparedAttention,
};
use kernel_common::error::Result;
use kernel_common::{Buffer, Cost, DType, Device, KernelError};
use rand::seq::SliceRandom;

/// Paged decode with a block size and a split-KV policy.
#[derive(Debug, Clone, Copy)]
pub struct PagedAttention {
    block_size: usize,
    split: SplitKv,
}

impl PagedAttention {
    /// Block size must be in 1..=256.
    pub fn new(block_size: usize, split: SplitKv) -> Result<PagedAttention> {
        PoolLayout {
            num_blocks: 1,
            block_size,
            kv_heads: 1,
            head_dim: 1,
        }
        .validate()?;
        Ok(PagedAttention { block_size, split })
    }
}

/// The decode shape of a contiguous attention problem.
pub(crate) fn decode_shape(shape: &AttentionShape) -> PagedDecodeShape {
    PagedDecodeShape {
        q_heads: shape.q_heads,
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
        q_len: shape.q_len,
        scale: shape.scale,
        window: shape.window,
        softcap: shape.softcap,
    }
}

/// `{base}:bs=N[,split=..]`, the spec string of a paged variant.
pub(crate) fn variant_name(base: &str, block_size: usize, split: SplitKv) -> String {
    match split {
        SplitKv::Off => format!("{base}:bs={block_size}"),
        SplitKv::Auto => format!("{base}:bs={block_size},split=auto"),
        SplitKv::Tokens(n) => format!("{base}:bs={block_size},split={n}"),
        SplitKv::Context => format!("{base}:bs={block_size},split=ctx"),
    }
}

/// Paged decode is causal over the context: more than one query row needs causal.
pub(crate) fn require_causal(shape: &AttentionShape) -> Result<()> {
    if !shape.causal && shape.q_len > 1 {
        return Err(KernelError::Unsupported(
            "paged decode is causal over the context; q_len > 1 needs causal".into(),
        ));
    }
    Ok(())
}

/// Compulsory traffic plus the entries of the block tables that are read (those of the
/// blocks some row's window reaches).
pub(crate) fn paged_cost(block_size: usize, shape: &AttentionShape, dtype: DType) -> Cost {
    let io = shape.io_cost(dtype);
    let first = shape.kv_len - shape.kv_needed();
    let blocks = shape.kv_len.div_ceil(block_size) - first / block_size;
    let table_bytes = 4 * (shape.batch * blocks) as u64;
    Cost {
        bytes: io.bytes + table_bytes,
        flops: io.flops,
    }
}

/// The pool an experiment's paged variants (CPU and CUDA) build for `shape`: validated
/// inputs, blocks shuffled by a seed of the context length.
pub(crate) fn experiment_pool(
    shape: &AttentionShape,
    inputs: &AttentionInputs,
    block_size: usize,
) -> Result<(KvPool, PagedBatch)> {
    shape.validate()?;
    inputs.check(shape)?;
    build_pool(
        shape,
        inputs,
        block_size,
        kernel_common::inputs::derive_seed(0x9A6E, shape.kv_len as u64),
    )
}

/// The layout and block tables `build_pool` fills: blocks for every sequence of `shape`,
/// physical ids shuffled by `seed`, one spare block in eight. Public so an append kernel of
/// another device can fill the same pool.
pub fn pool_plan(shape: &AttentionShape, block_size: usize, seed: u64) -> (PoolLayout, PagedBatch) {
    let per_seq = shape.kv_len.div_ceil(block_size);
    let used = per_seq * shape.batch;
    let layout = PoolLayout {
        num_blocks: used + used / 8 + 1,
        block_size,
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
    };
    let mut ids: Vec<u32> = (0..layout.num_blocks as u32).collect();
    ids.shuffle(&mut kernel_common::inputs::rng(seed));
    let block_tables: Vec<Vec<u32>> = ids[..used].chunks(per_seq).map(<[u32]>::to_vec).collect();
    let batch = PagedBatch {
        context_lens: vec![shape.kv_len; shape.batch],
        block_tables,
    };
    (layout, batch)
}

/// A pool with every sequence of `shape` appended, physical blocks shuffled by `seed`, and
/// one spare block in eight left poisoned. Public so tests and benches build the same pools.
pub fn build_pool(
    shape: &AttentionShape,
    inputs: &AttentionInputs,
    block_size: usize,
    seed: u64,
) -> Result<(KvPool, PagedBatch)> {
    let (layout, batch) = pool_plan(shape, block_size, seed);
    let mut pool = KvPool::poisoned(layout, inputs.dtype())?;
    let seq_elems = shape.kv_heads * shape.kv_len * shape.head_dim;
    for (b, table) in batch.block_tables.iter().enumerate() {
        let k = inputs.k.slice(b * seq_elems, seq_elems);
        let v = inputs.v.slice(b * seq_elems, seq_elems);
        append(&mut pool, table, 0, &k, &v)?;
    }
    Ok((pool, batch))
}

struct PreparedPaged<'a> {
    shape: PagedDecodeShape,
    batch: PagedBatch,
    pool: KvPool,
    q: &'a Buffer,
    split: SplitKv,
}

impl PreparedAttention for PreparedPaged<'_> {
    fn run(&mut self, out: &mut Buffer) -> Result<()> {
        paged_decode(
            &self.shape,
            &self.batch,
            &self.pool,
            self.q,
            out,
            self.split,
        )
    }
}

impl AttentionKernel for PagedAttention {
    fn name(&self) -> String {
        variant_name("paged", self.block_size, self.split)
    }

    fn supports(&self, shape: &AttentionShape, _dtype: DType, device: Device) -> Result<()> {
        cpu_only("paged", device)?;
        if shape.q_len > MAX_Q_LEN {
            return Err(KernelError::Unsupported(format!(
                "paged decode takes q_len <= {MAX_Q_LEN} (prefill goes through flash2)"
            )));
        }
        require_causal(shape)
    }

    /// Compulsory traffic plus the block tables.
    fn cost(&self, shape: &AttentionShape, dtype: DType) -> Cost {
        paged_cost(self.block_size, shape, dtype)
    }

    fn prepare<'a>(
        &'a self,
        shape: &AttentionShape,
        inputs: &'a AttentionInputs,
    ) -> Result<Box<dyn PreparedAttention + 'a>> {
        self.supports(shape, inputs.dtype(), Device::Cpu)?;
        let (pool, batch) = experiment_pool(shape, inputs, self.block_size)?;
        Ok(Box::new(PreparedPaged {
            shape: decode_shape(shape),
            batch,
            pool,
            q: &inputs.q,
            split: self.split,
        }))
    }
}
