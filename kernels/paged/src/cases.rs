//! Seeded random paged problems shared by the property tests, `harness check` and the
//! benches: sequences of the given lengths appended (in two pieces, to exercise appends at an
//! offset) into a NaN-poisoned pool with spare blocks, physical block ids shuffled; and the
//! same over a `KvCache` in any format, written as a prompt then decode-sized pieces.

use crate::cache::KvCache;
use crate::decode::PagedDecodeShape;
use crate::kv_format::KvCacheFormat;
use crate::pool::{append, KvPool, PagedBatch, PoolLayout};
use kernel_common::error::Result;
use kernel_common::inputs::{normal_buffer, normal_f32, rng};
use kernel_common::{Buffer, DType, ErrorStats};
use rand::seq::SliceRandom;
use rand::Rng;

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
            window: None,
            softcap: None,
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

/// A paged decode problem over a `KvCache`: shape, filled cache, batch, f32 queries, and the
/// f32 values that were written (token-major `[len, kv_heads · head_dim]` per sequence).
#[derive(Debug, Clone)]
pub struct CacheCase {
    pub shape: PagedDecodeShape,
    pub cache: KvCache,
    pub batch: PagedBatch,
    pub q: Vec<f32>,
    pub written: Vec<(Vec<f32>, Vec<f32>)>,
}

/// What to build: like `PagedCaseSpec`, in a cache format. Each sequence is written as a
/// prompt (its first half) and then in pieces of 1..=17 tokens (decode steps and short
/// chunks), so narrow blocks grow their scales and progressive caches age blocks on the way;
/// one token in eight is scaled by `outlier`.
#[derive(Debug, Clone)]
pub struct CacheCaseSpec {
    pub context_lens: Vec<usize>,
    pub block_size: usize,
    pub kv_heads: usize,
    pub group: usize,
    pub head_dim: usize,
    pub q_len: usize,
    pub format: KvCacheFormat,
    pub spare_blocks: usize,
    pub outlier: f32,
    pub seed: u64,
}

impl CacheCaseSpec {
    /// Builds the case; fails on an invalid geometry.
    pub fn build(&self) -> Result<CacheCase> {
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
        let mut cache = KvCache::new(layout, self.format)?;
        let mut rng = rng(self.seed);
        let mut ids: Vec<u32> = (0..layout.num_blocks as u32).collect();
        ids.shuffle(&mut rng);
        let (mut tables, mut written) = (vec![], vec![]);
        let mut next = 0;
        let token = self.kv_heads * self.head_dim;
        for (&len, &n) in self.context_lens.iter().zip(&per) {
            let table = ids[next..next + n].to_vec();
            next += n;
            let values = |rng: &mut rand::rngs::StdRng| {
                let mut x = normal_f32(rng, len * token, 1.0);
                for row in x.chunks_mut(token) {
                    if rng.gen_range(0..8) == 0 {
                        row.iter_mut().for_each(|v| *v *= self.outlier);
                    }
                }
                x
            };
            let (k, v) = (values(&mut rng), values(&mut rng));
            let mut start = 0;
            let mut piece = len / 2;
            while start < len {
                let end = (start + piece.max(1)).min(len);
                let positions: Vec<usize> = (start..end).collect();
                let rows = start * token..end * token;
                cache.write(&table, &positions, &k[rows.clone()], &v[rows])?;
                start = end;
                piece = rng.gen_range(1..=17);
            }
            tables.push(table);
            written.push((k, v));
        }
        let shape = PagedDecodeShape {
            q_heads: self.kv_heads * self.group,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            q_len: self.q_len,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            window: None,
            softcap: None,
        };
        let q = normal_f32(&mut rng, shape.q_elems(self.context_lens.len()), 1.0);
        let batch = PagedBatch {
            context_lens: self.context_lens.clone(),
            block_tables: tables,
        };
        shape.validate(&layout, &batch)?;
        Ok(CacheCase {
            shape,
            cache,
            batch,
            q,
            written,
        })
    }
}

impl CacheCase {
    /// Runs paged decode with `split` into a NaN-poisoned output.
    pub fn decode(&self, split: crate::SplitKv) -> Result<Vec<f32>> {
        let mut out = vec![f32::NAN; self.q.len()];
        crate::paged_decode_cache(
            &self.shape,
            &self.batch,
            &self.cache,
            &self.q,
            &mut out,
            split,
        )?;
        Ok(out)
    }

    /// The f64 reference of the cache as stored.
    pub fn reference(&self) -> Result<Vec<f64>> {
        crate::reference::cache_reference(&self.shape, &self.batch, &self.cache, &self.q)
    }

    /// The stored values against the f32 values written: every K and V element of every
    /// sequence (the quantisation error of the format).
    pub fn storage_error(&self) -> Result<ErrorStats> {
        let (mut stored, mut exact) = (vec![], vec![]);
        let (kvh, d) = (self.shape.kv_heads, self.shape.head_dim);
        for ((&len, table), (k, v)) in self
            .batch
            .context_lens
            .iter()
            .zip(&self.batch.block_tables)
            .zip(&self.written)
        {
            let (gk, gv) = self.cache.gather(table, len)?;
            for (g, w) in [(gk, k), (gv, v)] {
                stored.extend(g);
                // The written rows are token-major; the gather is head-major.
                for h in 0..kvh {
                    for t in 0..len {
                        let at = (t * kvh + h) * d;
                        exact.extend(w[at..at + d].iter().map(|&x| x as f64));
                    }
                }
            }
        }
        Ok(ErrorStats::compare(&stored, &exact))
    }

    /// Label for tables: `int8 seqs[54,97] bs16 h8/2 q1 d128`.
    pub fn label(&self) -> String {
        let l = self.cache.layout();
        format!(
            "{} seqs{:?} bs{} h{}/{} q{} d{} blocks{}",
            self.cache.format(),
            self.batch.context_lens,
            l.block_size,
            self.shape.q_heads,
            self.shape.kv_heads,
            self.shape.q_len,
            self.shape.head_dim,
            l.num_blocks
        )
    }
}
