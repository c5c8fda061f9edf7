//! CUDA tree attention (the draft-tree mask kernel), compiled from `spec.cu` by NVRTC: the
//! same contract as `tree_attention` (f32 pool, queries of some nodes over the context and
//! their own paths, sliding window in positions, soft-cap), with the tree mask uploaded as
//! bytes and the node depths as i32 (a node's position is ctx + depth).

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

/// The launch for `queries` query nodes.
pub fn plan_tree_attention(shape: &TreeAttnShape, queries: usize) -> Result<Launch> {
    if shape.head_dim == 0 || shape.head_dim > MAX_HEAD_DIM {
        return Err(KernelError::Unsupported(format!(
            "CUDA tree attention takes head_dim 1..={MAX_HEAD_DIM}, got {}",
            shape.head_dim
        )));
    }
    Launch::new(
        (blocks_for(queries * shape.q_heads, WARPS), 1, 1),
        32 * WARPS,
        0,
    )
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
    check(shape, at, q, q.len())?;
    let launch = plan_tree_attention(shape, at.nodes.len())?;
    let (Buffer::F32(k), Buffer::F32(v)) = (&at.pool.k, &at.pool.v) else {
        return Err(KernelError::Unsupported(
            "CUDA tree attention takes an f32 pool".into(),
        ));
    };
    let rt = CudaRuntime::current()?;
    let f = rt.function(&SOURCE, "tree_attention_f32")?;
    let table: Vec<i32> = at
        .table
        .iter()
        .map(|&b| int_arg("block", b as usize))
        .collect::<Result<_>>()?;
    let nodes: Vec<i32> = at
        .nodes
        .iter()
        .map(|&n| int_arg("node", n))
        .collect::<Result<_>>()?;
    let (qd, kd, vd) = (
        rt.upload(&f32_bytes(q))?,
        rt.upload(&f32_bytes(k))?,
        rt.upload(&f32_bytes(v))?,
    );
    let (td, md, nd, dd) = (
        rt.upload(&i32_bytes(&table))?,
        rt.upload(&mask_bytes(at))?,
        rt.upload(&i32_bytes(&nodes))?,
        rt.upload(&i32_bytes(&depths(at)?))?,
    );
    let (window, softcap) = device_options(shape.window, shape.softcap, at.ctx + at.tree.len())?;
    let mut out = rt.upload(&f32_bytes(&vec![f32::NAN; q.len()]))?;
    let l = at.pool.layout;
    let args = [
        int_arg("queries", at.nodes.len())?,
        int_arg("tree nodes", at.tree.len())?,
        int_arg("context", at.ctx)?,
        int_arg("q_heads", shape.q_heads)?,
        int_arg("kv_heads", shape.kv_heads)?,
        int_arg("head_dim", shape.head_dim)?,
        int_arg("block_size", l.block_size)?,
    ];
    cuda_launch!(
        rt,
        f,
        launch,
        &qd,
        &kd,
        &vd,
        &td,
        &md,
        &nd,
        &dd,
        &mut out,
        &args[0],
        &args[1],
        &args[2],
        &args[3],
        &args[4],
        &args[5],
        &args[6],
        &shape.scale,
        &window,
        &softcap
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
}
