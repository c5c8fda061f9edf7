//! `KvCache`: one layer's paged K/V cache in any `KvCacheFormat` — vLLM's block tables over
//! blocks that may each be in a different format. How the kernel knows a block's format: the
//! block ids of the tables index `home`, one u32 per block saying which arena holds it and in
//! which slot (top bit: the old arena; `UNSET`: never written); an arena stores blocks of one
//! `BlockFormat` in vLLM's `[slots, kv_heads, block_size, head_dim]` layout (a `KvPool` for
//! the float formats; codes plus scales for FP8/int8). A uniform cache has one arena, every
//! block at its own id; a progressive one has a recent and an old arena whose slots are taken
//! when a block is first written or ages, and given back (poisoned) when it leaves, so the
//! memory held is what the formats say.
//!
//! Writes take f32 rows. A narrow block's scale (per block and head) only grows: when a new
//! token's magnitude exceeds what the scale reaches, the block's earlier codes are re-rounded
//! to the new scale (one more rounding for them). A write that covers a block's first slot
//! starts the block afresh (its owner is new: a block's positions are written in order).
//! A progressive cache ages, after each write, the blocks of that sequence lying entirely
//! more than `window` tokens behind the written end: decoded from the recent format and
//! re-encoded in the old one, so attention reads them in the old format from then on.

use crate::codec::{absmax, max_nan, Code};
use crate::kv_format::{BlockFormat, KvCacheFormat, ScaleScope};
use crate::pool::{check_table, KvPool, PoolLayout};
use kernel_common::error::Result;
use kernel_common::{with_buffer, Buffer, Element, KernelError};

/// `home` of a block never written.
pub(crate) const UNSET: u32 = u32::MAX;
/// The bit of `home` that says "in the old arena".
pub(crate) const OLD: u32 = 1 << 31;

/// The storage of one arena.
#[derive(Debug, Clone)]
pub(crate) enum Data {
    Float(KvPool),
    Coded {
        code: Code,
        scope: ScaleScope,
        k: Vec<u8>,
        v: Vec<u8>,
        /// `[slots, kv_heads]` (per block) or `[kv_heads]` (per head; 0 = not yet set).
        k_scale: Vec<f32>,
        v_scale: Vec<f32>,
    },
}

/// Blocks of one format.
#[derive(Debug, Clone)]
pub(crate) struct Arena {
    pub(crate) data: Data,
    slots: usize,
    free: Vec<u32>,
}

impl Arena {
    fn new(format: BlockFormat, layout: PoolLayout, slots: usize) -> Result<Arena> {
        let n = slots * layout.block_elems();
        let data = match format {
            BlockFormat::Float(dt) => Data::Float(KvPool {
                layout: PoolLayout {
                    num_blocks: slots,
                    ..layout
                },
                k: Buffer::poisoned(dt, n),
                v: Buffer::poisoned(dt, n),
            }),
            BlockFormat::Coded(code, scope) => {
                let scales = match scope {
                    ScaleScope::Block => vec![f32::NAN; slots * layout.kv_heads],
                    ScaleScope::Head => vec![0.0; layout.kv_heads],
                };
                Data::Coded {
                    code,
                    scope,
                    k: vec![code.unwritten(); n],
                    v: vec![code.unwritten(); n],
                    k_scale: scales.clone(),
                    v_scale: scales,
                }
            }
        };
        Ok(Arena {
            data,
            slots,
            free: vec![],
        })
    }

