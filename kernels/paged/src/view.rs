//! What paged decode reads, whatever the storage: a `Source` over a float `KvPool` (block b
//! at slot b) or a `KvCache` (block b wherever its `home` says, in that arena's format) hands
//! the kernel a block's run of K or V rows as a typed slice — f32, f16, bf16, or codes with
//! their (block, head) or head scale — so one kernel serves every format, uniform or mixed,
//! branching once per run of a block rather than per element.

use crate::cache::{Data, KvCache, OLD};
use crate::codec::Code;
use crate::kv_format::ScaleScope;
use crate::pool::{KvPool, PoolLayout};
use half::{bf16, f16};
use kernel_common::Buffer;

/// One arena's K and V, borrowed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ArenaView<'a> {
    F32 {
        k: &'a [f32],
        v: &'a [f32],
    },
    F16 {
        k: &'a [f16],
        v: &'a [f16],
    },
    BF16 {
        k: &'a [bf16],
        v: &'a [bf16],
    },
    Coded {
        code: Code,
        per_block: bool,
        k: &'a [u8],
        v: &'a [u8],
        k_scale: &'a [f32],
        v_scale: &'a [f32],
    },
}

impl<'a> ArenaView<'a> {
    fn of_pool(pool: &'a KvPool) -> ArenaView<'a> {
        match (&pool.k, &pool.v) {
            (Buffer::F32(k), Buffer::F32(v)) => ArenaView::F32 { k, v },
            (Buffer::F16(k), Buffer::F16(v)) => ArenaView::F16 { k, v },
            (Buffer::BF16(k), Buffer::BF16(v)) => ArenaView::BF16 { k, v },
            _ => unreachable!("a pool's K and V share a dtype (KvPool::poisoned, append)"),
        }
    }

    fn of_data(data: &'a Data) -> ArenaView<'a> {
        match data {
            Data::Float(pool) => ArenaView::of_pool(pool),
            Data::Coded {
                code,
                scope,
                k,
                v,
                k_scale,
                v_scale,
            } => ArenaView::Coded {
                code: *code,
                per_block: *scope == ScaleScope::Block,
                k,
                v,
                k_scale,
                v_scale,
            },
        }
    }
}

/// A run of `n` rows of one block and head: a typed slice of `n · head_dim` elements.
pub(crate) enum Run<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    /// Codes and the scale they share.
    Int8(&'a [u8], f32),
    E4m3(&'a [u8], f32),
}

/// The K/V a decode call reads.
pub(crate) struct Source<'a> {
    pub layout: PoolLayout,
    /// Per block id its arena and slot (`cache::OLD` bit); `None`: block b is slot b of
    /// arena 0.
    home: Option<&'a [u32]>,
    arenas: [ArenaView<'a>; 2],
}

impl<'a> Source<'a> {
    /// A float pool.
    pub fn of_pool(pool: &'a KvPool) -> Source<'a> {
        let a = ArenaView::of_pool(pool);
        Source {
            layout: pool.layout,
            home: None,
            arenas: [a, a],
        }
    }

    /// A cache whose tables' blocks were all written (`KvCache::check_written`).
    pub fn of_cache(cache: &'a KvCache) -> Source<'a> {
        let first = ArenaView::of_data(&cache.arenas[0].data);
        let second = cache
            .arenas
            .get(1)
            .map_or(first, |a| ArenaView::of_data(&a.data));
        Source {
            layout: cache.layout(),
            home: cache.home.as_deref(),
            arenas: [first, second],
        }
    }

    /// The arena and slot of block `b`.
    #[inline(always)]
    fn locate(&self, b: u32) -> (&ArenaView<'a>, usize) {
        match self.home {
            None => (&self.arenas[0], b as usize),
            Some(h) => {
                let x = h[b as usize];
                let arena = usize::from(x & OLD != 0);
                (&self.arenas[arena], (x & !OLD) as usize)
            }
        }
    }

    /// Rows `off..off + n` of block `b`, head `head`: K (`value` false) or V.
    #[inline(always)]
    fn run(&self, b: u32, head: usize, off: usize, n: usize, value: bool) -> Run<'a> {
        let l = self.layout;
        let (arena, slot) = self.locate(b);
        let base = l.offset(slot, head, off);
        let r = base..base + n * l.head_dim;
        macro_rules! pick {
            ($k:expr, $v:expr) => {
                if value {
                    $v
                } else {
                    $k
                }
            };
        }
        match *arena {
            ArenaView::F32 { k, v } => Run::F32(&pick!(k, v)[r]),
            ArenaView::F16 { k, v } => Run::F16(&pick!(k, v)[r]),
            ArenaView::BF16 { k, v } => Run::BF16(&pick!(k, v)[r]),
            ArenaView::Coded {
                code,
                per_block,
                k,
                v,
                k_scale,
                v_scale,
            } => {
                let si = if per_block {
                    slot * l.kv_heads + head
                } else {
                    head
                };
                let (codes, scale) = (&pick!(k, v)[r], pick!(k_scale, v_scale)[si]);
                match code {
                    Code::Int8 => Run::Int8(codes, scale),
                    Code::E4m3 => Run::E4m3(codes, scale),
                }
            }
        }
    }

    /// K rows `off..off + n` of block `b`, head `head`.
    #[inline(always)]
    pub fn k_run(&self, b: u32, head: usize, off: usize, n: usize) -> Run<'a> {
        self.run(b, head, off, n, false)
    }

    /// V rows `off..off + n` of block `b`, head `head`.
    #[inline(always)]
    pub fn v_run(&self, b: u32, head: usize, off: usize, n: usize) -> Run<'a> {
        self.run(b, head, off, n, true)
    }

    /// Asks for the K and V rows `off..off + n` of block `b`, head `head`, in cache.
    #[inline(always)]
    pub fn prefetch(&self, b: u32, head: usize, off: usize, n: usize) {
        for value in [false, true] {
            match self.run(b, head, off, n, value) {
                Run::F32(x) => kernel_cpu::simd::prefetch(x),
                Run::F16(x) => kernel_cpu::simd::prefetch(x),
                Run::BF16(x) => kernel_cpu::simd::prefetch(x),
                Run::Int8(x, _) | Run::E4m3(x, _) => kernel_cpu::simd::prefetch(x),
            }
        }
    }
}
