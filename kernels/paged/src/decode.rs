//! Paged decode attention for q_len 1..=MAX_Q_LEN new tokens per sequence (vLLM
//! PagedAttention): one task per (sequence, KV head) serves all `group` query heads of that KV
//! head, so each K/V row is read from memory once, walking the block table chunk by chunk
//! with an online softmax. Split-KV (FlashDecoding, Dao et al. 2023) cuts long contexts into
//! partitions computed in parallel, each returning its normalised output and log-sum-exp,
//! then reduces them: out = Σ e^(lse_p − max)·o_p / Σ e^(lse_p − max). With a sliding
//! window only the positions some query row sees (`PagedDecodeShape::visible_range`) are
//! walked and partitioned: blocks wholly before the window are never read (they may hold
//! anything, NaN included), the boundary block is entered at the first visible position, and
//! a row's keys outside its own window are masked. Soft-capped scores (Gemma-2) take one
//! tanh per visible score.
//! The K/V come through a `view::Source`: a float pool, or a `KvCache` whose blocks may each
//! be f32, f16, bf16, int8 or FP8 — f16/bf16 runs are widened into an L1 scratch, narrow
//! codes are read as bytes and dequantised in registers (`coded_rows`), the run's scale
//! applied to its scores (K) or folded into its probabilities (V).

use crate::cache::KvCache;
use crate::coded_rows::CodedRows;
pub use crate::decode_shape::{shared_call_is_exact, PagedDecodeShape, SplitKv, MAX_Q_LEN};
use crate::pool::{KvPool, PagedBatch};
use crate::view::{Run, Source};
use kernel_attention::cpu::gemm::widen;
use kernel_attention::cpu::softcap::cap_scores;
use kernel_attention::shape::window_start;
use kernel_common::error::Result;
use kernel_common::{Buffer, Element, KernelError};
use kernel_cpu::rows::{Avx2, Avx512, Portable};
use kernel_cpu::simd;
use kernel_cpu::{team, Isa};

/// Keys scored per online-softmax step.
const CHUNK: usize = 128;

/// Running softmax state of the rows of one task: unnormalised output, row max, row sum.
struct Acc {
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
}

/// What one task reads: the source, one sequence's table and its KV head.
struct TaskView<'a> {
    src: &'a Source<'a>,
    table: &'a [u32],
    kv_head: usize,
    /// Causal horizon (last visible position) of each row.
    horizon: &'a [usize],
    /// First visible position of each row (its window start; 0 without a window).
    first: &'a [usize],
    softcap: Option<f32>,
    /// Positions whose K/V sit at other slots of the table (a draft tree's path).
    tail: Option<&'a RemappedTail>,
}

/// Positions `from..` of one sequence whose K/V are not at their own slot: position
/// `from + i` is stored at slot `slots[i]` of the block table. A draft tree's node sits at
/// slot ctx + (node index) but at position ctx + depth, so the path to a node is remapped to
/// score that node exactly as decode scores the token at its position: the same partitions,
/// chunks and summation order, hence the same bits (speculative greedy output equal to plain
/// greedy output, not merely close to it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemappedTail {
    pub from: usize,
    pub slots: Vec<usize>,
}

impl RemappedTail {
    /// The slot of position `pos`.
    #[inline(always)]
    fn slot(tail: Option<&RemappedTail>, pos: usize) -> usize {
        match tail {
            Some(t) if pos >= t.from => t.slots[pos - t.from],
            _ => pos,
        }
    }
}

