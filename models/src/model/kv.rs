//! The model's KV cache storage: one paged pool per layer (`paged_kernels::KvPool`, layout
//! `[blocks, kv_heads, block_size, head_dim]`, f32, NaN-poisoned so a read of a slot nobody
//! wrote shows up), written at a sequence's positions through its block table, read back
//! contiguously for contiguous attention kernels or in place by paged decode; block copies for
//! copy-on-write. Which blocks a sequence owns is decided elsewhere (`blocks.rs`). `Session` is
//! the batch-1 convenience: one sequence, blocks 0.. in order, for tests and plain generation.

use crate::model::llama::{argmax, Llama, Result, SeqChunk};
use kernel_common::{Buffer, DType, KernelError};
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

/// One sequence over its own pools (blocks in order): prompt, then token by token.
pub struct Session<'m> {
    pub model: &'m Llama,
    pub kv: KvPools,
    table: Vec<u32>,
    /// Tokens in the cache.
    pub len: usize,
}

impl<'m> Session<'m> {
    /// Room for `capacity` tokens in blocks of `block_size`.
    pub fn new(model: &'m Llama, capacity: usize, block_size: usize) -> Result<Session<'m>> {
        if capacity > model.cfg.context {
            return Err(KernelError::InvalidShape(format!(
                "{capacity} tokens exceed the context of {}",
                model.cfg.context
            )));
        }
        let blocks = capacity.max(1).div_ceil(block_size);
        Ok(Session {
            model,
            kv: KvPools::new(model, blocks, block_size)?,
            table: (0..blocks as u32).collect(),
            len: 0,
        })
    }

    /// Runs `tokens` at the end of the context; returns the logits of the last one.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let cap = self.table.len() * self.kv.layout.block_size;
        if self.len + tokens.len() > cap {
            return Err(KernelError::InvalidShape(format!(
                "{} tokens exceed the session's room of {cap}",
                self.len + tokens.len()
            )));
        }
        let chunk = SeqChunk {
            tokens,
            start: self.len,
            table: &self.table,
            all_logits: false,
            tree: None,
        };
        let logits = self.model.forward(&mut self.kv, &[chunk])?;
        self.len += tokens.len();
        Ok(logits.into_iter().next().expect("one chunk"))
    }

    /// Logits of every token of `tokens` (e.g. a whole prompt, to compare with a reference).
    pub fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let chunk = SeqChunk {
            tokens,
            start: self.len,
            table: &self.table,
            all_logits: true,
            tree: None,
        };
        let logits = self.model.forward(&mut self.kv, &[chunk])?;
        self.len += tokens.len();
        Ok(logits.into_iter().next().expect("one chunk"))
    }
}

impl Llama {
    /// Greedy continuation of `prompt`: `max_new` tokens, stopping early at `eos` unless None.
    pub fn greedy(&self, prompt: &[u32], max_new: usize, eos: Option<u32>) -> Result<Vec<u32>> {
        self.greedy_with_blocks(prompt, max_new, eos, 16)
    }

    /// `greedy` with KV blocks of `block_size` tokens.
    pub fn greedy_with_blocks(
        &self,
        prompt: &[u32],
        max_new: usize,
        eos: Option<u32>,
        block_size: usize,
    ) -> Result<Vec<u32>> {
        let mut s = Session::new(self, prompt.len() + max_new, block_size)?;
        let mut out = vec![];
        let mut logits = s.forward(prompt)?;
        while out.len() < max_new {
            let next = argmax(&logits);
            out.push(next);
            if Some(next) == eos || out.len() == max_new {
                break;
            }
            logits = s.forward(&[next])?;
        }
        Ok(out)
    }
}
