//! Tree attention against its f64 reference on random trees over a paged pool whose blocks are
//! a shuffled permutation (the context ends mid-block), and against plain attention: a chain
//! tree is causal attention over context + chain.

use kernel_common::inputs::{normal_buffer, rng};
use kernel_common::{Buffer, DType};
use paged_kernels::{KvPool, PoolLayout};
use rand::seq::SliceRandom;
use rand::Rng;
use spec_kernels::{
    tree_attention, tree_attention_reference, DraftTree, TreeAttnShape, TreeContext,
};

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

#[test]
fn a_chain_is_causal_attention() {
    let (qh, kvh, d, ctx, bs, k) = (4, 2, 16, 21, 8, 6);
    let p = pool(8, bs, kvh, d, 9);
    let table: Vec<u32> = (0..8).rev().collect();
    let tree = DraftTree::chain(k);
    let shape = TreeAttnShape {
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
    tree_attention(&shape, &ctx_all, &q, &mut out).unwrap();
    // Paged decode with q_len = k + 1 is causal over the last k + 1 positions.
    let mut qh_major = vec![0.0f32; q.len()];
    for i in 0..=k {
        for h in 0..qh {
            let (src, dst) = ((i * qh + h) * d, (h * (k + 1) + i) * d);
            qh_major[dst..dst + d].copy_from_slice(&q[src..src + d]);
        }
    }
    let batch = paged_kernels::PagedBatch {
        context_lens: vec![ctx + k + 1],
        block_tables: vec![table.clone()],
    };
    let dshape = paged_kernels::PagedDecodeShape {
        q_heads: qh,
        kv_heads: kvh,
        head_dim: d,
        q_len: k + 1,
        scale: 0.25,
        window: None,
        softcap: None,
    };
    let mut dec = Buffer::poisoned(DType::F32, q.len());
    paged_kernels::paged_decode(
        &dshape,
        &batch,
        &p,
        &Buffer::F32(qh_major),
        &mut dec,
        paged_kernels::SplitKv::Off,
    )
    .unwrap();
    let dec = dec.to_f32();
    for i in 0..=k {
        for h in 0..qh {
            for c in 0..d {
                let a = out[(i * qh + h) * d + c];
                let b = dec[(h * (k + 1) + i) * d + c];
                assert!((a - b).abs() < 1e-5, "node {i} head {h}: {a} vs {b}");
            }
        }
    }
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
