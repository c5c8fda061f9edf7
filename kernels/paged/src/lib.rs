//! Paged attention (vLLM's PagedAttention, Kwon et al. 2023): a KV pool of fixed-size blocks,
//! per-sequence block tables with physical blocks in any order, an append kernel that writes
//! new K/V into the pool, paged decode attention for q_len 1..=MAX_Q_LEN, and split-KV
//! decoding (FlashDecoding: partial results with their log-sum-exp, then a reduction); and
//! a KV cache whose blocks are f32, f16, bf16, FP8 E4M3 or int8, uniformly or progressively
//! (recent tokens wide, aged blocks narrow), read by the same decode kernel.
//!
//! Every decode takes a sliding window and a logit soft-cap (`PagedDecodeShape`, as
//! `kernel_attention::AttentionShape`). Only a sequence's own context is read — with a
//! window, only the positions it reaches: NaN in unused pool slots, or before the window,
//! never reaches an output,
//! a non-finite K or V in the context propagates as in `kernel_attention`; offsets are
//! computed in usize from u32 block ids (and in size_t in `paged.cu`), so pools past 2^32
//! elements address correctly.

/// CUDA paged decode, split-KV reduction and append (`paged.cu`).
pub mod cuda;

/// The paged variants as `AttentionKernel`s, so experiments compare them with contiguous ones.
pub mod adapter;
/// A KV cache in any format: arenas of blocks per format, per-block homes, ageing.
pub mod cache;
/// Seeded random paged problems for tests, checks and benches.
pub mod cases;
/// FP8 E4M3 and int8 element codes with their scales.
pub mod codec;
/// Decode's row products over narrow codes, per ISA tier.
pub mod coded_rows;
/// Paged decode attention: one pass, or split-KV with a log-sum-exp reduction.
pub mod decode;
/// The query side of a decode call and the split-KV policy.
pub mod decode_shape;
/// The formats a KV cache stores (`--kv-cache`) and their bytes per token.
pub mod kv_format;
/// The KV block pool, block tables, the append kernel and the gather used by the reference.
pub mod pool;
/// The f64 reference: gather each sequence to contiguous K/V and run the attention oracle.
pub mod reference;
/// What the decode kernel reads: a block's run of rows in its format.
mod view;

pub use adapter::PagedAttention;
pub use cache::KvCache;
pub use cases::{CacheCase, CacheCaseSpec, PagedCase, PagedCaseSpec};
pub use decode::{
    paged_decode, paged_decode_cache, paged_decode_cache_remapped, shared_call_is_exact,
    PagedDecodeShape, RemappedTail, SplitKv, MAX_Q_LEN,
};
pub use kv_format::{BlockFormat, KvCacheFormat, ScaleScope};
pub use pool::{append, KvPool, PagedBatch, PoolLayout, MAX_BLOCK_SIZE};

use kernel_common::error::Result;
use kernel_common::{Variant, VariantSpec};
use rand::{Rng, RngCore};

type Row = Variant<Box<dyn kernel_attention::AttentionKernel>>;

/// This crate's variant table, its one registry: paged decode behind `AttentionKernel`,
/// on the CPU and on CUDA.
pub const VARIANTS: &[Row] = &[
    Variant::cpu(
        "paged",
        "paged decode over a block pool; params bs (block size 1..=256, default 16), split (off | auto: by the thread count | ctx: by the context length | tokens per partition)",
        build,
        |case, r| checks("paged", case, r),
    ),
    Variant::cuda(
        "cuda_paged",
        "CUDA paged decode (8 lanes per key, 16-byte loads, split-KV + LSE reduction); params bs, split, unroll (1|2 keys per lane group per step), pipe (1: the software-pipelined key loop, one memory latency per step hidden behind the arithmetic); head_dim 64|128; --device cuda",
        build,
        |case, r| checks("cuda_paged", case, r),
    ),
];

/// Builds a paged variant from its spec, or `None` when no row of `VARIANTS` has its name.
pub fn kernel_from_spec(
    spec: &VariantSpec,
) -> Result<Option<Box<dyn kernel_attention::AttentionKernel>>> {
    kernel_common::build_from(&[VARIANTS], spec)
}

/// Block sizes 1, 16 and a random one, then split-KV with a partition size by case.
/// On CUDA also the pipelined key loop, split and not.
fn checks(name: &str, case: usize, r: &mut dyn RngCore) -> Vec<String> {
    let mut v = vec![
        format!("{name}:bs={}", [1, 16, r.gen_range(2..=256)][case % 3]),
        format!(
            "{name}:bs={},split={}",
            [16, 1, 32][case % 3],
            ["auto", "64", "7"][case % 3]
        ),
    ];
    if name == "cuda_paged" {
        v.push(format!(
            "{name}:bs={},split={},pipe=1",
            [16, 3, 1][case % 3],
            ["off", "auto", "13"][case % 3]
        ));
    }
    v
}

fn build(spec: &VariantSpec) -> Result<Box<dyn kernel_attention::AttentionKernel>> {
    let cuda = spec.name == "cuda_paged";
    spec.only(if cuda {
        &["bs", "split", "unroll", "pipe"]
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
        let keys = match spec.get("pipe", 0usize)? {
            0 => cuda::KeyLoop::Plain(unroll),
            1 if unroll == 1 => cuda::KeyLoop::Pipelined,
            1 => {
                return Err(kernel_common::KernelError::Unsupported(
                    "cuda_paged: pipe=1 sets its own keys per step; drop unroll".into(),
                ))
            }
            n => {
                return Err(kernel_common::KernelError::Unsupported(format!(
                    "cuda_paged: pipe must be 0 or 1, got {n}"
                )))
            }
        };
        return Ok(Box::new(cuda::CudaPaged {
            block_size,
            split,
            keys,
        }));
    }
    Ok(Box::new(cpu))
}