/// Positions `c0..c1` cut at block boundaries: (first position, block id, offset in the
/// block, rows). An iterator rather than a callback so the float loops that consume it stay
/// inside the caller's `#[target_feature]` function (a closure would be compiled without
/// AVX2/FMA).
#[inline(always)]
fn runs<'v>(
    view: &'v TaskView<'_>,
    c0: usize,
    c1: usize,
) -> impl Iterator<Item = (usize, u32, usize, usize)> + 'v {
    let bs = view.src.layout.block_size;
    let mut pos = c0;
    std::iter::from_fn(move || {
        if pos >= c1 {
            return None;
        }
        let (slot, end) = match view.tail {
            // A remapped position is a run of its own (the accumulation is key by key, so
            // the run lengths do not change the bits).
            Some(t) if pos >= t.from => (t.slots[pos - t.from], pos + 1),
            Some(t) => (pos, c1.min(t.from)),
            None => (pos, c1),
        };
        let off = slot % bs;
        let run = (bs - off).min(end - pos);
        let item = (pos, view.table[slot / bs], off, run);
        pos += run;
        Some(item)
    })
}

/// Requests K and V of position `pos` (the block table scatters a sequence over memory,
/// which the hardware prefetcher cannot follow).
#[inline(always)]
fn prefetch_position(view: &TaskView<'_>, pos: usize) {
    let bs = view.src.layout.block_size;
    let slot = RemappedTail::slot(view.tail, pos);
    view.src
        .prefetch(view.table[slot / bs], view.kv_head, slot % bs, 1);
}

/// Key rows of one run as the scoring loop sees them.
trait Keys {
    /// Scores of `R` query rows against key row `t` of the run.
    fn dots<K: CodedRows, const R: usize>(
        &self,
        kern: K,
        q: &[f32],
        d: usize,
        t: usize,
    ) -> [f32; R];
}

/// Value rows of one run as the accumulation sees them.
trait Values {
    /// o_r += Σ_t p_rt · v_t over the run's `n` rows.
    fn accumulate<K: CodedRows, const R: usize>(
        &self,
        kern: K,
        o: &mut [f32],
        d: usize,
        p: &[f32],
        p_stride: usize,
        n: usize,
    );
}

/// f32 rows (f16/bf16 widened into scratch first).
struct Floats<'a>(&'a [f32]);

/// Code rows and their shared scale.
struct Codes<'a, const FP8: bool>(&'a [u8], f32);

impl Keys for Floats<'_> {
    #[inline(always)]
    fn dots<K: CodedRows, const R: usize>(
        &self,
        kern: K,
        q: &[f32],
        d: usize,
        t: usize,
    ) -> [f32; R] {
        kern.dot_rows::<R>(q, d, &self.0[t * d..(t + 1) * d])
    }
}

impl<const FP8: bool> Keys for Codes<'_, FP8> {
    #[inline(always)]
    fn dots<K: CodedRows, const R: usize>(
        &self,
        kern: K,
        q: &[f32],
        d: usize,
        t: usize,
    ) -> [f32; R] {
        let s = kern.dot_codes::<FP8, R>(q, d, &self.0[t * d..(t + 1) * d]);
        s.map(|x| x * self.1)
    }
}

impl Values for Floats<'_> {
    #[inline(always)]
    fn accumulate<K: CodedRows, const R: usize>(
        &self,
        kern: K,
        o: &mut [f32],
        d: usize,
        p: &[f32],
        p_stride: usize,
        n: usize,
    ) {
        kern.accumulate_rows::<R>(o, d, p, p_stride, self.0, n)
    }
}

impl<const FP8: bool> Values for Codes<'_, FP8> {
    #[inline(always)]
    fn accumulate<K: CodedRows, const R: usize>(
        &self,
        kern: K,
        o: &mut [f32],
        d: usize,
        p: &[f32],
        p_stride: usize,
        n: usize,
    ) {
        kern.accumulate_codes::<FP8, R>(o, d, p, p_stride, self.1, self.0, n)
    }
}

