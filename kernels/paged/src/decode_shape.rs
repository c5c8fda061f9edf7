//! What a paged decode call is asked: `PagedDecodeShape` (the query side — heads, head size,
//! new tokens per sequence, scale, sliding window, soft-cap — validated once, and the range of
//! positions its rows see) and `SplitKv` (how a sequence's context is partitioned:
//! FlashDecoding's split-KV, by a token count, by the context length alone, or automatically
//! by the thread count).

use crate::pool::{PagedBatch, PoolLayout};
use kernel_attention::shape::{validate_window_softcap, window_start};
use kernel_common::error::Result;
use kernel_common::KernelError;
use std::ops::Range;

/// Most new query tokens per sequence the decode kernel takes (speculative verification).
pub const MAX_Q_LEN: usize = 16;
/// Shortest partition `SplitKv::Auto` and `SplitKv::Context` make.
const AUTO_MIN_PARTITION: usize = 64;
/// Most partitions `SplitKv::Context` cuts a sequence's context into.
pub const CONTEXT_PARTS: usize = 4;

/// The query side of a paged decode call. `window` and `softcap` mean what they mean in
/// `kernel_attention::AttentionShape`: the query at position p sees key j iff j ≤ p and
/// p − j < window; scores are cap · tanh(scale · q·k / cap) before the softmax.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PagedDecodeShape {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// New tokens per sequence; they are the last `q_len` positions of its context.
    pub q_len: usize,
    pub scale: f32,
    /// Sliding window in positions (`None`: the whole context).
    pub window: Option<usize>,
    /// Logit soft-cap (`None`: plain scores).
    pub softcap: Option<f32>,
}

impl PagedDecodeShape {
    /// The same shape with a sliding window.
    pub fn with_window(self, window: Option<usize>) -> PagedDecodeShape {
        PagedDecodeShape { window, ..self }
    }

    /// The same shape with a logit soft-cap.
    pub fn with_softcap(self, softcap: Option<f32>) -> PagedDecodeShape {
        PagedDecodeShape { softcap, ..self }
    }

    /// Checks the shape against the pool and the batch.
    pub fn validate(&self, layout: &PoolLayout, batch: &PagedBatch) -> Result<()> {
        let bad = |m: String| Err(KernelError::InvalidShape(m));
        layout.validate()?;
        if self.kv_heads == 0 || self.q_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "kv_heads ({}) must divide q_heads ({}), both > 0",
                self.kv_heads, self.q_heads
            ));
        }
        if self.kv_heads != layout.kv_heads || self.head_dim != layout.head_dim {
            return bad(format!(
                "queries have {} KV heads of dim {}, the pool {} of dim {}",
                self.kv_heads, self.head_dim, layout.kv_heads, layout.head_dim
            ));
        }
        if self.q_len == 0 || self.q_len > MAX_Q_LEN {
            return bad(format!(
                "paged decode takes q_len 1..={MAX_Q_LEN}, got {}",
                self.q_len
            ));
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return bad(format!(
                "softmax scale must be finite and > 0, got {}",
                self.scale
            ));
        }
        validate_window_softcap(self.window, self.softcap)?;
        if let Some((s, len)) = batch
            .context_lens
            .iter()
            .enumerate()
            .find(|(_, &l)| l < self.q_len)
        {
            return bad(format!(
                "sequence {s}: context {len} is shorter than q_len {} (append the new tokens first)",
                self.q_len
            ));
        }
        batch.validate(layout)
    }

    /// The positions some query row of a sequence of `ctx` tokens sees: from the first
    /// row's window start (position ctx − q_len, window w: ctx − q_len + 1 − w) to the end.
    pub fn visible_range(&self, ctx: usize) -> Range<usize> {
        window_start((ctx + 1).saturating_sub(self.q_len), self.window)..ctx
    }

    /// Query rows one task serves: `group · q_len`.
    pub fn rows(&self) -> usize {
        self.q_heads / self.kv_heads * self.q_len
    }

    /// Elements of q and out for `seqs` sequences (`[seqs, q_heads, q_len, head_dim]`).
    pub fn q_elems(&self, seqs: usize) -> usize {
        seqs * self.q_heads * self.q_len * self.head_dim
    }
}

