//! The model's KV cache storage: one paged cache per layer (`kernel_paged::KvCache`, blocks
//! `[kv_heads, block_size, head_dim]` in the model's `KvCacheFormat` — f32 by default, or
//! f16, bf16, FP8 E4M3, int8, or progressive: recent tokens wide, aged blocks narrow —
//! NaN-poisoned so a read of a slot nobody wrote shows up), written at a sequence's positions
//! through its block table, read back contiguously and dequantised for contiguous attention
//! kernels (so a prefill chunk's attention sees the values as stored, like a decode step's)
//! or in place by paged decode; block copies for copy-on-write. Which blocks a sequence owns
//! is decided elsewhere (`serve::blocks`).
//! The pools live in `model` (not `serve`) because they are what `Llama::forward` writes
//! into: `forward` imports this module, this module imports only the `Llama` type for its
//! shape, and `serve`/`spec` use both — no import circle.

use crate::model::llama::{Llama, Result};
use kernel_common::{Buffer, KernelError};
use kernel_paged::{KvCache, KvCacheFormat, KvPool, PoolLayout};

/// Per-layer K/V caches sharing one layout and format.
pub struct KvPools {
    pub layout: PoolLayout,
    pub format: KvCacheFormat,
    pub layers: Vec<KvCache>,
}

impl KvPools {
    /// `num_blocks` blocks of `block_size` tokens for every layer of `model`, in the model's
    /// KV-cache format (`Llama::kv_cache`).
    pub fn new(model: &Llama, num_blocks: usize, block_size: usize) -> Result<KvPools> {
        let layout = PoolLayout {
            num_blocks,
            block_size,
            kv_heads: model.cfg.kv_heads,
            head_dim: model.cfg.head_dim,
        };
        layout.validate()?;
        let format = model.kv_cache();
        let layers = (0..model.cfg.layers)
            .map(|_| KvCache::new(layout, format))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvPools {
            layout,
            format,
            layers,
        })
    }

    /// Bytes `new(model, num_blocks, block_size)` would hold, computed without allocating (for
    /// the harness's memory guard): every layer's K and V of every slot in the model's format,
    /// the widest of a progressive cache's two (its arenas grow as blocks age). Saturates.
    pub fn planned_bytes(model: &Llama, num_blocks: usize, block_size: usize) -> u64 {
        let c = &model.cfg;
        let per = |f| {
            KvCacheFormat::Uniform(f).bytes_per_token(1, c.kv_heads, c.head_dim, block_size.max(1))
        };
        let widest = match model.kv_cache() {
            KvCacheFormat::Uniform(f) => per(f),
            KvCacheFormat::Progressive { recent, old, .. } => per(recent).max(per(old)),
        };
        let tokens = num_blocks as f64 * block_size as f64;
        let bytes = (c.layers as f64 * widest * tokens).ceil();
        if bytes >= u64::MAX as f64 {
            u64::MAX
        } else {
            bytes as u64
        }
    }

    /// Bytes of K and V per token over all layers, for a sequence of `tokens` (a progressive
    /// cache holds its older blocks narrower).
    pub fn bytes_per_token(&self, tokens: usize) -> f64 {
        let l = self.layout;
        self.layers.len() as f64
            * self
                .format
                .bytes_per_token(tokens, l.kv_heads, l.head_dim, l.block_size)
    }

    /// Stores rows `[n, kv_heads·head_dim]` of K and V of layer `li` at positions `slots`
    /// of the sequence with block table `table`.
    pub fn write(
        &mut self,
        li: usize,
        table: &[u32],
        slots: &[usize],
        k: &[f32],
        v: &[f32],
    ) -> Result<()> {
        self.layers[li].write(table, slots, k, v)
    }

    /// K and V of positions `0..tokens` of layer `li` as stored (dequantised), contiguous
    /// `[kv_heads, tokens, d]` f32.
    pub fn gather(&self, li: usize, table: &[u32], tokens: usize) -> Result<(Buffer, Buffer)> {
        let (k, v) = self.layers[li].gather(table, tokens)?;
        Ok((Buffer::F32(k), Buffer::F32(v)))
    }

    /// Every layer's f32 pool, for what moves single positions (speculative decoding's draft
    /// paths): refused, in one line, for any other format.
    fn f32_pools(&mut self) -> Result<impl Iterator<Item = &mut [f32]>> {
        if !self.format.is_f32() {
            return Err(KernelError::Unsupported(format!(
                "speculative decoding moves draft positions in an f32 KV cache; this one is {}",
                self.format
            )));
        }
        Ok(self.layers.iter_mut().flat_map(|c| {
            let KvPool { k, v, .. } = c.float_pool_mut().expect("an f32 cache is one pool");
            [k, v].map(|b| match b {
                Buffer::F32(x) => x.as_mut_slice(),
                _ => unreachable!("an f32 cache holds f32"),
            })
        }))
    }

    /// Moves the K/V of position `from` to position `to` of one sequence in every layer
    /// (compacting an accepted draft path into place). f32 caches only.
    pub fn move_position(&mut self, table: &[u32], from: usize, to: usize) -> Result<()> {
        let l = self.layout;
        for b in self.f32_pools()? {
            for h in 0..l.kv_heads {
                let src = l.position_offset(table, h, from);
                let dst = l.position_offset(table, h, to);
                b.copy_within(src..src + l.head_dim, dst);
            }
        }
        Ok(())
    }

    /// Overwrites positions `from..to` of one sequence with NaN in every layer, so a later
    /// read of them (a rejected draft branch leaking into attention) poisons the output.
    /// f32 caches only.
    pub fn poison_positions(&mut self, table: &[u32], from: usize, to: usize) -> Result<()> {
        let l = self.layout;
        for b in self.f32_pools()? {
            for pos in from..to {
                for h in 0..l.kv_heads {
                    let at = l.position_offset(table, h, pos);
                    b[at..at + l.head_dim].fill(f32::NAN);
                }
            }
        }
        Ok(())
    }

    /// Copies block `src` into block `dst` in every layer (copy-on-write), in its format.
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        for c in &mut self.layers {
            c.copy_block(src, dst)?;
        }
        Ok(())
    }
}
