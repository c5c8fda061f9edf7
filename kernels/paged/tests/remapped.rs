//! Remapped paged decode (`paged_decode_cache_remapped`, what scores a draft tree's nodes):
//! a node whose path lies at scattered slots gets the same bits as plain decode of the same
//! keys laid out at their own positions — for random trees, contexts on and off block
//! boundaries, shuffled physical blocks, windows, soft-caps, every split policy, f32 and f16
//! caches, at every ISA tier this machine runs. Bad tails are errors, not panics. And a
//! chain's k rows scored by one multi-token call (`q_len` = k) get the bits of their k decode
//! steps wherever `shared_call_is_exact` says so, which it does for the cases a verification
//! pass meets (no window, or one that reaches position 0; contexts inside one partition unit).

use kernel_common::inputs::{normal_f32, rng};
use kernel_paged::{
    paged_decode_cache, paged_decode_cache_remapped, shared_call_is_exact, KvCache, KvCacheFormat,
    PagedBatch, PagedDecodeShape, PoolLayout, RemappedTail, SplitKv,
};
use rand::seq::SliceRandom;
use rand::Rng;

const KV_HEADS: usize = 2;
const GROUP: usize = 3;

/// Parent of each node of a random tree of `n` nodes (node 0 the root; a parent precedes
/// its child, as in a draft tree).
fn random_tree(r: &mut impl Rng, n: usize) -> Vec<Option<usize>> {
    (0..n).map(|i| (i > 0).then(|| r.gen_range(0..i))).collect()
}

fn path_to(parent: &[Option<usize>], mut i: usize) -> Vec<usize> {
    let mut p = vec![i];
    while let Some(q) = parent[i] {
        p.push(q);
        i = q;
    }
    p.reverse();
    p
}

/// A cache of `format` with the K/V rows `k`, `v` (`[positions, kv_heads · d]`) written at
/// positions 0.. through a shuffled block table of `blocks` blocks.
fn cache_with(layout: PoolLayout, format: &str, table: &[u32], k: &[f32], v: &[f32]) -> KvCache {
    let mut c = KvCache::new(layout, KvCacheFormat::parse(format).unwrap()).unwrap();
    let n = k.len() / (layout.kv_heads * layout.head_dim);
    let positions: Vec<usize> = (0..n).collect();
    c.write(table, &positions, k, v).unwrap();
    c
}

/// A pool of `total` random K/V positions (every KV head, head size `d`) written in `format`
/// through a shuffled block table of blocks of `bs`: its layout, table, K and V rows
/// (`[positions, kv_heads · d]`) and the cache.
fn random_cache(
    r: &mut rand::rngs::StdRng,
    total: usize,
    bs: usize,
    d: usize,
    format: &str,
) -> (PoolLayout, Vec<u32>, Vec<f32>, Vec<f32>, KvCache) {
    let blocks = total.div_ceil(bs) + 2;
    let layout = PoolLayout {
        num_blocks: blocks,
        block_size: bs,
        kv_heads: KV_HEADS,
        head_dim: d,
    };
    let mut table: Vec<u32> = (0..blocks as u32).collect();
    table.shuffle(r);
    let k = normal_f32(r, total * KV_HEADS * d, 1.0);
    let v = normal_f32(r, total * KV_HEADS * d, 1.0);
    let cache = cache_with(layout, format, &table, &k, &v);
    (layout, table, k, v, cache)
}

/// The decode shape of one new token per sequence: GROUP query heads per KV head.
fn one_token(d: usize, window: Option<usize>, softcap: Option<f32>) -> PagedDecodeShape {
    PagedDecodeShape {
        q_heads: KV_HEADS * GROUP,
        kv_heads: KV_HEADS,
        head_dim: d,
        q_len: 1,
        scale: 1.0 / (d as f32).sqrt(),
        window,
        softcap,
    }
}