/// How the context of a sequence is partitioned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitKv {
    /// One task per (sequence, KV head).
    Off,
    /// About two partitions per thread for each sequence, in whole units of 64 tokens (so a
    /// decode step of one sequence with few KV heads still keeps every thread busy).
    Auto,
    /// Partitions of this many tokens.
    Tokens(usize),
    /// Partitions from the context length alone: at most `CONTEXT_PARTS` of them, in whole
    /// units of 64 tokens. Like `Tokens` it never looks at the thread count, so a sequence's
    /// output is bit-identical on 1 or N threads; unlike it, long contexts still split into
    /// few parts.
    Context,
}

impl SplitKv {
    /// Parses `off`, `auto`, `ctx` or a positive token count.
    pub fn parse(text: &str) -> Result<SplitKv> {
        match text {
            "off" => Ok(SplitKv::Off),
            "auto" => Ok(SplitKv::Auto),
            "ctx" => Ok(SplitKv::Context),
            _ => match text.parse::<usize>() {
                Ok(n) if n > 0 => Ok(SplitKv::Tokens(n)),
                _ => Err(KernelError::Unsupported(format!(
                    "split='{text}' must be off, auto, ctx or a positive token count"
                ))),
            },
        }
    }

    /// Tokens per partition of a sequence whose rows see `ctx` positions between them (`ctx`
    /// itself = unsplit; the whole context, or the window's reach). It depends on the
    /// sequence alone, never on its batch neighbours, so a sequence's output
    /// is bit-identical whatever it is batched with.
    ///
    /// `Auto` and `Context` cut whole units of `AUTO_MIN_PARTITION` tokens, so neighbouring
    /// context lengths share their partitions (a verification pass's rows, each a decode step
    /// one position on, then read the context in one call: `shared_call_is_exact`).
    pub fn partition_tokens(&self, ctx: usize) -> usize {
        let unit = |t: usize| t.max(1).next_multiple_of(AUTO_MIN_PARTITION);
        let tokens = match *self {
            SplitKv::Off => ctx,
            SplitKv::Tokens(n) => n,
            SplitKv::Auto => unit(ctx.div_ceil(2 * rayon::current_num_threads())),
            SplitKv::Context => unit(ctx.div_ceil(CONTEXT_PARTS)),
        };
        tokens.clamp(1, ctx.max(1))
    }

    /// The partitions of the positions `seen` (a sequence's visible range): consecutive
    /// ranges of `partition_tokens(seen.len())`, the last one shorter; none when it is empty.
    pub fn partitions(&self, seen: Range<usize>) -> impl Iterator<Item = Range<usize>> {
        let part = self.partition_tokens(seen.len());
        (seen.start..seen.end)
            .step_by(part)
            .map(move |t0| t0..(t0 + part).min(seen.end))
    }
}

/// Whether one decode call of `shape` (q_len = k new tokens) on a sequence of `ctx` tokens
/// gives each of its k rows the bits of the decode step at that row's position (q_len 1 on
/// the first ctx − k + 1 + r tokens), as a verification pass needs. The kernel scores a row
/// chunk by chunk from its partitions' starts and masks keys past the row's own position
/// (their weights are exactly 0, and `exp_shifted_sum` adds a masked tail into the lanes its
/// keys would take), so the bits agree when each row's own partitions are the call's
/// partitions it reaches, cut at its last key: same starts (so the same window start and
/// chunk boundaries), same ends before its last key. That holds for `Off` and `Tokens`
/// always, for `Context` and `Auto` except where the k contexts straddle a 64-token unit of
/// their partition size, and under a sliding window while every row's window reaches
/// position 0. V rows past a row's position are read and weighted by 0, so they must be
/// finite (in a verification pass they are the pass's own tokens).
pub fn shared_call_is_exact(shape: &PagedDecodeShape, ctx: usize, split: SplitKv) -> bool {
    let k = shape.q_len;
    if k == 0 || ctx < k {
        return false;
    }
    let shared: Vec<Range<usize>> = split.partitions(shape.visible_range(ctx)).collect();
    let one = PagedDecodeShape { q_len: 1, ..*shape };
    (0..k).all(|r| {
        let ctx_r = ctx - k + 1 + r;
        let cut = shared
            .iter()
            .filter(|p| p.start < ctx_r)
            .map(|p| p.start..p.end.min(ctx_r));
        split.partitions(one.visible_range(ctx_r)).eq(cut)
    })
}