/// Scores of every row against the run's keys at positions `pos..pos + n` into `s`
/// (row-major, CHUNK columns from `c0`); prefetches one chunk ahead as it goes.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn score_run<K: CodedRows, S: Keys>(
    kern: K,
    view: &TaskView<'_>,
    keys: &S,
    q: &[f32],
    (pos, n): (usize, usize),
    c0: usize,
    t1: usize,
    s: &mut [f32],
) {
    let d = view.src.layout.head_dim;
    let rows = view.horizon.len();
    for t in 0..n {
        let col = pos - c0 + t;
        // While scoring key p, request V of p (used right after this chunk's scores) and K
        // of p + CHUNK (the next chunk): a steady stream of requests rather than a burst.
        if pos + t + CHUNK < t1 {
            prefetch_position(view, pos + t + CHUNK);
        }
        // Rows in blocks of 4, the rest (a GQA group of 3 or 7) in one block of 3, 2 or 1: a
        // row's score has the same bits whatever its block, and a block loads the key once
        // and runs its rows' FMA chains side by side (row by row, one dependent chain per
        // key: the scores of SmolLM2's 3-row groups were 20% of a 32-sequence decode step).
        let mut r = 0;
        while r < rows {
            let (left, q) = (rows - r, &q[r * d..]);
            let mut put = |dots: &[f32]| {
                for (i, &x) in dots.iter().enumerate() {
                    s[(r + i) * CHUNK + col] = x;
                }
                dots.len()
            };
            r += match left {
                1 => put(&keys.dots::<K, 1>(kern, q, d, t)),
                2 => put(&keys.dots::<K, 2>(kern, q, d, t)),
                3 => put(&keys.dots::<K, 3>(kern, q, d, t)),
                _ => put(&keys.dots::<K, 4>(kern, q, d, t)),
            };
        }
    }
}

/// o += P·V over the run's values at columns `col..col + n` of the chunk's probabilities.
#[inline(always)]
fn accumulate_run<K: CodedRows, V: Values>(
    kern: K,
    rows: usize,
    d: usize,
    values: &V,
    s: &[f32],
    (col, n): (usize, usize),
    acc: &mut Acc,
) {
    // As `score_run`: blocks of 4, the rest in one block of 3, 2 or 1 (each row's sums the
    // bits they are in any block).
    let mut r = 0;
    while r < rows {
        let (o, p) = (&mut acc.o[r * d..], &s[r * CHUNK + col..]);
        macro_rules! block {
            ($n:literal) => {{
                values.accumulate::<K, $n>(kern, o, d, p, CHUNK, n);
                $n
            }};
        }
        r += match rows - r {
            1 => block!(1),
            2 => block!(2),
            3 => block!(3),
            _ => block!(4),
        };
    }
}

