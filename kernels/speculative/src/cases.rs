//! The speculative family's one case list, shared by `harness check --family speculative`
//! (CPU and CUDA) and the conformance suite: random draft trees (1..=48 nodes, any parents)
//! over random paged contexts, heads, head sizes and block sizes, queries of every node or
//! of the deepest half, a third windowed and a quarter soft-capped; then the edge cases (the
//! root alone, a 16-node chain, a static 4-2-2-1 tree, a window inside a chain, a window
//! with Gemma-2's cap, a tight cap alone).

use crate::DraftTree;
use kernel_common::inputs::rng;
use rand::Rng;

/// One tree-attention case: heads, head size, the pool's block size, the context before the
/// tree, the tree, which nodes query, the window and the cap.
pub struct Case {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub ctx: usize,
    pub tree: DraftTree,
    /// Queries of the deepest half of the nodes only.
    pub late_half: bool,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}

/// `n` random trees and contexts drawn from `seed`, then the edge cases.
pub fn cases(n: usize, seed: u64) -> Vec<Case> {
    let mut r = rng(seed ^ 0x5EC);
    let mut out = vec![];
    for _ in 0..n {
        let kv_heads = [1, 2, 4][r.gen_range(0..3)];
        let nodes = r.gen_range(1..=48);
        let parents: Vec<Option<usize>> = (0..nodes)
            .map(|i| (i > 0).then(|| r.gen_range(0..i)))
            .collect();
        let ctx = r.gen_range(0..=300);
        out.push(Case {
            q_heads: kv_heads * r.gen_range(1..=4),
            kv_heads,
            head_dim: [64, r.gen_range(1..=96)][r.gen_range(0..2)],
            block_size: [1, 4, 16, 32][r.gen_range(0..4)],
            ctx,
            tree: DraftTree::from_parents(&parents).expect("parents precede children"),
            late_half: r.gen_bool(0.3),
            window: r
                .gen_bool(1.0 / 3.0)
                .then(|| [1, 2, r.gen_range(1..=ctx + nodes + 5)][r.gen_range(0..3)]),
            softcap: r
                .gen_bool(0.25)
                .then(|| [50.0, r.gen_range(0.5f32..10.0)][r.gen_range(0..2)]),
        });
    }
    let edge = |tree: DraftTree, ctx: usize| Case {
        q_heads: 8,
        kv_heads: 2,
        head_dim: 64,
        block_size: 16,
        ctx,
        tree,
        late_half: false,
        window: None,
        softcap: None,
    };
    out.push(edge(DraftTree::root(), 0));
    out.push(edge(DraftTree::chain(16), 33));
    out.push(edge(
        DraftTree::static_shape(&[4, 2, 2, 1]).expect("positive branching"),
        17,
    ));
    // A window inside a chain (deep nodes lose the root), one reaching a few context
    // positions with Gemma-2's cap, and a tight cap alone.
    out.push(Case {
        window: Some(5),
        ..edge(DraftTree::chain(16), 40)
    });
    out.push(Case {
        window: Some(9),
        softcap: Some(50.0),
        ..edge(
            DraftTree::static_shape(&[4, 2, 2, 1]).expect("positive branching"),
            17,
        )
    });
    out.push(Case {
        softcap: Some(1.0),
        ..edge(DraftTree::chain(4), 20)
    });
    out
}
