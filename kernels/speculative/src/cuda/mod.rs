//! CUDA tree attention (the draft-tree mask kernel), compiled from `spec.cu` by NVRTC: the
//! same contract as `tree_attention` (f32 pool, queries of some nodes over the context and
//! their own paths, sliding window in positions, soft-cap), with the tree mask uploaded as
//! bytes and the node depths as i32 (a node's position is ctx + depth). Everything the kernel
//! indexes with — the pool against its layout, the block table over ctx + tree nodes, the
//! query nodes, q's length, every `int` argument and position — is checked on the host
//! (`check_tree_attention`) before the device is asked for.

use crate::attention::{check, TreeAttnShape, TreeContext};
use kernel_attention::cuda::device_options;
use kernel_common::error::Result;
use kernel_common::{Buffer, KernelError};
use kernel_cuda::buffer::{f32_bytes, f32_from_bytes, i32_bytes};
use kernel_cuda::cuda_launch;
use kernel_cuda::{blocks_for, int_arg, CudaRuntime, KernelSource, Launch};

/// `spec.cu` with its entry point.
pub const SOURCE: KernelSource =
    kernel_cuda::cuda_source!("spec", "spec.cu", &["tree_attention_f32"]);

/// Most head_dim the kernel takes (4 elements per lane).
pub const MAX_HEAD_DIM: usize = 128;
/// (node, head) tasks per block, one warp each.
const WARPS: usize = 4;

/// The launch for `queries` query nodes. Refuses a task count (queries · q_heads, rounded up
/// to whole blocks: the task index of a block's last warp) past the kernel's `int`.
pub fn plan_tree_attention(shape: &TreeAttnShape, queries: usize) -> Result<Launch> {
    if shape.head_dim == 0 || shape.head_dim > MAX_HEAD_DIM {
        return Err(KernelError::Unsupported(format!(
            "CUDA tree attention takes head_dim 1..={MAX_HEAD_DIM}, got {}",
            shape.head_dim
        )));
    }
    let tasks = queries.saturating_mul(shape.q_heads);
    let blocks = blocks_for(tasks, WARPS);
    int_arg(
        "queries·q_heads rounded up to whole blocks",
        blocks.saturating_mul(WARPS),
    )?;
    Launch::new((blocks, 1, 1), 32 * WARPS, 0)
}

/// What `tree_attention_cuda` uploads and passes, built and checked on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeArgs {
    pub launch: Launch,
    /// The block table's entries the kernel reads (those covering ctx + tree nodes).
    pub table: Vec<i32>,
    pub nodes: Vec<i32>,
    pub depths: Vec<i32>,
    pub mask: Vec<u8>,
    /// queries, tree nodes, context, q_heads, kv_heads, head_dim, block_size.
    pub ints: [i32; 7],
    pub window: i32,
    pub softcap: f32,
}

/// Checks, before anything touches the device, what the kernel indexes with: the call
/// (`attention::check`: the pool against its layout, a block table covering ctx + tree
/// nodes with entries inside the pool, query nodes inside the tree, q's length), an f32
/// pool, the launch, and every `int` — the positions up to ctx + tree nodes included (the
/// kernel walks them in `int`), block ids, node ids, depths.
pub fn check_tree_attention(
    shape: &TreeAttnShape,
    at: &TreeContext,
    q: &[f32],
) -> Result<TreeArgs> {
    check(shape, at, q, q.len())?;
    let launch = plan_tree_attention(shape, at.nodes.len())?;
    let (Buffer::F32(_), Buffer::F32(_)) = (&at.pool.k, &at.pool.v) else {
        return Err(KernelError::Unsupported(
            "CUDA tree attention takes an f32 pool".into(),
        ));
    };
    let l = at.pool.layout;
    let total = at.ctx + at.tree.len();
    int_arg("context + tree nodes (the last position)", total)?;
    let table = at.table[..total.div_ceil(l.block_size)]
        .iter()
        .map(|&b| int_arg("block", b as usize))
        .collect::<Result<_>>()?;
    let nodes = at
        .nodes
        .iter()
        .map(|&n| int_arg("node", n))
        .collect::<Result<_>>()?;
    let (window, softcap) = device_options(shape.window, shape.softcap, total)?;
    Ok(TreeArgs {
        launch,
        table,
        nodes,
        depths: depths(at)?,
        mask: mask_bytes(at),
        ints: [
            int_arg("queries", at.nodes.len())?,
            int_arg("tree nodes", at.tree.len())?,
            int_arg("context", at.ctx)?,
            int_arg("q_heads", shape.q_heads)?,
            int_arg("kv_heads", shape.kv_heads)?,
            int_arg("head_dim", shape.head_dim)?,
            int_arg("block_size", l.block_size)?,
        ],
        window,
        softcap,
    })
}

