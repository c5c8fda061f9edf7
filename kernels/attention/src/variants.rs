//! The attention crate's variant table, its one registry: a variant is its implementation
//! file plus one row here (name, device, one line, the constructor from its spec, the specs
//! `harness check` and the conformance suite run it as on a case).

use crate::{cpu, cuda, reference, AttentionKernel};
use kernel_common::error::Result;
use kernel_common::variant_table::{bare, unchecked};
use kernel_common::{KernelError, Variant, VariantSpec};
use rand::{Rng, RngCore};

type Row = Variant<Box<dyn AttentionKernel>>;

/// Every attention variant of this crate, in the order `check` runs them.
pub const VARIANTS: &[Row] = &[
    Variant::cpu(
        "reference",
        "f64 oracle, materialised scores, one query row at a time",
        |s| {
            s.only(&[])?;
            Ok(Box::new(reference::Reference))
        },
        unchecked,
    ),
    Variant::cpu(
        "naive",
        "f32 'standard attention': S=QK^T materialised per head (GEMM), softmax, P·V",
        |s| {
            s.only(&[])?;
            Ok(Box::new(cpu::naive::Naive))
        },
        |_, _| bare(["naive"]),
    ),
    Variant::cpu(
        "flash2",
        "FlashAttention-2: Br×Bc tiles, online softmax, one final 1/l; params br, bc, gemm (mm | faer)",
        flash2,
        flash2_checks,
    ),
    Variant::cuda(
        "cuda_naive",
        "CUDA: scores materialised in f32 (one thread per score), row softmax, P·V; --device cuda",
        |s| {
            s.only(&[])?;
            Ok(Box::new(cuda::CudaAttention {
                algo: cuda::CudaAlgo::Naive,
            }))
        },
        |_, _| bare(["cuda_naive"]),
    ),
    Variant::cuda(
        "cuda_flash2",
        "CUDA FlashAttention-2: 64-row blocks, 64-key tiles, m16n8k16 tensor-core MMAs, f16/bf16, head_dim 64|128; param pipe (0 | 1: cp.async double-buffered K/V, ldmatrix fragments); --device cuda",
        cuda_flash2,
        |_, _| bare(["cuda_flash2", "cuda_flash2:pipe=1"]),
    ),
];

fn flash2(spec: &VariantSpec) -> Result<Box<dyn AttentionKernel>> {
    spec.only(&["br", "bc", "gemm"])?;
    let gemm = spec
        .params
        .get("gemm")
        .map_or(Some(cpu::flash2::DEFAULT_GEMM), |g| {
            cpu::gemm::GemmBackend::parse(g)
        });
    let gemm = gemm.ok_or_else(|| {
        KernelError::Unsupported("flash2: gemm must be mm (matrixmultiply) or faer".into())
    })?;
    Ok(Box::new(cpu::flash2::Flash2::new(
        spec.get("br", cpu::flash2::DEFAULT_BR)?,
        spec.get("bc", cpu::flash2::DEFAULT_BC)?,
        gemm,
    )?))
}

/// The default tiles and one random Br×Bc tiling per case.
fn flash2_checks(_case: usize, r: &mut dyn RngCore) -> Vec<String> {
    vec![
        "flash2".to_string(),
        format!(
            "flash2:br={},bc={}",
            r.gen_range(1..=96),
            r.gen_range(1..=96)
        ),
    ]
}

fn cuda_flash2(spec: &VariantSpec) -> Result<Box<dyn AttentionKernel>> {
    spec.only(&["pipe"])?;
    let algo = match spec.get("pipe", 0usize)? {
        0 => cuda::CudaAlgo::Flash2,
        1 => cuda::CudaAlgo::Flash2Pipelined,
        n => {
            return Err(KernelError::Unsupported(format!(
                "cuda_flash2: pipe must be 0 or 1, got {n}"
            )))
        }
    };
    Ok(Box::new(cuda::CudaAttention { algo }))
}