    /// A slot for a new block: a freed one, or a new one at the end; clean (no scale yet).
    fn take(&mut self, layout: PoolLayout) -> u32 {
        let slot = self.free.pop().unwrap_or_else(|| {
            let n = layout.block_elems();
            match &mut self.data {
                Data::Float(pool) => {
                    pool.layout.num_blocks += 1;
                    for b in [&mut pool.k, &mut pool.v] {
                        with_buffer!(b, x => grow_poisoned(x, n));
                    }
                }
                Data::Coded {
                    code,
                    scope,
                    k,
                    v,
                    k_scale,
                    v_scale,
                } => {
                    k.extend(std::iter::repeat_n(code.unwritten(), n));
                    v.extend(std::iter::repeat_n(code.unwritten(), n));
                    if *scope == ScaleScope::Block {
                        k_scale.extend(std::iter::repeat_n(f32::NAN, layout.kv_heads));
                        v_scale.extend(std::iter::repeat_n(f32::NAN, layout.kv_heads));
                    }
                }
            }
            self.slots += 1;
            (self.slots - 1) as u32
        });
        self.reset(layout, slot);
        slot
    }

    /// Poisons a slot and keeps it for the next `take`.
    fn give_back(&mut self, layout: PoolLayout, slot: u32) {
        let range =
            slot as usize * layout.block_elems()..(slot as usize + 1) * layout.block_elems();
        match &mut self.data {
            Data::Float(pool) => {
                for b in [&mut pool.k, &mut pool.v] {
                    with_buffer!(b, x => x[range.clone()].fill(Element::from_f32(f32::NAN)));
                }
            }
            Data::Coded {
                code,
                scope,
                k,
                v,
                k_scale,
                v_scale,
            } => {
                k[range.clone()].fill(code.unwritten());
                v[range].fill(code.unwritten());
                if *scope == ScaleScope::Block {
                    let h = layout.kv_heads;
                    k_scale[slot as usize * h..(slot as usize + 1) * h].fill(f32::NAN);
                    v_scale[slot as usize * h..(slot as usize + 1) * h].fill(f32::NAN);
                }
            }
        }
        self.free.push(slot);
    }

    /// A narrow block starts afresh: no scale, every slot unwritten.
    fn reset(&mut self, layout: PoolLayout, slot: u32) {
        if let Data::Coded {
            code,
            scope,
            k,
            v,
            k_scale,
            v_scale,
        } = &mut self.data
        {
            let range =
                slot as usize * layout.block_elems()..(slot as usize + 1) * layout.block_elems();
            k[range.clone()].fill(code.unwritten());
            v[range].fill(code.unwritten());
            if *scope == ScaleScope::Block {
                let h = layout.kv_heads;
                k_scale[slot as usize * h..(slot as usize + 1) * h].fill(0.0);
                v_scale[slot as usize * h..(slot as usize + 1) * h].fill(0.0);
            }
        }
    }

    /// Sets still-unset per-head scales from the magnitudes of `rows` (token-major,
    /// `[n, kv_heads · d]`).
    fn calibrate(&mut self, layout: PoolLayout, k_rows: &[f32], v_rows: &[f32]) {
        if let Data::Coded {
            code,
            scope: ScaleScope::Head,
            k_scale,
            v_scale,
            ..
        } = &mut self.data
        {
            let d = layout.head_dim;
            for (scales, rows) in [(k_scale, k_rows), (v_scale, v_rows)] {
                for (h, s) in scales.iter_mut().enumerate() {
                    if *s == 0.0 {
                        let m = rows
                            .chunks(layout.kv_heads * d)
                            .map(|r| absmax(&r[h * d..(h + 1) * d]))
                            .fold(0.0f32, max_nan);
                        *s = code.scale_for(m);
                    }
                }
            }
        }
    }

