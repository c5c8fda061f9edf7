//! Tree attention against its f64 reference on random trees over a paged pool whose blocks are
//! a shuffled permutation (the context ends mid-block), with sliding windows (in positions:
//! ctx + depth for nodes) and soft-capping on and off, NaN in the context before every
//! window; and against plain attention: a chain tree is causal attention over context +
//! chain, windowed or not.

use kernel_common::inputs::{normal_buffer, rng};
use kernel_common::{Buffer, DType};
use kernel_paged::{KvPool, PoolLayout};
use kernel_speculative::{
    tree_attention, tree_attention_reference, DraftTree, TreeAttnShape, TreeContext,
};
use rand::seq::SliceRandom;
use rand::Rng;

fn pool(blocks: usize, bs: usize, kvh: usize, d: usize, seed: u64) -> KvPool {
    let layout = PoolLayout {
        num_blocks: blocks,
        block_size: bs,
        kv_heads: kvh,
        head_dim: d,
    };
    let mut r = rng(seed);
    let n = blocks * layout.block_elems();
    KvPool {
        layout,
        k: normal_buffer(&mut r, DType::F32, n),
        v: normal_buffer(&mut r, DType::F32, n),
    }
}

#[test]
fn tree_attention_matches_the_reference() {
    let mut r = rng(3);
    for (case, (qh, kvh, d, ctx, bs)) in [(8, 2, 32, 37, 16), (4, 4, 16, 0, 4), (6, 1, 64, 100, 8)]
        .into_iter()
        .enumerate()
    {
        let nodes = 1 + r.gen_range(0..20);
        let parents: Vec<Option<usize>> = (0..nodes)
            .map(|i| (i > 0).then(|| r.gen_range(0..i)))
            .collect();
        let tree = DraftTree::from_parents(&parents).unwrap();
        let need = (ctx + nodes).div_ceil(bs);
        let p = pool(need + 3, bs, kvh, d, case as u64);
        let mut table: Vec<u32> = (0..(need + 3) as u32).collect();
        table.shuffle(&mut r);
        let shape = TreeAttnShape {
            q_heads: qh,
            kv_heads: kvh,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            window: None,
            softcap: None,
        };
        // All nodes, then only the deepest half (the level-by-level case).
        let all: Vec<usize> = (0..nodes).collect();
        let late: Vec<usize> = (nodes / 2..nodes).collect();
        for which in [&all, &late] {
            let q = normal_buffer(&mut r, DType::F32, which.len() * qh * d).to_f32();
            let mut out = vec![f32::NAN; q.len()];
            let at = TreeContext {
                pool: &p,
                table: &table,
                ctx,
                tree: &tree,
                nodes: which,
            };
            tree_attention(&shape, &at, &q, &mut out).unwrap();
            let want = tree_attention_reference(&shape, &at, &q).unwrap();
            let err = out
                .iter()
                .zip(&want)
                .fold(0.0f64, |m, (a, b)| m.max((*a as f64 - b).abs()));
            assert!(err < 1e-5, "case {case}: max |Δ| {err}");
        }
    }
}

/// Poisons K and V of the context positions no query of `nodes` sees under `window`.
fn poison_before_windows(p: &mut KvPool, table: &[u32], ctx: usize, first: usize) {
    let l = p.layout;
    let (mut k, mut v) = (p.k.to_f32(), p.v.to_f32());
    for pos in 0..first.min(ctx) {
        for h in 0..l.kv_heads {
            let at = l.position_offset(table, h, pos);
            k[at..at + l.head_dim].fill(f32::NAN);
            v[at..at + l.head_dim].fill(f32::NAN);
        }
    }
    p.k = Buffer::F32(k);
    p.v = Buffer::F32(v);
}

