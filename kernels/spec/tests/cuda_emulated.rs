//! The spec CUDA kernel (tree attention over a paged KV cache), run by the CPU emulator
//! (`kernel_test_support::emu`: g++, CUDA threads as coroutines, warp shuffles),
//! against the same f64 references the CPU variants answer to, with launch shapes from the
//! host-side plans and NaN-poisoned outputs. No GPU is involved: this checks what the kernels
//! compute before a GPU is lent, not their speed. Skips (with the reason) where g++ is missing.

use kernel_common::inputs::{normal_buffer, normal_f32, rng};
use kernel_common::{tolerance, DType};
use kernel_cuda::buffer::{buffer_bytes, f32_bytes, f32_from_bytes, i32_bytes};
use kernel_test_support::emu::Arg;
use kernel_test_support::emulated::{assert_close, module};
use paged_kernels::{KvPool, PoolLayout};
use rand::seq::SliceRandom;

#[test]
fn tree_attention_matches_the_reference() {
    let Some(m) = module(&spec_kernels::cuda::SOURCE) else {
        return;
    };
    use spec_kernels::cuda::{mask_bytes, plan_tree_attention};
    use spec_kernels::{tree_attention_reference, DraftTree, TreeAttnShape, TreeContext};
    let trees = [
        (DraftTree::static_shape(&[3, 2, 1]).unwrap(), 21, 64, 4),
        (DraftTree::chain(5), 0, 48, 1),
        (DraftTree::root(), 9, 128, 16),
    ];
    for (ti, (tree, ctx, head_dim, bs)) in trees.iter().enumerate() {
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
        let pool = KvPool {
            layout,
            k: normal_buffer(&mut r, DType::F32, elems),
            v: normal_buffer(&mut r, DType::F32, elems),
        };
        let mut table: Vec<u32> = (0..layout.num_blocks as u32).collect();
        table.shuffle(&mut r);
        let nodes: Vec<usize> = (0..n).rev().collect();
        let shape = TreeAttnShape {
            q_heads,
            kv_heads,
            head_dim: *head_dim,
            scale: 0.2,
            window: None,
            softcap: None,
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
                Arg::Out(&mut out),
                i(n),
                i(n),
                i(*ctx),
                i(q_heads),
                i(kv_heads),
                i(*head_dim),
                i(*bs),
                Arg::F32(0.2),
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