/// Online-softmax attention of the task's rows (`q`, pre-scaled) over positions `t0..t1`.
#[inline(always)]
fn attend_range<K: CodedRows>(
    kern: K,
    view: &TaskView<'_>,
    q: &[f32],
    t0: usize,
    t1: usize,
    acc: &mut Acc,
) {
    let d = view.src.layout.head_dim;
    let h = view.kv_head;
    let rows = view.horizon.len();
    let mut s = vec![0.0f32; rows * CHUNK];
    let mut scratch = Vec::new();
    for (_, b, off, n) in runs(view, t0, (t0 + CHUNK).min(t1)) {
        view.src.prefetch(b, h, off, n);
    }
    let mut c0 = t0;
    while c0 < t1 {
        let c1 = (c0 + CHUNK).min(t1);
        let n = c1 - c0;
        for (pos, b, off, len) in runs(view, c0, c1) {
            let at = (pos, len);
            match view.src.k_run(b, h, off, len) {
                Run::F32(x) => score_run(kern, view, &Floats(x), q, at, c0, t1, &mut s),
                Run::F16(x) => {
                    let x = widen(x, &mut scratch);
                    score_run(kern, view, &Floats(x), q, at, c0, t1, &mut s)
                }
                Run::BF16(x) => {
                    let x = widen(x, &mut scratch);
                    score_run(kern, view, &Floats(x), q, at, c0, t1, &mut s)
                }
                Run::Int8(x, sc) => {
                    score_run(kern, view, &Codes::<false>(x, sc), q, at, c0, t1, &mut s)
                }
                Run::E4m3(x, sc) => {
                    score_run(kern, view, &Codes::<true>(x, sc), q, at, c0, t1, &mut s)
                }
            }
        }
        for r in 0..rows {
            let srow = &mut s[r * CHUNK..r * CHUNK + n];
            // This row's keys within the chunk: after its window start, up to its horizon.
            let lo = view.first[r].saturating_sub(c0).min(n);
            let hi = (view.horizon[r] + 1).saturating_sub(c0).clamp(lo, n);
            if let Some(cap) = view.softcap {
                cap_scores(cap, &mut srow[lo..hi]);
            }
            srow[..lo].fill(f32::NEG_INFINITY);
            srow[hi..].fill(f32::NEG_INFINITY);
            let m_new = acc.m[r].max(simd::max(&srow[lo..hi]));
            if m_new == f32::NEG_INFINITY {
                // Nothing visible yet (before this row's window): zero weights, no update.
                srow.fill(0.0);
                continue;
            }
            let row_sum = simd::exp_shifted_sum(srow, m_new);
            let alpha = simd::exp_f32(acc.m[r] - m_new);
            acc.l[r] = alpha * acc.l[r] + row_sum;
            if alpha != 1.0 {
                simd::scale(alpha, &mut acc.o[r * d..(r + 1) * d]);
            }
            acc.m[r] = m_new;
        }
        for (pos, b, off, len) in runs(view, c0, c1) {
            let at = (pos - c0, len);
            match view.src.v_run(b, h, off, len) {
                Run::F32(x) => accumulate_run(kern, rows, d, &Floats(x), &s, at, acc),
                Run::F16(x) => {
                    let x = widen(x, &mut scratch);
                    accumulate_run(kern, rows, d, &Floats(x), &s, at, acc)
                }
                Run::BF16(x) => {
                    let x = widen(x, &mut scratch);
                    accumulate_run(kern, rows, d, &Floats(x), &s, at, acc)
                }
                Run::Int8(x, sc) => {
                    accumulate_run(kern, rows, d, &Codes::<false>(x, sc), &s, at, acc)
                }
                Run::E4m3(x, sc) => {
                    accumulate_run(kern, rows, d, &Codes::<true>(x, sc), &s, at, acc)
                }
            }
        }
        c0 = c1;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn attend_range_avx2(
    kern: Avx2,
    view: &TaskView<'_>,
    q: &[f32],
    t0: usize,
    t1: usize,
    acc: &mut Acc,
) {
    attend_range(kern, view, q, t0, t1, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn attend_range_avx512(
    kern: Avx512,
    view: &TaskView<'_>,
    q: &[f32],
    t0: usize,
    t1: usize,
    acc: &mut Acc,
) {
    attend_range(kern, view, q, t0, t1, acc)
}

/// Runs one partition of one task at ISA tier `isa` (resolved on the calling thread) and
/// returns its state.
fn partition(view: &TaskView<'_>, q: &[f32], t0: usize, t1: usize, isa: Isa) -> Acc {
    let rows = view.horizon.len();
    let mut acc = Acc {
        o: vec![0.0; rows * view.src.layout.head_dim],
        m: vec![f32::NEG_INFINITY; rows],
        l: vec![0.0; rows],
    };
    #[cfg(target_arch = "x86_64")]
    if let Some(kern) = Avx512::for_tier(isa) {
        // SAFETY: the token proves AVX-512F, AVX2, FMA and F16C were detected on this CPU.
        unsafe { attend_range_avx512(kern, view, q, t0, t1, &mut acc) };
        return acc;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(kern) = Avx2::for_tier(isa) {
        // SAFETY: the token proves the AVX2 tier (AVX2, FMA, F16C) was detected on this CPU.
        unsafe { attend_range_avx2(kern, view, q, t0, t1, &mut acc) };
        return acc;
    }
    attend_range(Portable, view, q, t0, t1, &mut acc);
    acc
}

/// Merges partition states by log-sum-exp into `out` (rows × d, normalised).
fn reduce<T: Element>(parts: &[Acc], d: usize, out: &mut [T]) {
    let rows = out.len() / d;
    let mut o = vec![0.0f32; d];
    for r in 0..rows {
        // lse_p = m_p + ln l_p; partitions a row cannot see (l = 0) carry no weight.
        let lse = |p: &Acc| {
            if p.l[r] > 0.0 {
                p.m[r] + p.l[r].ln()
            } else {
                f32::NEG_INFINITY
            }
        };
        let top = parts.iter().map(lse).fold(f32::NEG_INFINITY, f32::max);
        o.fill(0.0);
        let mut wsum = 0.0f32;
        for p in parts.iter().filter(|p| p.l[r] > 0.0) {
            let w = (lse(p) - top).exp();
            wsum += w;
            // The partition's normalised output o_p / l_p, weighted by w.
            // `axpy_plain`: this runs outside the `#[target_feature]` wrappers, where
            // `mul_add` is a call to the software `fmaf`.
            simd::axpy_plain(w / p.l[r], &p.o[r * d..(r + 1) * d], &mut o);
        }
        T::narrow_into(
            &o.iter().map(|x| x / wsum).collect::<Vec<_>>(),
            &mut out[r * d..(r + 1) * d],
        );
    }
}

fn decode_typed<T: Element>(
    shape: &PagedDecodeShape,
    batch: &PagedBatch,
    src: &Source<'_>,
    q: &[T],
    out: &mut [T],
    split: SplitKv,
    tails: Option<&[RemappedTail]>,
) {
    let d = shape.head_dim;
    let rows = shape.rows();
    let tasks = batch.len() * shape.kv_heads;
    // Resolved here, before work is forked: a worker thread does not see this thread's choice.
    let isa = Isa::active();
    // Every (task, partition) is one work item of one flat parallel region, so a sequence
    // split in partitions keeps every thread busy even when there are fewer tasks than threads
    // (batch 1 of a 3-KV-head model on 2 threads left one idle a third of the time).
    // Partitions cover the visible positions only, so none is empty.
    let items: Vec<(usize, usize, usize)> = (0..tasks)
        .flat_map(|task| {
            let seen = shape.visible_range(batch.context_lens[task / shape.kv_heads]);
            split.partitions(seen).map(move |p| (task, p.start, p.end))
        })
        .collect();
    let item_state = |&(task, t0, t1): &(usize, usize, usize)| -> Acc {
        let (seq, kv_head) = (task / shape.kv_heads, task % shape.kv_heads);
        let ctx = batch.context_lens[seq];
        let horizon: Vec<usize> = (0..rows)
            .map(|r| ctx - shape.q_len + r % shape.q_len)
            .collect();
        let first: Vec<usize> = horizon
            .iter()
            .map(|&h| window_start(h + 1, shape.window))
            .collect();
        let view = TaskView {
            src,
            table: &batch.block_tables[seq],
            kv_head,
            horizon: &horizon,
            first: &first,
            softcap: shape.softcap,
            tail: tails.map(|t| &t[seq]),
        };
        let mut qf: Vec<f32> = vec![0.0; rows * d];
        T::widen_into(&q[task * rows * d..(task + 1) * rows * d], &mut qf);
        simd::scale(shape.scale, &mut qf);
        partition(&view, &qf, t0, t1, isa)
    };
    if items.len() == tasks {
        // One partition per task: normalise in place, no second region.
        team::for_each_chunk_mut(out, rows * d, |task, o| {
            reduce(&[item_state(&items[task])], d, o)
        });
        return;
    }
    let mut states: Vec<Option<Acc>> = (0..items.len()).map(|_| None).collect();
    team::for_each_chunk_mut(&mut states, 1, |i, s| s[0] = Some(item_state(&items[i])));
    let states: Vec<Acc> = states
        .into_iter()
        .map(|s| s.expect("every item ran"))
        .collect();
    let first: Vec<usize> = (0..=tasks)
        .map(|t| items.partition_point(|it| it.0 < t))
        .collect();
    team::for_each_chunk_mut(out, rows * d, |task, o| {
        reduce(&states[first[task]..first[task + 1]], d, o)
    });
}

/// Paged decode over a float pool: `q`/`out` are `[seqs, q_heads, q_len, head_dim]` in the
/// pool's dtype. The output is poisoned by the caller, never read; unused pool slots and
/// positions before every row's window are never read.
pub fn paged_decode(
    shape: &PagedDecodeShape,
    batch: &PagedBatch,
    pool: &KvPool,
    q: &Buffer,
    out: &mut Buffer,
    split: SplitKv,
) -> Result<()> {
    shape.validate(&pool.layout, batch)?;
    let dt = pool.dtype();
    q.expect("q", dt, shape.q_elems(batch.len()))?;
    out.expect("out", dt, shape.q_elems(batch.len()))?;
    let src = Source::of_pool(pool);
    match (q, out) {
        (Buffer::F32(q), Buffer::F32(o)) => decode_typed(shape, batch, &src, q, o, split, None),
        (Buffer::F16(q), Buffer::F16(o)) => decode_typed(shape, batch, &src, q, o, split, None),
        (Buffer::BF16(q), Buffer::BF16(o)) => decode_typed(shape, batch, &src, q, o, split, None),
        _ => {
            return Err(KernelError::BadBuffer(
                "pool, q and out must share one dtype".into(),
            ))
        }
    }
    Ok(())
}

/// Paged decode over a cache in any format, uniform or mixed, reading each block in its own
/// format (narrow codes dequantised in registers): `q`/`out` are f32
/// `[seqs, q_heads, q_len, head_dim]`. Every block the tables reach must have been written.
pub fn paged_decode_cache(
    shape: &PagedDecodeShape,
    batch: &PagedBatch,
    cache: &KvCache,
    q: &[f32],
    out: &mut [f32],
    split: SplitKv,
) -> Result<()> {
    check_cache_call(shape, batch, cache, q.len(), out.len())?;
    decode_typed(shape, batch, &Source::of_cache(cache), q, out, split, None);
    Ok(())
}

/// A call over `cache` whose tables must reach `reach.context_lens` (written blocks only):
/// the shape against the cache, q and out of the batch's size.
fn check_cache_call(
    shape: &PagedDecodeShape,
    reach: &PagedBatch,
    cache: &KvCache,
    q: usize,
    out: usize,
) -> Result<()> {
    shape.validate(&cache.layout(), reach)?;
    let n = shape.q_elems(reach.len());
    if q != n || out != n {
        return Err(KernelError::BadBuffer(format!(
            "q and out need {n} elements, got {q} and {out}"
        )));
    }
    for (&len, table) in reach.context_lens.iter().zip(&reach.block_tables) {
        cache.check_written(table, len)?;
    }
    Ok(())
}

/// `paged_decode_cache` with the last positions of each sequence read from other slots:
/// `tails[s]` remaps positions `from..context_lens[s]` of sequence s. One query token per
/// sequence (`q_len` 1), so each row is scored exactly as a decode step at that context
/// scores it. Used for the nodes of a draft tree: sequence s is node s, its context the
/// committed tokens plus its path, the path's K/V at the nodes' slots.
pub fn paged_decode_cache_remapped(
    shape: &PagedDecodeShape,
    batch: &PagedBatch,
    tails: &[RemappedTail],
    cache: &KvCache,
    q: &[f32],
    out: &mut [f32],
    split: SplitKv,
) -> Result<()> {
    let bad = |m: String| Err(KernelError::InvalidShape(m));
    if shape.q_len != 1 {
        return bad(format!(
            "a remapped decode takes one query token per sequence, got q_len {}",
            shape.q_len
        ));
    }
    if tails.len() != batch.len() {
        return bad(format!(
            "{} remapped tails for {} sequences",
            tails.len(),
            batch.len()
        ));
    }
    // Every table must reach its furthest slot, which may lie past its context.
    let reach: Vec<usize> = batch
        .context_lens
        .iter()
        .zip(tails)
        .enumerate()
        .map(|(s, (&len, t))| {
            if t.from > len || t.slots.len() != len - t.from {
                return Err(KernelError::InvalidShape(format!(
                    "sequence {s}: {} remapped slots from position {} of a {len}-token context",
                    t.slots.len(),
                    t.from
                )));
            }
            Ok(t.slots.iter().map(|&x| x + 1).fold(len, usize::max))
        })
        .collect::<Result<_>>()?;
    let reach = PagedBatch {
        context_lens: reach,
        block_tables: batch.block_tables.clone(),
    };
    check_cache_call(shape, &reach, cache, q.len(), out.len())?;
    let src = Source::of_cache(cache);
    decode_typed(shape, batch, &src, q, out, split, Some(tails));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_visible_range_is_what_the_window_reaches() {
        let s = PagedDecodeShape {
            q_heads: 8,
            kv_heads: 2,
            head_dim: 64,
            q_len: 1,
            scale: 0.125,
            window: None,
            softcap: None,
        };
        assert_eq!(s.visible_range(4096), 0..4096);
        // Decode at position 4095 with a window of 512: positions 3584..=4095, which start
        // block 224 of 16 tokens — 32 blocks read, not 256.
        let w = s.with_window(Some(512));
        assert_eq!(w.visible_range(4096), 3584..4096);
        assert_eq!(w.visible_range(100), 0..100);
        // Four new tokens at 4092..=4095: the first sees 3581..=4092.
        let four = PagedDecodeShape { q_len: 4, ..w };
        assert_eq!(four.visible_range(4096), 3581..4096);
        assert_eq!(s.with_window(Some(1)).visible_range(10), 9..10);
    }

    #[test]
    fn split_parsing_and_partitions() {
        assert_eq!(SplitKv::parse("off").unwrap(), SplitKv::Off);
        assert_eq!(SplitKv::parse("512").unwrap(), SplitKv::Tokens(512));
        assert!(SplitKv::parse("0").is_err());
        assert!(SplitKv::parse("lots").is_err());
        assert_eq!(SplitKv::Off.partition_tokens(10_000), 10_000);
        assert_eq!(SplitKv::Tokens(100).partition_tokens(10_000), 100);
        assert_eq!(SplitKv::Tokens(100).partition_tokens(7), 7);
        let auto = SplitKv::Auto.partition_tokens(100_000);
        assert!((64..100_000).contains(&auto));
        assert_eq!(SplitKv::Auto.partition_tokens(40), 40);
        assert!((64..=300).contains(&SplitKv::Auto.partition_tokens(300)));
        // By the context alone: at most 4 parts of whole 64-token units, whatever the thread
        // count.
        assert_eq!(SplitKv::parse("ctx").unwrap(), SplitKv::Context);
        assert_eq!(SplitKv::Context.partition_tokens(1907), 512);
        assert_eq!(SplitKv::Context.partition_tokens(300), 128);
        assert_eq!(SplitKv::Context.partition_tokens(256), 64);
        assert_eq!(SplitKv::Context.partition_tokens(257), 128);
        assert_eq!(SplitKv::Context.partition_tokens(200), 64);
        assert_eq!(SplitKv::Context.partition_tokens(40), 40);
        let on_one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| SplitKv::Context.partition_tokens(100_000));
        assert_eq!(on_one, SplitKv::Context.partition_tokens(100_000));
    }
}