#[allow(clippy::too_many_arguments)]
fn check(
    seed: u64,
    ctx: usize,
    nodes: usize,
    bs: usize,
    d: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    format: &str,
) {
    let mut r = rng(seed);
    let per = KV_HEADS * d;
    let parent = random_tree(&mut r, nodes);
    // The tree layout: context at 0..ctx, node j at ctx + j.
    let (layout, table, k, v, tree_cache) = random_cache(&mut r, ctx + nodes, bs, d, format);
    let shape = one_token(d, window, softcap);
    let q = normal_f32(&mut r, nodes * shape.q_heads * d, 1.0);
    let paths: Vec<Vec<usize>> = (0..nodes).map(|i| path_to(&parent, i)).collect();
    let batch = PagedBatch {
        context_lens: paths.iter().map(|p| ctx + p.len()).collect(),
        block_tables: vec![table.clone(); nodes],
    };
    let tails: Vec<RemappedTail> = paths
        .iter()
        .map(|p| RemappedTail {
            from: ctx,
            slots: p.iter().map(|&j| ctx + j).collect(),
        })
        .collect();
    let qd = shape.q_heads * d;
    for split in [
        SplitKv::Off,
        SplitKv::Context,
        SplitKv::Tokens(7),
        SplitKv::Auto,
    ] {
        for isa in kernel_cpu::isa::runnable() {
            let got = kernel_cpu::isa::with_isa(isa, || {
                let mut out = vec![f32::NAN; q.len()];
                paged_decode_cache_remapped(
                    &shape,
                    &batch,
                    &tails,
                    &tree_cache,
                    &q,
                    &mut out,
                    split,
                )
                .unwrap();
                out
            })
            .unwrap();
            for (i, path) in paths.iter().enumerate() {
                // The same keys laid out at their own positions: context, then the path.
                let mut lk = k[..ctx * per].to_vec();
                let mut lv = v[..ctx * per].to_vec();
                for &j in path {
                    lk.extend_from_slice(&k[(ctx + j) * per..(ctx + j + 1) * per]);
                    lv.extend_from_slice(&v[(ctx + j) * per..(ctx + j + 1) * per]);
                }
                let linear = cache_with(layout, format, &table, &lk, &lv);
                let one = PagedBatch {
                    context_lens: vec![ctx + path.len()],
                    block_tables: vec![table.clone()],
                };
                let want = kernel_cpu::isa::with_isa(isa, || {
                    let mut out = vec![f32::NAN; qd];
                    paged_decode_cache(
                        &shape,
                        &one,
                        &linear,
                        &q[i * qd..(i + 1) * qd],
                        &mut out,
                        split,
                    )
                    .unwrap();
                    out
                })
                .unwrap();
                let g = &got[i * qd..(i + 1) * qd];
                assert!(g.iter().all(|x| x.is_finite()), "node {i}: not finite");
                assert!(
                    g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "seed {seed} ctx {ctx} bs {bs} d {d} {window:?} {softcap:?} {format} \
                     {split:?} {isa}: node {i} (path {path:?}) differs from decode at its position"
                );
            }
        }
    }
}

/// ctx, nodes, block size, head_dim, window, soft-cap, cache format.
type Case = (
    usize,
    usize,
    usize,
    usize,
    Option<usize>,
    Option<f32>,
    &'static str,
);

#[test]
fn a_node_on_a_remapped_path_gets_the_bits_of_decode_at_its_position() {
    let cases: &[Case] = &[
        (0, 6, 4, 64, None, None, "f32"),
        (15, 9, 16, 64, None, None, "f32"),
        (16, 9, 16, 40, None, Some(30.0), "f32"),
        (300, 12, 16, 64, None, None, "f32"),
        (131, 8, 3, 72, Some(40), None, "f32"),
        (200, 10, 16, 64, Some(5), Some(8.0), "f32"),
        (97, 7, 1, 64, None, None, "f16"),
    ];
    for (seed, &(ctx, nodes, bs, d, window, softcap, format)) in cases.iter().enumerate() {
        check(seed as u64, ctx, nodes, bs, d, window, softcap, format);
    }
}

