//! Speculative decoding kernels (Leviathan et al. 2023, Chen et al. 2023; trees: SpecInfer,
//! Miao et al. 2024; Medusa; EAGLE-2): the draft tree and what it implies for attention (the
//! mask and the position ids), tree attention over a paged KV cache with its f64 reference,
//! and verification — greedy (longest path matching the target's argmax) and stochastic
//! (multi-candidate recursive rejection sampling, lossless).
//!
//! Tree attention takes a sliding window (in positions: node a sits at ctx + depth(a)) and a
//! logit soft-cap, as `kernel_attention::AttentionShape` defines them. It propagates a
//! non-finite query to its own node and a non-finite context K/V to every node whose window
//! reaches it (each node sees the context and its ancestors within its window, and itself:
//! no row is ever fully masked). Verification on non-finite scores or probabilities ends and names tokens in the
//! vocabulary; which ones is unspecified.

/// CUDA tree attention (`spec.cu`).
pub mod cuda;

/// Tree attention over a paged KV cache, and its f64 reference.
pub mod attention;
/// The family's one case list: random draft trees and contexts, then the edge cases.
pub mod cases;
/// Draft trees: one representation (parent per node), shapes, mask, positions.
pub mod tree;
/// Greedy and lossless stochastic verification.
pub mod verify;

use kernel_common::error::Result;
use kernel_common::variant_table::bare;
use kernel_common::Variant;

/// A tree-attention kernel: the queries of `at.nodes` (`[nodes, q_heads, head_dim]`) to their
/// outputs, in that layout.
pub type TreeKernel = fn(&TreeAttnShape, &TreeContext, &[f32]) -> Result<Vec<f32>>;

/// This crate's variant table, its one registry.
pub const VARIANTS: &[Variant<TreeKernel>] = &[
    Variant::cpu(
        "tree",
        "tree attention: queries of draft-tree nodes over the paged context and their own paths (online softmax); verification is greedy or lossless rejection sampling",
        |s| {
            s.only(&[])?;
            Ok(tree_attention_into_new)
        },
        |_, _| bare(["tree"]),
    ),
    Variant::cuda(
        "cuda_tree",
        "CUDA tree attention: the same queries, paths and online softmax on the device; --device cuda",
        |s| {
            s.only(&[])?;
            Ok(cuda::tree_attention_cuda)
        },
        |_, _| bare(["cuda_tree"]),
    ),
];

/// `tree_attention` into a NaN-poisoned output of its own.
fn tree_attention_into_new(shape: &TreeAttnShape, at: &TreeContext, q: &[f32]) -> Result<Vec<f32>> {
    let mut out = vec![f32::NAN; q.len()];
    tree_attention(shape, at, q, &mut out)?;
    Ok(out)
}

pub use attention::{tree_attention, tree_attention_reference, TreeAttnShape, TreeContext};
pub use tree::{DraftTree, TreeShape};
pub use verify::{verify_greedy, verify_stochastic, Proposal, Verdict};
