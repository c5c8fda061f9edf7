//! The speculative family's one case list, shared by `harness check --family speculative`
//! (CPU and CUDA) and the conformance suite: random draft trees (1..=48 nodes, any parents)
//! over random paged contexts, heads, head sizes and block sizes, queries of every node or
//! of the deepest half, a third windowed and a quarter soft-capped; then the edge cases (the
//! root alone, a 16-node chain, a static 4-2-2-1 tree, a window inside a chain, a window
//! with Gemma-2's cap, a tight cap alone).

use crate::{DraftTree, TreeAttnShape, TreeContext};
use kernel_attention::shape::window_start;
use kernel_common::inputs::{normal_buffer, normal_f32, rng};
use kernel_common::{Buffer, DType};
use kernel_paged::{KvPool, PoolLayout};
use rand::seq::SliceRandom;
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

/// A case's inputs: the shape, a pool with two spare blocks and NaN in the context positions
/// no query sees (before the shallowest query's window), its shuffled block table, the
/// querying nodes and their queries `[nodes, q_heads, head_dim]`.
pub struct Built {
    pub shape: TreeAttnShape,
    pub pool: KvPool,
    pub table: Vec<u32>,
    pub nodes: Vec<usize>,
    pub q: Vec<f32>,
}

impl Built {
    /// What the kernels read: the pool, its table, the context and the querying nodes.
    pub fn context<'a>(&'a self, case: &'a Case) -> TreeContext<'a> {
        TreeContext {
            pool: &self.pool,
            table: &self.table,
            ctx: case.ctx,
            tree: &case.tree,
            nodes: &self.nodes,
        }
    }
}

impl Case {
    /// The case's seeded inputs (K, V, the table's shuffle, then the queries, from one
    /// generator).
    pub fn build(&self, seed: u64) -> Built {
        let mut r = rng(seed);
        let n = self.tree.len();
        let used = (self.ctx + n).div_ceil(self.block_size);
        let layout = PoolLayout {
            num_blocks: used + 2,
            block_size: self.block_size,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        };
        let elems = layout.num_blocks * layout.block_elems();
        let (mut k, mut v) = (
            normal_f32(&mut r, elems, 1.0),
            normal_f32(&mut r, elems, 1.0),
        );
        let mut table: Vec<u32> = (0..layout.num_blocks as u32).collect();
        table.shuffle(&mut r);
        let nodes: Vec<usize> = if self.late_half {
            (n / 2..n).collect()
        } else {
            (0..n).collect()
        };
        let shallowest = nodes.iter().map(|&i| self.tree.depth(i)).min().unwrap_or(0);
        let first = window_start(self.ctx + shallowest + 1, self.window).min(self.ctx);
        for pos in 0..first {
            for h in 0..self.kv_heads {
                let at = layout.position_offset(&table, h, pos);
                k[at..at + self.head_dim].fill(f32::NAN);
                v[at..at + self.head_dim].fill(f32::NAN);
            }
        }
        let pool = KvPool {
            layout,
            k: Buffer::F32(k),
            v: Buffer::F32(v),
        };
        let shape = TreeAttnShape {
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            window: self.window,
            softcap: self.softcap,
        };
        let q = normal_buffer(
            &mut r,
            DType::F32,
            nodes.len() * self.q_heads * self.head_dim,
        )
        .to_f32();
        Built {
            shape,
            pool,
            table,
            nodes,
            q,
        }
    }
}

/// Small trees the emulator (and a GPU) runs: 2 KV heads, 6 query heads, head dims 32..128,
/// block sizes 1..16; windows inside the tree (the deepest nodes lose the root), reaching a
/// few context positions, past everything; caps tight and Gemma-2's.
pub fn device() -> Vec<Case> {
    let static_tree = |b: &[usize]| DraftTree::static_shape(b).expect("positive branching");
    let case = |tree, ctx, head_dim, block_size, window, softcap| Case {
        q_heads: 6,
        kv_heads: 2,
        head_dim,
        block_size,
        ctx,
        tree,
        late_half: false,
        window,
        softcap,
    };
    vec![
        case(static_tree(&[3, 2, 1]), 21, 64, 4, None, None),
        case(DraftTree::chain(5), 0, 48, 1, None, None),
        case(DraftTree::root(), 9, 128, 16, None, None),
        case(DraftTree::chain(6), 30, 64, 4, Some(3), None),
        case(static_tree(&[3, 2, 1]), 21, 64, 4, Some(6), Some(1.5)),
        case(static_tree(&[2, 2]), 40, 32, 8, Some(100), Some(50.0)),
        case(DraftTree::chain(3), 17, 64, 16, None, Some(0.8)),
    ]
}
