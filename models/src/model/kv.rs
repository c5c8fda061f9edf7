//! The model's KV cache storage: one paged pool per layer (`paged_kernels::KvPool`, layout
//! `[blocks, kv_heads, block_size, head_dim]`, f32, NaN-poisoned so a read of a slot nobody
//! wrote shows up), written at a sequence's positions through its block table, read back
//! contiguously for contiguous attention kernels or in place by paged decode; block copies for
//! copy-on-write. Which blocks a sequence owns is decided elsewhere (`serve::blocks`).
//! The pools live in `model` (not `serve`) because they are what `Llama::forward` writes
//! into: `forward` imports this module, this module imports only the `Llama` type for its
//! shape, and `serve`/`spec` use both — no import circle.

use crate::model::llama::{Llama, Result};
use kernel_common::{Buffer, DType};
use paged_kernels::{KvPool, PoolLayout};

/// Per-layer K/V block pools sharing one layout.
pub struct KvPools {
    pub layout: PoolLayout,
    pub layers: Vec<KvPool>,
}

fn f32s(b: &mut Buffer) -> &mut [f32] {
    match b {
        Buffer::F32(v) => v,
        _ => unreachable!("the model's pools are f32"),
    }
}

impl KvPools {
    /// `num_blocks` blocks of `block_size` tokens for every layer of `model`.
    pub fn new(model: &Llama, num_blocks: usize, block_size: usize) -> Result<KvPools> {
        let layout = PoolLayout {
            num_blocks,
            block_size,
            kv_heads: model.cfg.kv_heads,
            head_dim: model.cfg.head_dim,
        };
        layout.validate()?;
        let layers = (0..model.cfg.layers)
            .map(|_| KvPool::poisoned(layout, DType::F32))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvPools { layout, layers })
    }

    /// Bytes of K and V per token over all layers.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.layers.len() * self.layout.kv_heads * self.layout.head_dim * 4
    }

    /// Stores rows `[n, kv_heads·head_dim]` of K and V of layer `li` at positions `slots`
    /// of the sequence with block table `table`.
    pub fn write(&mut self, li: usize, table: &[u32], slots: &[usize], k: &[f32], v: &[f32]) {
        let layout = self.layout;
        let hd = layout.head_dim;
        let pool = &mut self.layers[li];
        for (dst, src) in [(&mut pool.k, k), (&mut pool.v, v)] {
            let dst = f32s(dst);
            for (row, &pos) in src.chunks(layout.kv_heads * hd).zip(slots) {
                for (h, head) in row.chunks(hd).enumerate() {
                    let at = layout.position_offset(table, h, pos);
                    dst[at..at + hd].copy_from_slice(head);
                }
            }
        }
    }

    /// K and V of positions `0..tokens` of layer `li`, contiguous `[kv_heads, tokens, d]`.
    pub fn gather(&self, li: usize, table: &[u32], tokens: usize) -> Result<(Buffer, Buffer)> {
        paged_kernels::pool::gather(&self.layers[li], table, tokens)
    }

    /// The K and V storage of every layer.
    fn buffers(&mut self) -> impl Iterator<Item = &mut [f32]> {
        self.layers
            .iter_mut()
            .flat_map(|pool| [&mut pool.k, &mut pool.v])
            .map(f32s)
    }

    /// Moves the K/V of position `from` to position `to` of one sequence in every layer
    /// (compacting an accepted draft path into place).
    pub fn move_position(&mut self, table: &[u32], from: usize, to: usize) {
        let l = self.layout;
        for b in self.buffers() {
            for h in 0..l.kv_heads {
                let src = l.position_offset(table, h, from);
                let dst = l.position_offset(table, h, to);
                b.copy_within(src..src + l.head_dim, dst);
            }
        }
    }

    /// Overwrites positions `from..to` of one sequence with NaN in every layer, so a later
    /// read of them (a rejected draft branch leaking into attention) poisons the output.
    pub fn poison_positions(&mut self, table: &[u32], from: usize, to: usize) {
        let l = self.layout;
        for b in self.buffers() {
            for pos in from..to {
                for h in 0..l.kv_heads {
                    let at = l.position_offset(table, h, pos);
                    b[at..at + l.head_dim].fill(f32::NAN);
                }
            }
        }
    }

    /// Copies block `src` into block `dst` in every layer (copy-on-write).
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let n = self.layout.block_elems();
        let (s, d) = (src as usize * n, dst as usize * n);
        for b in self.buffers() {
            b.copy_within(s..s + n, d);
        }
    }
}