/// The tree mask as bytes, row-major `[nodes, nodes]`.
pub fn mask_bytes(at: &TreeContext) -> Vec<u8> {
    at.tree.mask().into_iter().map(u8::from).collect()
}

/// Node depths as the kernel takes them (i32, one per tree node).
pub fn depths(at: &TreeContext) -> Result<Vec<i32>> {
    (0..at.tree.len())
        .map(|i| int_arg("depth", at.tree.depth(i)))
        .collect()
}

/// Tree attention on the device; `q` and the result are `[nodes.len(), q_heads, head_dim]`.
pub fn tree_attention_cuda(shape: &TreeAttnShape, at: &TreeContext, q: &[f32]) -> Result<Vec<f32>> {
    let a = check_tree_attention(shape, at, q)?;
    if q.is_empty() {
        return Ok(vec![]); // no query node (or head): nothing to launch
    }
    let (Buffer::F32(k), Buffer::F32(v)) = (&at.pool.k, &at.pool.v) else {
        unreachable!("check_tree_attention holds an f32 pool")
    };
    let rt = CudaRuntime::current()?;
    let f = rt.function(&SOURCE, "tree_attention_f32")?;
    let (qd, kd, vd) = (
        rt.upload(&f32_bytes(q))?,
        rt.upload(&f32_bytes(k))?,
        rt.upload(&f32_bytes(v))?,
    );
    let (td, md, nd, dd) = (
        rt.upload(&i32_bytes(&a.table))?,
        rt.upload(&a.mask)?,
        rt.upload(&i32_bytes(&a.nodes))?,
        rt.upload(&i32_bytes(&a.depths))?,
    );
    let mut out = rt.upload(&f32_bytes(&vec![f32::NAN; q.len()]))?;
    let i = &a.ints;
    cuda_launch!(
        rt,
        f,
        a.launch,
        &qd,
        &kd,
        &vd,
        &td,
        &md,
        &nd,
        &dd,
        &mut out,
        &i[0],
        &i[1],
        &i[2],
        &i[3],
        &i[4],
        &i[5],
        &i[6],
        &shape.scale,
        &a.window,
        &a.softcap
    )?;
    rt.sync()?;
    Ok(f32_from_bytes(&rt.download(&out)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::DraftTree;
    use kernel_paged::{KvPool, PoolLayout};

    #[test]
    fn plan_and_mask() {
        let s = TreeAttnShape {
            q_heads: 9,
            kv_heads: 3,
            head_dim: 64,
            scale: 0.125,
            window: None,
            softcap: None,
        };
        assert_eq!(plan_tree_attention(&s, 10).unwrap().grid.0, 23); // ⌈90 / 4⌉
        let wide = TreeAttnShape { head_dim: 256, ..s };
        assert!(plan_tree_attention(&wide, 1).is_err());
        let tree = DraftTree::chain(2);
        let pool = KvPool::poisoned(
            PoolLayout {
                num_blocks: 1,
                block_size: 4,
                kv_heads: 1,
                head_dim: 4,
            },
            kernel_common::DType::F32,
        )
        .unwrap();
        let at = TreeContext {
            pool: &pool,
            table: &[0],
            ctx: 1,
            tree: &tree,
            nodes: &[0, 1, 2],
        };
        // A chain: each node sees itself and every earlier node.
        assert_eq!(mask_bytes(&at), vec![1, 0, 0, 1, 1, 0, 1, 1, 1]);
    }

    #[test]
    fn bad_indices_and_lengths_are_refused_before_any_launch() {
        // 2 query heads over 1 KV head of 4; 3 blocks of 4 positions; a 3-node chain after a
        // 5-token context: positions 0..8 cover blocks 0 and 1 of the table.
        let s = TreeAttnShape {
            q_heads: 2,
            kv_heads: 1,
            head_dim: 4,
            scale: 0.5,
            window: Some(3),
            softcap: None,
        };
        let layout = PoolLayout {
            num_blocks: 3,
            block_size: 4,
            kv_heads: 1,
            head_dim: 4,
        };
        let pool = KvPool::poisoned(layout, kernel_common::DType::F32).unwrap();
        let tree = DraftTree::chain(2);
        let at = TreeContext {
            pool: &pool,
            table: &[2, 0, 7],
            ctx: 5,
            tree: &tree,
            nodes: &[1, 2],
        };
        let q = vec![0.0f32; 2 * 2 * 4];
        let a = check_tree_attention(&s, &at, &q).unwrap();
        // Only the entries covering ctx + tree nodes travel (entry 7 past them is never read).
        assert_eq!(a.table, vec![2, 0]);
        assert_eq!((a.nodes, a.depths), (vec![1, 2], vec![0, 1, 2]));
        assert_eq!(a.ints, [2, 3, 5, 2, 1, 4, 4]);
        assert_eq!(a.window, 3);
        let refused = |at: &TreeContext, q: &[f32]| {
            let Err(e) = tree_attention_cuda(&s, at, q) else {
                panic!("accepted")
            };
            assert!(!matches!(e, KernelError::Device(_)), "{e}");
            e.to_string()
        };
        let e = refused(
            &TreeContext {
                nodes: &[1, 3],
                ..at
            },
            &q,
        );
        assert!(e.contains("query node 3 is not in a tree of 3"), "{e}");
        let e = refused(
            &TreeContext {
                table: &[2, 3],
                ..at
            },
            &q,
        );
        assert!(
            e.contains("does not cover 8 positions of a 3-block pool"),
            "{e}"
        );
        let e = refused(&TreeContext { table: &[2], ..at }, &q);
        assert!(e.contains("does not cover 8 positions"), "{e}");
        let e = refused(&TreeContext { ctx: 6, ..at }, &q);
        assert!(e.contains("does not cover 9 positions"), "{e}");
        let e = refused(&at, &q[1..]);
        assert!(e.contains("q and out need 16 values"), "{e}");
        let short = KvPool {
            k: Buffer::F32(vec![0.0; 47]),
            ..pool.clone()
        };
        let e = refused(&TreeContext { pool: &short, ..at }, &q);
        assert!(e.contains("pool K has 47 elements"), "{e}");
        let half = KvPool::poisoned(layout, kernel_common::DType::F16).unwrap();
        let e = refused(&TreeContext { pool: &half, ..at }, &q);
        assert!(e.contains("f32 pool"), "{e}");
        // Positions past the kernel's ints: a context of i32::MAX − 1 and 3 tree nodes.
        let ctx = i32::MAX as usize - 1;
        let wide = KvPool::poisoned(
            PoolLayout {
                num_blocks: 1,
                block_size: 256,
                ..layout
            },
            kernel_common::DType::F32,
        )
        .unwrap();
        let table = vec![0u32; (ctx + 3).div_ceil(256)];
        let long = TreeContext {
            pool: &wide,
            table: &table,
            ctx,
            ..at
        };
        let e = refused(&long, &q);
        assert!(
            e.contains("context + tree nodes (the last position)"),
            "{e}"
        );
        // No query: nothing to launch, no device needed.
        assert!(
            tree_attention_cuda(&s, &TreeContext { nodes: &[], ..at }, &[])
                .unwrap()
                .is_empty()
        );
    }
}
