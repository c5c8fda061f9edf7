//! The paged family: decode over a paged KV pool (vLLM's PagedAttention layout, split-KV with
//! a log-sum-exp reduction as in FlashDecoding) and the append that fills the pool. Its
//! experiments run through the attention family (paged variants implement `AttentionKernel`);
//! here are its own check (every split policy, the append round trip) and replay.

use crate::family::{listed, Family, ReplayFamily, VariantInfo};

/// `harness check --family paged`.
pub mod check;
/// The pool built by the CUDA append kernel (`--device cuda`).
pub mod device_pool;
/// `harness replay` of paged case files.
pub mod replay;

pub const FAMILY: Family = Family {
    name: "paged",
    about: "paged decode over a block pool (split-KV), append into the pool",
    variants,
    check: Some(check::check),
    exp: None,
    cuda: &[kernel_paged::cuda::SOURCE],
    replay: Some(ReplayFamily {
        needs: "q, k_cache, v_cache, block_tables, context_lens and optionally out",
        prepare: replay::prepare,
    }),
};

fn variants() -> Vec<VariantInfo> {
    listed("paged", kernel_paged::VARIANTS)
}