#[test]
fn bad_tails_are_errors() {
    let layout = PoolLayout {
        num_blocks: 4,
        block_size: 4,
        kv_heads: KV_HEADS,
        head_dim: 8,
    };
    let table: Vec<u32> = vec![0, 1, 2, 3];
    let mut r = rng(7);
    let k = normal_f32(&mut r, 10 * KV_HEADS * 8, 1.0);
    let cache = cache_with(layout, "f32", &table, &k, &k);
    let shape = PagedDecodeShape {
        q_heads: KV_HEADS * GROUP,
        kv_heads: KV_HEADS,
        head_dim: 8,
        q_len: 1,
        scale: 0.3,
        window: None,
        softcap: None,
    };
    let batch = PagedBatch {
        context_lens: vec![8],
        block_tables: vec![table.clone()],
    };
    let q = vec![0.5f32; KV_HEADS * GROUP * 8];
    let run = |shape: &PagedDecodeShape, tails: &[RemappedTail]| {
        let mut out = vec![0.0; q.len()];
        paged_decode_cache_remapped(shape, &batch, tails, &cache, &q, &mut out, SplitKv::Off)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let tail = |from: usize, slots: Vec<usize>| RemappedTail { from, slots };
    assert!(run(&shape, &[]).contains("remapped tails"));
    assert!(run(&shape, &[tail(6, vec![6])]).contains("remapped slots"));
    assert!(run(&shape, &[tail(9, vec![])]).contains("remapped slots"));
    // Slot 40 is past the table.
    assert!(!run(&shape, &[tail(6, vec![6, 40])]).is_empty());
    let two = PagedDecodeShape { q_len: 2, ..shape };
    assert!(run(&two, &[tail(6, vec![6, 7])]).contains("one query token"));
}

/// One call over a chain of `k` new tokens after `start` against each row's own decode step
/// (q_len 1 on its first start + r + 1 positions), for every split and tier; returns how many
/// (split, k) pairs `shared_call_is_exact` accepted (those must match to the bit).
#[allow(clippy::too_many_arguments)]
fn check_shared(
    seed: u64,
    start: usize,
    bs: usize,
    d: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    format: &str,
) -> usize {
    let mut r = rng(seed);
    let kmax = kernel_paged::MAX_Q_LEN;
    let (_, table, _, _, cache) = random_cache(&mut r, start + kmax, bs, d, format);
    let one = one_token(d, window, softcap);
    let qd = one.q_heads * d;
    let mut exact = 0;
    for kk in [2, 3, 5, 8, 13, kmax] {
        let shape = PagedDecodeShape { q_len: kk, ..one };
        let ctx = start + kk;
        // Row r of token t: q laid out [q_heads, k, d] for the call, [q_heads, d] per step.
        let q = normal_f32(&mut r, kk * qd, 1.0);
        let batch = |ctx: usize| PagedBatch {
            context_lens: vec![ctx],
            block_tables: vec![table.clone()],
        };
        for split in [
            SplitKv::Off,
            SplitKv::Context,
            SplitKv::Tokens(7),
            SplitKv::Tokens(64),
            SplitKv::Auto,
        ] {
            if !shared_call_is_exact(&shape, ctx, split) {
                continue;
            }
            exact += 1;
            for isa in kernel_cpu::isa::runnable() {
                let run = |shape: &PagedDecodeShape, ctx: usize, q: &[f32]| {
                    kernel_cpu::isa::with_isa(isa, || {
                        let mut out = vec![f32::NAN; q.len()];
                        paged_decode_cache(shape, &batch(ctx), &cache, q, &mut out, split).unwrap();
                        out
                    })
                    .unwrap()
                };
                let got = run(&shape, ctx, &q);
                for t in 0..kk {
                    let qt: Vec<f32> = (0..one.q_heads)
                        .flat_map(|h| q[(h * kk + t) * d..(h * kk + t + 1) * d].to_vec())
                        .collect();
                    let want = run(&one, start + t + 1, &qt);
                    for h in 0..one.q_heads {
                        let g = &got[(h * kk + t) * d..(h * kk + t + 1) * d];
                        let w = &want[h * d..(h + 1) * d];
                        assert!(
                            g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "seed {seed} start {start} k {kk} bs {bs} d {d} {window:?} \
                             {softcap:?} {format} {split:?} {isa}: token {t} head {h} differs \
                             from its decode step"
                        );
                    }
                }
            }
        }
    }
    exact
}

#[test]
fn a_chains_rows_in_one_call_get_the_bits_of_their_decode_steps() {
    // start, block size, head_dim, window, soft-cap, cache format.
    type ChainCase = (
        usize,
        usize,
        usize,
        Option<usize>,
        Option<f32>,
        &'static str,
    );
    let cases: &[ChainCase] = &[
        (0, 4, 64, None, None, "f32"),
        (1, 16, 64, None, None, "f32"),
        (63, 16, 40, None, Some(30.0), "f32"),
        (64, 3, 64, None, None, "f32"),
        (121, 16, 72, None, None, "f32"),
        (300, 16, 64, None, None, "f32"),
        (700, 16, 64, Some(4096), Some(8.0), "f32"),
        (250, 1, 64, None, None, "f32"),
        (97, 16, 64, None, None, "f16"),
        (40, 16, 64, Some(20), None, "f32"),
    ];
    for (seed, &(start, bs, d, window, softcap, format)) in cases.iter().enumerate() {
        let exact = check_shared(seed as u64, start, bs, d, window, softcap, format);
        // Off and the token counts never depend on the row; a window that cuts the context
        // (the last case) makes every multi-row call inexact.
        let least = if window.is_some_and(|w| w < start) {
            0
        } else {
            18
        };
        assert!(
            exact >= least,
            "start {start}: {exact} exact (split, k) pairs"
        );
    }
    // Where the k contexts straddle a 64-token unit of the context split, the call is
    // refused (300/4 → 128 tokens, 257/4 → 128 but 256/4 → 64).
    let shape = |k: usize| PagedDecodeShape {
        q_heads: 6,
        kv_heads: 2,
        head_dim: 64,
        q_len: k,
        scale: 0.125,
        window: None,
        softcap: None,
    };
    assert!(!shared_call_is_exact(&shape(4), 258, SplitKv::Context));
    assert!(shared_call_is_exact(&shape(4), 300, SplitKv::Context));
    assert!(shared_call_is_exact(&shape(8), 72, SplitKv::Context));
}
