//! The spec CUDA kernel (tree attention over a paged KV cache), run by the CPU emulator
//! (`kernel_test_support::emu`: g++, CUDA threads as coroutines, warp shuffles),
//! against the same f64 references the CPU variants answer to, with launch shapes from the
//! host-side plans and NaN-poisoned outputs, with sliding windows (NaN in the context before
//! every query's window) and soft-capping. No GPU is involved: this checks what the kernels
//! compute before a GPU is lent, not their speed. Skips (with the reason) where g++ is missing.

use kernel_attention::cuda::device_options;
use kernel_common::inputs::{normal_f32, rng};
use kernel_common::{tolerance, Buffer, DType};
use kernel_cuda::buffer::{buffer_bytes, f32_bytes, f32_from_bytes, i32_bytes};
use kernel_paged::{KvPool, PoolLayout};
use kernel_test_support::emu::Arg;
use kernel_test_support::emulated::{assert_close, module};
use kernel_test_support::mutations;
use rand::seq::SliceRandom;

#[test]
fn tree_attention_matches_the_reference() {
    let Some(m) = module(&kernel_speculative::cuda::SOURCE) else {
        return;
    };
    use kernel_speculative::cuda::{depths, mask_bytes, plan_tree_attention};
    use kernel_speculative::{tree_attention_reference, DraftTree, TreeAttnShape, TreeContext};
    let trees = [
        (
            DraftTree::static_shape(&[3, 2, 1]).unwrap(),
            21,
            64,
            4,
            None,
            None,
        ),
        (DraftTree::chain(5), 0, 48, 1, None, None),
        (DraftTree::root(), 9, 128, 16, None, None),
        // Windows: inside the tree (the deepest nodes lose the root), reaching a few
        // context positions, past everything; caps tight and Gemma-2's.
        (DraftTree::chain(6), 30, 64, 4, Some(3), None),
        (
            DraftTree::static_shape(&[3, 2, 1]).unwrap(),
            21,
            64,
            4,
            Some(6),
            Some(1.5),
        ),
        (
            DraftTree::static_shape(&[2, 2]).unwrap(),
            40,
            32,
            8,
            Some(100),
            Some(50.0),
        ),
        (DraftTree::chain(3), 17, 64, 16, None, Some(0.8)),
    ];
    for (ti, (tree, ctx, head_dim, bs, window, softcap)) in trees.iter().enumerate() {
        let (kv_heads, q_heads) = (2, 6);
        let n = tree.len();
        let used = (ctx + n).div_ceil(*bs);
        let layout = PoolLayout {
            num_blocks: used + 1,
            block_size: *bs,
            kv_heads,
            head_dim: *head_dim,
        };
        let mut r = rng(ti as u64);
        let elems = layout.num_blocks * layout.block_elems();
        let mut table: Vec<u32> = (0..layout.num_blocks as u32).collect();
        table.shuffle(&mut r);
        let (mut k, mut v) = (
            normal_f32(&mut r, elems, 1.0),
            normal_f32(&mut r, elems, 1.0),
        );
        // NaN in the context positions no query sees (the root's window reaches furthest).
        let first = window.map_or(0, |w| (ctx + 1).saturating_sub(w));
        for pos in 0..first.min(*ctx) {
            for h in 0..kv_heads {
                let at = layout.position_offset(&table, h, pos);
                k[at..at + head_dim].fill(f32::NAN);
                v[at..at + head_dim].fill(f32::NAN);
            }
        }
        let pool = KvPool {
            layout,
            k: Buffer::F32(k),
            v: Buffer::F32(v),
        };
        let nodes: Vec<usize> = (0..n).rev().collect();
        let shape = TreeAttnShape {
            q_heads,
            kv_heads,
            head_dim: *head_dim,
            scale: 0.2,
            window: *window,
            softcap: *softcap,
        };
        let at = TreeContext {
            pool: &pool,
            table: &table,
            ctx: *ctx,
            tree,
            nodes: &nodes,
        };
        let q = normal_f32(&mut r, n * q_heads * head_dim, 1.0);
        let want = tree_attention_reference(&shape, &at, &q).unwrap();
        let mut out = f32_bytes(&vec![f32::NAN; q.len()]);
        let tb = i32_bytes(&table.iter().map(|&b| b as i32).collect::<Vec<_>>());
        let nb = i32_bytes(&nodes.iter().map(|&x| x as i32).collect::<Vec<_>>());
        let db = i32_bytes(&depths(&at).unwrap());
        let (w, cap) = device_options(*window, *softcap, ctx + n).unwrap();
        let i = |v: usize| Arg::I32(v as i32);
        m.launch(
            "tree_attention_f32",
            plan_tree_attention(&shape, n).unwrap(),
            &mut [
                Arg::In(&f32_bytes(&q)),
                Arg::In(&buffer_bytes(&pool.k)),
                Arg::In(&buffer_bytes(&pool.v)),
                Arg::In(&tb),
                Arg::In(&mask_bytes(&at)),
                Arg::In(&nb),
                Arg::In(&db),
                Arg::Out(&mut out),
                i(n),
                i(n),
                i(*ctx),
                i(q_heads),
                i(kv_heads),
                i(*head_dim),
                i(*bs),
                Arg::F32(0.2),
                Arg::I32(w),
                Arg::F32(cap),
            ],
        )
        .unwrap();
        assert_close(
            &format!("tree {ti}"),
            &f32_from_bytes(&out),
            &want,
            tolerance(DType::F32).scaled_to(&want),
        );
    }
}

#[test]
fn planted_bugs_fail_the_emulated_check() {
    // Planted in spec.cu and run in a child process: the window bound on tree nodes off by
    // one, the soft-cap skipped. (The test passing unmutated is the test.)
    if kernel_test_support::emu::unavailable().is_some() || mutations::switched_on() {
        return;
    }
    let caught = mutations::assert_each_caught("spec.cu", "tree_attention_matches_the_reference");
    assert_eq!(caught.len(), 2);
}
