//! Paged attention (vLLM's PagedAttention, Kwon et al. 2023): a KV pool of fixed-size blocks,
//! per-sequence block tables with physical blocks in any order, an append kernel that writes
//! new K/V into the pool, paged decode attention for q_len 1..=MAX_Q_LEN, and split-KV
//! decoding (FlashDecoding: partial results with their log-sum-exp, then a reduction).
//!
//! Only a sequence's own context is read: NaN in unused pool slots never reaches an output,
//! a non-finite K or V in the context propagates as in `attention_kernels`; offsets are
//! computed in usize from u32 block ids (and in size_t in `paged.cu`), so pools past 2^32
//! elements address correctly.

/// CUDA paged decode, split-KV reduction and append (`paged.cu`).
pub mod cuda;

/// The paged variants as `AttentionKernel`s, so experiments compare them with contiguous ones.
pub mod adapter;
/// Seeded random paged problems for tests, checks and benches.
pub mod cases;
/// Paged decode attention: one pass, or split-KV with a log-sum-exp reduction.
pub mod decode;
/// The KV block pool, block tables, the append kernel and the gather used by the reference.
pub mod pool;
/// The f64 reference: gather each sequence to contiguous K/V and run the attention oracle.
pub mod reference;

pub use adapter::PagedAttention;
pub use cases::{PagedCase, PagedCaseSpec};
pub use decode::{paged_decode, PagedDecodeShape, SplitKv, MAX_Q_LEN};
pub use pool::{append, KvPool, PagedBatch, PoolLayout, MAX_BLOCK_SIZE};

use kernel_common::error::Result;
use kernel_common::VariantInfo;
use kernel_common::VariantSpec;

/// Names and one-line descriptions of this crate's variants, for `harness list`.
pub const VARIANTS: &[VariantInfo] = &[
    VariantInfo::cpu(
        "paged",
        "paged decode over a block pool; params bs (block size 1..=256, default 16), split (off | auto | tokens per partition)",
    ),
    VariantInfo::cuda(
        "cuda_paged",
        "CUDA paged decode (8 lanes per key, 16-byte loads, split-KV + LSE reduction); params bs, split, unroll (1|2 keys per lane group per step); head_dim 64|128; --device cuda",
    ),
];

/// Builds a paged variant from its spec, or `None` when the name is not ours.
pub fn kernel_from_spec(
    spec: &VariantSpec,
) -> Result<Option<Box<dyn attention_kernels::AttentionKernel>>> {
    if spec.name != "paged" && spec.name != "cuda_paged" {
        return Ok(None);
    }
    let cuda = spec.name == "cuda_paged";
    spec.only(if cuda {
        &["bs", "split", "unroll"]
    } else {
        &["bs", "split"]
    })?;
    let block_size = spec.get("bs", 16usize)?;
    let split = SplitKv::parse(spec.params.get("split").map_or("off", String::as_str))?;
    let cpu = PagedAttention::new(block_size, split)?;
    if cuda {
        let unroll = spec.get("unroll", 1usize)?;
        if unroll != 1 && unroll != 2 {
            return Err(kernel_common::KernelError::Unsupported(format!(
                "cuda_paged: unroll must be 1 or 2, got {unroll}"
            )));
        }
        return Ok(Some(Box::new(cuda::CudaPaged {
            block_size,
            split,
            unroll,
        })));
    }
    Ok(Some(Box::new(cpu)))
}
