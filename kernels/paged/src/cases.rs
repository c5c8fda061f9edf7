//! Seeded random paged problems shared by the property tests, `harness check` and the
//! benches: sequences of the given lengths appended (in two pieces, to exercise appends at an
//! offset) into a NaN-poisoned pool with spare blocks, physical block ids shuffled.

use crate::decode::PagedDecodeShape;
use crate::pool::{append, KvPool, PagedBatch, PoolLayout};
use kernel_common::error::Result;
use kernel_common::inputs::{normal_buffer, rng};
use kernel_common::{Buffer, DType};
use rand::seq::SliceRandom;

/// A paged decode problem: shape, filled pool, batch and queries.
#[derive(Debug, Clone)]
pub struct PagedCase {
    pub shape: PagedDecodeShape,
    pub pool: KvPool,
    pub batch: PagedBatch,
    pub q: Buffer,
}

/// What to build.
#[derive(Debug, Clone)]
pub struct PagedCaseSpec {
    pub context_lens: Vec<usize>,
    pub block_size: usize,
    pub kv_heads: usize,
    pub group: usize,
    pub head_dim: usize,
    pub q_len: usize,
    pub dtype: DType,
    /// Unused blocks left poisoned in the pool.
    pub spare_blocks: usize,
    pub seed: u64,
}

impl PagedCaseSpec {
    /// Builds the case; fails on an invalid geometry.
    pub fn build(&self) -> Result<PagedCase> {
        let layout = PoolLayout {
            num_blocks: 0,
            block_size: self.block_size,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        };
        let per: Vec<usize> = self
            .context_lens
            .iter()
            .map(|&l| layout.blocks_for(l))
            .collect();
        let layout = PoolLayout {
            num_blocks: per.iter().sum::<usize>() + self.spare_blocks,
            ..layout
        };
        let mut pool = KvPool::poisoned(layout, self.dtype)?;
        let mut rng = rng(self.seed);
        let mut ids: Vec<u32> = (0..layout.num_blocks as u32).collect();
        ids.shuffle(&mut rng);
        let mut tables = vec![];
        let mut next = 0;
        let token = self.kv_heads * self.head_dim;
        for (&len, &n) in self.context_lens.iter().zip(&per) {
            let table = ids[next..next + n].to_vec();
            next += n;
            let first = len / 2;
            for (start, count) in [(0, first), (first, len - first)] {
                if count > 0 {
                    let k = normal_buffer(&mut rng, self.dtype, token * count);
                    let v = normal_buffer(&mut rng, self.dtype, token * count);
                    append(&mut pool, &table, start, &k, &v)?;
                }
            }
            tables.push(table);
        }
        let shape = PagedDecodeShape {
            q_heads: self.kv_heads * self.group,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            q_len: self.q_len,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
        };
        let q = normal_buffer(&mut rng, self.dtype, shape.q_elems(self.context_lens.len()));
        let batch = PagedBatch {
            context_lens: self.context_lens.clone(),
            block_tables: tables,
        };
        shape.validate(&layout, &batch)?;
        Ok(PagedCase {
            shape,
            pool,
            batch,
            q,
        })
    }
}

impl PagedCase {
    /// Runs paged decode with `split` into a NaN-poisoned output and returns it widened.
    pub fn decode(&self, split: crate::SplitKv) -> Result<Vec<f32>> {
        let mut out = Buffer::poisoned(self.pool.dtype(), self.q.len());
        crate::paged_decode(
            &self.shape,
            &self.batch,
            &self.pool,
            &self.q,
            &mut out,
            split,
        )?;
        Ok(out.to_f32())
    }

    /// The f64 reference output.
    pub fn reference(&self) -> Result<Vec<f64>> {
        crate::reference::paged_reference(&self.shape, &self.batch, &self.pool, &self.q)
    }

    /// Label for tables: `seqs[54,97] bs16 h8/2 q1 d128`.
    pub fn label(&self) -> String {
        format!(
            "seqs{:?} bs{} h{}/{} q{} d{} blocks{}",
            self.batch.context_lens,
            self.pool.layout.block_size,
            self.shape.q_heads,
            self.shape.kv_heads,
            self.shape.q_len,
            self.shape.head_dim,
            self.pool.layout.num_blocks
        )
    }
}