    /// Stores rows `[n, kv_heads · d]` at in-block offsets `offsets` of `slot`.
    fn store(&mut self, layout: PoolLayout, slot: u32, offsets: &[usize], k: &[f32], v: &[f32]) {
        let (d, kvh) = (layout.head_dim, layout.kv_heads);
        let at = |h: usize, off: usize| layout.offset(slot as usize, h, off);
        match &mut self.data {
            Data::Float(pool) => {
                for (dst, src) in [(&mut pool.k, k), (&mut pool.v, v)] {
                    with_buffer!(dst, x => store_floats(x, layout, slot, offsets, src));
                }
            }
            Data::Coded {
                code,
                scope,
                k: kc,
                v: vc,
                k_scale,
                v_scale,
            } => {
                for (codes, scales, src) in [(kc, k_scale, k), (vc, v_scale, v)] {
                    for h in 0..kvh {
                        let si = match scope {
                            ScaleScope::Block => slot as usize * kvh + h,
                            ScaleScope::Head => h,
                        };
                        let m = src
                            .chunks(kvh * d)
                            .map(|r| absmax(&r[h * d..(h + 1) * d]))
                            .fold(0.0f32, max_nan);
                        if !m.is_finite() {
                            // A value the codes cannot hold poisons what shares its scale.
                            scales[si] = f32::NAN;
                        } else if *scope == ScaleScope::Block && m > scales[si] * code.max() {
                            let (old, new) = (scales[si], code.scale_for(m));
                            // Re-round what the block holds to the grown scale.
                            let block = &mut codes[at(h, 0)..at(h, 0) + layout.block_size * d];
                            for b in block.iter_mut().filter(|b| **b != code.unwritten()) {
                                *b = code.encode(code.decode(*b, old), new);
                            }
                            scales[si] = new;
                        }
                        let s = scales[si];
                        for (row, &off) in src.chunks(kvh * d).zip(offsets) {
                            let dst = &mut codes[at(h, off)..at(h, off) + d];
                            for (b, &x) in dst.iter_mut().zip(&row[h * d..(h + 1) * d]) {
                                *b = code.encode(x, s);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The stored K and V of (slot, head, offset), as f32 (plain indexing).
    fn read(&self, layout: PoolLayout, slot: u32, head: usize, off: usize) -> (Vec<f32>, Vec<f32>) {
        let d = layout.head_dim;
        let at = layout.offset(slot as usize, head, off);
        match &self.data {
            Data::Float(pool) => {
                let read = |b: &Buffer| with_buffer!(b, x => read_floats(x, at, d));
                (read(&pool.k), read(&pool.v))
            }
            Data::Coded {
                code,
                scope,
                k,
                v,
                k_scale,
                v_scale,
            } => {
                let si = match scope {
                    ScaleScope::Block => slot as usize * layout.kv_heads + head,
                    ScaleScope::Head => head,
                };
                let read = |c: &[u8], s: f32| -> Vec<f32> {
                    c[at..at + d].iter().map(|&b| code.decode(b, s)).collect()
                };
                (read(k, k_scale[si]), read(v, v_scale[si]))
            }
        }
    }

    /// Copies slot `from` to slot `to` (codes, values and per-block scales).
    fn copy_slot(&mut self, layout: PoolLayout, from: u32, to: u32) {
        let n = layout.block_elems();
        let (s, t) = (from as usize * n, to as usize * n);
        match &mut self.data {
            Data::Float(pool) => {
                for b in [&mut pool.k, &mut pool.v] {
                    with_buffer!(b, x => x.copy_within(s..s + n, t));
                }
            }
            Data::Coded {
                scope,
                k,
                v,
                k_scale,
                v_scale,
                ..
            } => {
                k.copy_within(s..s + n, t);
                v.copy_within(s..s + n, t);
                if *scope == ScaleScope::Block {
                    let h = layout.kv_heads;
                    let (fs, ts) = (from as usize * h, to as usize * h);
                    k_scale.copy_within(fs..fs + h, ts);
                    v_scale.copy_within(fs..fs + h, ts);
                }
            }
        }
    }

    /// Bytes this arena holds (values or codes, and scales).
    fn bytes(&self) -> usize {
        match &self.data {
            Data::Float(pool) => pool.k.bytes() + pool.v.bytes(),
            Data::Coded {
                k,
                v,
                k_scale,
                v_scale,
                ..
            } => k.len() + v.len() + 4 * (k_scale.len() + v_scale.len()),
        }
    }
}

/// Rows `[n, kv_heads · d]` rounded into a float arena at in-block `offsets` of `slot`.
fn store_floats<T: Element>(
    x: &mut [T],
    layout: PoolLayout,
    slot: u32,
    offsets: &[usize],
    rows: &[f32],
) {
    let (d, kvh) = (layout.head_dim, layout.kv_heads);
    for (row, &off) in rows.chunks(kvh * d).zip(offsets) {
        for h in 0..kvh {
            let at = layout.offset(slot as usize, h, off);
            T::narrow_into(&row[h * d..(h + 1) * d], &mut x[at..at + d]);
        }
    }
}

/// `n` more NaN elements at the end of a float arena.
fn grow_poisoned<T: Element>(x: &mut Vec<T>, n: usize) {
    x.extend(std::iter::repeat_n(T::from_f32(f32::NAN), n));
}

/// Row `at..at + d` of a float arena as f32.
fn read_floats<T: Element>(x: &[T], at: usize, d: usize) -> Vec<f32> {
    x[at..at + d].iter().map(|e| e.to_f32()).collect()
}

/// One layer's K/V in blocks of any format (module docs).
#[derive(Debug, Clone)]
pub struct KvCache {
    layout: PoolLayout,
    format: KvCacheFormat,
    /// `[recent]` or `[recent, old]`.
    pub(crate) arenas: Vec<Arena>,
    /// Per block id: `slot` (recent arena), `OLD | slot`, or `UNSET`; `None` for a uniform
    /// cache, whose block b is slot b.
    pub(crate) home: Option<Vec<u32>>,
}

impl KvCache {
    /// An empty cache of `layout.num_blocks` blocks in `format`; every slot poisoned.
    pub fn new(layout: PoolLayout, format: KvCacheFormat) -> Result<KvCache> {
        layout.validate()?;
        Ok(match format {
            KvCacheFormat::Uniform(f) => KvCache {
                layout,
                format,
                arenas: vec![Arena::new(f, layout, layout.num_blocks)?],
                home: None,
            },
            KvCacheFormat::Progressive { recent, old, .. } => {
                if layout.num_blocks >= OLD as usize {
                    return Err(KernelError::InvalidShape(format!(
                        "a progressive cache takes fewer than 2^31 blocks, not {}",
                        layout.num_blocks
                    )));
                }
                KvCache {
                    layout,
                    format,
                    arenas: vec![Arena::new(recent, layout, 0)?, Arena::new(old, layout, 0)?],
                    home: Some(vec![UNSET; layout.num_blocks]),
                }
            }
        })
    }

    /// The block geometry (`num_blocks` block ids).
    pub fn layout(&self) -> PoolLayout {
        self.layout
    }

    /// The format.
    pub fn format(&self) -> KvCacheFormat {
        self.format
    }

    /// The pool itself, when every block is one float format at its own id (what tree
    /// attention and the CUDA kernels take).
    pub fn float_pool(&self) -> Option<&KvPool> {
        match (&self.home, &self.arenas[0].data) {
            (None, Data::Float(pool)) => Some(pool),
            _ => None,
        }
    }

    /// `float_pool`, writable.
    pub fn float_pool_mut(&mut self) -> Option<&mut KvPool> {
        match (&self.home, &mut self.arenas[0].data) {
            (None, Data::Float(pool)) => Some(pool),
            _ => None,
        }
    }

    /// (arena, slot) of block `b`, if it was written.
    pub(crate) fn locate(&self, b: u32) -> Option<(usize, u32)> {
        match &self.home {
            None => Some((0, b)),
            Some(h) => match h[b as usize] {
                UNSET => None,
                x if x & OLD != 0 => Some((1, x & !OLD)),
                x => Some((0, x)),
            },
        }
    }

    /// Whether block `b` holds written data (the kernel refuses tables through others).
    pub fn is_written(&self, b: u32) -> bool {
        self.locate(b).is_some()
    }

    /// The format block `b` is stored in now, if it was written.
    pub fn block_format(&self, b: u32) -> Option<BlockFormat> {
        let (arena, _) = self.locate(b)?;
        Some(match self.format {
            KvCacheFormat::Uniform(f) => f,
            KvCacheFormat::Progressive { recent, old, .. } => [recent, old][arena],
        })
    }

    /// Bytes of storage the cache holds now (every arena's slots, scales included).
    pub fn bytes(&self) -> usize {
        self.arenas.iter().map(Arena::bytes).sum()
    }

    /// The slot for a write into block `b`; `fresh` (the write covers the block's first
    /// position) starts the block afresh in the recent arena.
    fn place(&mut self, b: u32, fresh: bool) -> (usize, u32) {
        let layout = self.layout;
        let Some(home) = self.home.as_mut() else {
            if fresh {
                self.arenas[0].reset(layout, b);
            }
            return (0, b);
        };
        let h = home[b as usize];
        if h == UNSET || (fresh && h & OLD != 0) {
            if h != UNSET {
                self.arenas[1].give_back(layout, h & !OLD);
            }
            let slot = self.arenas[0].take(layout);
            home[b as usize] = slot;
            return (0, slot);
        }
        if h & OLD != 0 {
            return (1, h & !OLD);
        }
        if fresh {
            self.arenas[0].reset(layout, h);
        }
        (0, h)
    }

    /// Stores rows `[n, kv_heads · head_dim]` of K and V at positions `positions` of the
    /// sequence with block table `table` (positions in increasing order), then ages that
    /// sequence's blocks (progressive caches).
    pub fn write(
        &mut self,
        table: &[u32],
        positions: &[usize],
        k: &[f32],
        v: &[f32],
    ) -> Result<()> {
        let l = self.layout;
        let per = l.kv_heads * l.head_dim;
        if k.len() != positions.len() * per || v.len() != k.len() {
            return Err(KernelError::BadBuffer(format!(
                "{} positions need {} values of K and of V, got {} and {}",
                positions.len(),
                positions.len() * per,
                k.len(),
                v.len()
            )));
        }
        let Some(end) = positions.iter().max().map(|p| p + 1) else {
            return Ok(());
        };
        if positions.windows(2).any(|w| w[0] >= w[1]) {
            return Err(KernelError::InvalidShape(
                "write positions must be increasing".into(),
            ));
        }
        check_table(&l, 0, table, end)?;
        for arena in &mut self.arenas {
            arena.calibrate(l, k, v);
        }
        let bs = l.block_size;
        let mut r = 0;
        while r < positions.len() {
            let lb = positions[r] / bs;
            let n = positions[r..].iter().take_while(|&&p| p / bs == lb).count();
            let offsets: Vec<usize> = positions[r..r + n].iter().map(|p| p % bs).collect();
            let (arena, slot) = self.place(table[lb], offsets[0] == 0);
            let rows = r * per..(r + n) * per;
            self.arenas[arena].store(l, slot, &offsets, &k[rows.clone()], &v[rows]);
            r += n;
        }
        self.age(table, end);
        Ok(())
    }

    /// Re-encodes in the old format the blocks of `table` lying entirely more than the window
    /// behind `end` that are still recent (progressive caches; nothing otherwise).
    fn age(&mut self, table: &[u32], end: usize) {
        let KvCacheFormat::Progressive { window, .. } = self.format else {
            return;
        };
        let l = self.layout;
        let due = end.saturating_sub(window) / l.block_size;
        let blocks: Vec<(u32, u32)> = table[..due]
            .iter()
            .filter_map(|&b| match self.locate(b) {
                Some((0, slot)) => Some((b, slot)),
                _ => None,
            })
            .collect();
        if blocks.is_empty() {
            return;
        }
        let per = l.kv_heads * l.head_dim;
        let (mut ks, mut vs) = (vec![], vec![]);
        for &(_, slot) in &blocks {
            let (mut k, mut v) = (vec![0.0; l.block_size * per], vec![0.0; l.block_size * per]);
            for off in 0..l.block_size {
                for h in 0..l.kv_heads {
                    let (kr, vr) = self.arenas[0].read(l, slot, h, off);
                    let at = off * per + h * l.head_dim;
                    k[at..at + l.head_dim].copy_from_slice(&kr);
                    v[at..at + l.head_dim].copy_from_slice(&vr);
                }
            }
            ks.push(k);
            vs.push(v);
        }
        let offsets: Vec<usize> = (0..l.block_size).collect();
        let home = self.home.as_mut().expect("a progressive cache has homes");
        for ((b, slot), (k, v)) in blocks.into_iter().zip(ks.iter().zip(&vs)) {
            let new = self.arenas[1].take(l);
            self.arenas[1].store(l, new, &offsets, k, v);
            self.arenas[0].give_back(l, slot);
            home[b as usize] = OLD | new;
        }
    }

    /// Copies block `src` into block `dst` (copy-on-write), in `src`'s format.
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        let l = self.layout;
        if src as usize >= l.num_blocks || dst as usize >= l.num_blocks {
            return Err(KernelError::InvalidShape(format!(
                "copy of block {src} to {dst} in a pool of {} blocks",
                l.num_blocks
            )));
        }
        let Some((arena, from)) = self.locate(src) else {
            return Err(KernelError::InvalidShape(format!(
                "copy of block {src}, which was never written"
            )));
        };
        let to = match self.home.as_mut() {
            None => dst,
            Some(home) => {
                let h = home[dst as usize];
                let same = h != UNSET && usize::from(h & OLD != 0) == arena;
                if same {
                    h & !OLD
                } else {
                    if h != UNSET {
                        self.arenas[usize::from(h & OLD != 0)].give_back(l, h & !OLD);
                    }
                    let slot = self.arenas[arena].take(l);
                    home[dst as usize] = if arena == 1 { OLD | slot } else { slot };
                    slot
                }
            }
        };
        self.arenas[arena].copy_slot(l, from, to);
        Ok(())
    }

    /// The stored (dequantised) K and V of positions `0..tokens`, contiguous
    /// `[kv_heads, tokens, head_dim]` in f32. Plain indexing and the scalar codec, no kernel
    /// code: the reference and the model's contiguous attention read the cache through it.
    pub fn gather(&self, table: &[u32], tokens: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let l = self.layout;
        check_table(&l, 0, table, tokens)?;
        let d = l.head_dim;
        let (mut k, mut v) = (
            vec![f32::NAN; l.kv_heads * tokens * d],
            vec![f32::NAN; l.kv_heads * tokens * d],
        );
        for t in 0..tokens {
            let b = table[t / l.block_size];
            let (arena, slot) = self.locate(b).ok_or_else(|| never_written(b))?;
            for h in 0..l.kv_heads {
                let (kr, vr) = self.arenas[arena].read(l, slot, h, t % l.block_size);
                let at = (h * tokens + t) * d;
                k[at..at + d].copy_from_slice(&kr);
                v[at..at + d].copy_from_slice(&vr);
            }
        }
        Ok((k, v))
    }

    /// Bytes a decode reads for a sequence of `tokens` through `table`: its K and V rows in
    /// each block's format and the (block, head) scales of the blocks it touches.
    pub fn bytes_read(&self, table: &[u32], tokens: usize) -> usize {
        let l = self.layout;
        let mut bytes = 0;
        for (i, &b) in table[..l.blocks_for(tokens)].iter().enumerate() {
            let rows = (tokens - i * l.block_size).min(l.block_size);
            let Some(f) = self.block_format(b) else {
                continue;
            };
            let scales = match f {
                BlockFormat::Coded(_, ScaleScope::Block) => 4,
                _ => 0,
            };
            bytes += 2 * l.kv_heads * (rows * l.head_dim * f.element_bytes() + scales);
        }
        bytes
    }

    /// Checks that every block a sequence of `tokens` reads through `table` was written.
    pub fn check_written(&self, table: &[u32], tokens: usize) -> Result<()> {
        match table[..self.layout.blocks_for(tokens)]
            .iter()
            .find(|&&b| !self.is_written(b))
        {
            Some(&b) => Err(never_written(b)),
            None => Ok(()),
        }
    }
}

fn never_written(b: u32) -> KernelError {
    KernelError::InvalidShape(format!("block {b} of the table was never written"))
}