#[test]
fn windowed_and_capped_tree_attention_matches_the_reference() {
    let mut r = rng(17);
    for case in 0..60 {
        let (qh, kvh) = [(8, 2), (4, 4), (6, 1)][case % 3];
        let d = [16, 64, 33][case % 3];
        let bs = [1, 4, 16][(case / 3) % 3];
        let ctx = r.gen_range(0..120);
        let nodes = 1 + r.gen_range(0..24);
        let parents: Vec<Option<usize>> = (0..nodes)
            .map(|i| (i > 0).then(|| r.gen_range(0..i)))
            .collect();
        let tree = DraftTree::from_parents(&parents).unwrap();
        let height = tree.height();
        let w = [
            1,
            2,
            bs.max(2) - 1,
            bs,
            ctx.max(2) - 1,
            ctx.max(1),
            ctx + 5,
            height + 1,
            height.max(1),
        ][case % 9];
        let cap = [None, Some(50.0), Some(1.0)][(case / 9) % 3];
        let need = (ctx + nodes).div_ceil(bs);
        let mut p = pool(need + 2, bs, kvh, d, case as u64);
        let mut table: Vec<u32> = (0..(need + 2) as u32).collect();
        table.shuffle(&mut r);
        let shape = TreeAttnShape {
            q_heads: qh,
            kv_heads: kvh,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            window: None,
            softcap: None,
        }
        .with_window(Some(w))
        .with_softcap(cap);
        let which: Vec<usize> = if case % 2 == 0 {
            (0..nodes).collect()
        } else {
            (nodes / 2..nodes).collect()
        };
        // The shallowest query reaches back furthest: ctx + depth + 1 − w.
        let shallowest = which.iter().map(|&i| tree.depth(i)).min().unwrap();
        poison_before_windows(
            &mut p,
            &table,
            ctx,
            (ctx + shallowest + 1).saturating_sub(w),
        );
        let q = normal_buffer(&mut r, DType::F32, which.len() * qh * d).to_f32();
        let mut out = vec![f32::NAN; q.len()];
        let at = TreeContext {
            pool: &p,
            table: &table,
            ctx,
            tree: &tree,
            nodes: &which,
        };
        tree_attention(&shape, &at, &q, &mut out).unwrap();
        let want = tree_attention_reference(&shape, &at, &q).unwrap();
        let err = out
            .iter()
            .zip(&want)
            .fold(0.0f64, |m, (a, b)| m.max((*a as f64 - b).abs()));
        assert!(err < 1e-5, "case {case} w {w} cap {cap:?}: max |Δ| {err}");
    }
    // A window of 1: each node sees only itself, so its output is its own V row.
    let tree = DraftTree::static_shape(&[2, 2]).unwrap();
    let p = pool(4, 4, 1, 8, 5);
    let table: Vec<u32> = vec![2, 0, 3, 1];
    let shape = TreeAttnShape {
        q_heads: 2,
        kv_heads: 1,
        head_dim: 8,
        scale: 0.3,
        window: Some(1),
        softcap: None,
    };
    let nodes: Vec<usize> = (0..tree.len()).collect();
    let at = TreeContext {
        pool: &p,
        table: &table,
        ctx: 5,
        tree: &tree,
        nodes: &nodes,
    };
    let q = normal_buffer(&mut r, DType::F32, nodes.len() * 2 * 8).to_f32();
    let mut out = vec![f32::NAN; q.len()];
    tree_attention(&shape, &at, &q, &mut out).unwrap();
    let v = p.v.to_f32();
    for (row, o) in out.chunks(8).enumerate() {
        let at = p.layout.position_offset(&table, 0, 5 + row / 2);
        for (a, b) in o.iter().zip(&v[at..at + 8]) {
            assert!((a - b).abs() < 1e-6, "row {row}");
        }
    }
    for bad in [shape.with_window(Some(0)), shape.with_softcap(Some(-2.0))] {
        assert!(tree_attention(&bad, &at, &q, &mut out).is_err());
    }
}

#[test]
fn a_chain_is_causal_attention() {
    let (qh, kvh, d, ctx, bs, k) = (4, 2, 16, 21, 8, 6);
    let p = pool(8, bs, kvh, d, 9);
    let table: Vec<u32> = (0..8).rev().collect();
    let tree = DraftTree::chain(k);
    let base = TreeAttnShape {
        q_heads: qh,
        kv_heads: kvh,
        head_dim: d,
        scale: 0.25,
        window: None,
        softcap: None,
    };
    let q = normal_buffer(&mut rng(4), DType::F32, (k + 1) * qh * d).to_f32();
    let mut out = vec![0.0f32; q.len()];
    let all: Vec<usize> = (0..=k).collect();
    let ctx_all = TreeContext {
        pool: &p,
        table: &table,
        ctx,
        tree: &tree,
        nodes: &all,
    };
    for (window, softcap) in [
        (None, None),
        (Some(9), None),
        (Some(3), Some(2.0)),
        (Some(1), None),
        (None, Some(50.0)),
    ] {
        let shape = base.with_window(window).with_softcap(softcap);
        tree_attention(&shape, &ctx_all, &q, &mut out).unwrap();
        // Paged decode with q_len = k + 1 is causal over the last k + 1 positions.
        let mut qh_major = vec![0.0f32; q.len()];
        for i in 0..=k {
            for h in 0..qh {
                let (src, dst) = ((i * qh + h) * d, (h * (k + 1) + i) * d);
                qh_major[dst..dst + d].copy_from_slice(&q[src..src + d]);
            }
        }
        let batch = kernel_paged::PagedBatch {
            context_lens: vec![ctx + k + 1],
            block_tables: vec![table.clone()],
        };
        let dshape = kernel_paged::PagedDecodeShape {
            q_heads: qh,
            kv_heads: kvh,
            head_dim: d,
            q_len: k + 1,
            scale: 0.25,
            window,
            softcap,
        };
        let mut dec = Buffer::poisoned(DType::F32, q.len());
        kernel_paged::paged_decode(
            &dshape,
            &batch,
            &p,
            &Buffer::F32(qh_major),
            &mut dec,
            kernel_paged::SplitKv::Off,
        )
        .unwrap();
        let dec = dec.to_f32();
        for i in 0..=k {
            for h in 0..qh {
                for c in 0..d {
                    let a = out[(i * qh + h) * d + c];
                    let b = dec[(h * (k + 1) + i) * d + c];
                    assert!(
                        (a - b).abs() < 1e-5,
                        "node {i} head {h} {window:?} {softcap:?}: {a} vs {b}"
                    );
                }
            }
        }
    }
    let shape = base;
    // Bad input is an error, not a panic.
    let short = TreeContext {
        table: &table[..2],
        ..ctx_all
    };
    assert!(tree_attention(&shape, &short, &q, &mut out).is_err());
    assert!(tree_attention(&shape, &ctx_all, &q[1..], &mut out).is_err());
    let outside = [k + 1];
    let beyond = TreeContext {
        nodes: &outside,
        ..ctx_all
    };
    assert!(tree_attention(&shape, &beyond, &q, &mut out).is_err());
}
