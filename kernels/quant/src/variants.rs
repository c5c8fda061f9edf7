//! The quant crate's variant table, its one registry: a product is its kernels plus one row
//! here (name, device, one line, the constructor from its spec, the specs `harness check`
//! and the conformance suite run it as — the fused and packed products at every ISA tier
//! this run allows).

use crate::MatVecVariant;
use kernel_common::error::Result;
use kernel_common::variant_table::bare;
use kernel_common::{KernelError, Variant, VariantSpec};
use kernel_cpu::Isa;

/// Every product variant, in the order `check` runs them.
pub const VARIANTS: &[Variant<MatVecVariant>] = &[
    Variant::cpu(
        "fused",
        "dequantise on the fly: in-register GEMV at batch 1, register tiles (rows × 4 activations) above, block decode for widths without a kernel; params isa (auto | avx512 | avx2 | portable: the tier, auto = the run's), act (f32 | q8: int8 activations and integer dot products, llama.cpp's path: VNNI on avx512, maddubs on avx2; for q5_0/q5_1/iq4_nl/K-quants Q8_0/Q8_1/Q8_K activations and pmaddwd)",
        fused,
        |_, _| {
            kernel_cpu::isa::runnable()
                .into_iter()
                .flat_map(|isa| [format!("fused:isa={isa}"), format!("fused:act=q8,isa={isa}")])
                .collect()
        },
    ),
    Variant::cpu(
        "packed",
        "int8 activations on 16-row interleaved tiles built at load (llama.cpp's repacked layout; VNNI vpdpbusd on avx512, maddubs on avx2): q4_0, q4_1, q5_0, q8_0, q4_k, q6_k; param isa (auto | avx512 | avx2 | portable)",
        |s| {
            s.only(&["isa"])?;
            Ok(MatVecVariant::Packed(isa(s, "packed")?))
        },
        // Packed per call in `check` (untimed); experiments and models pack once.
        |_, _| {
            kernel_cpu::isa::runnable()
                .into_iter()
                .map(|isa| format!("packed:isa={isa}"))
                .collect()
        },
    ),
    Variant::cpu(
        "dequant",
        "unfused baseline: dequantise all of W to f32 every call, then the f32 product",
        |s| {
            s.only(&[])?;
            Ok(MatVecVariant::Dequant)
        },
        |_, _| bare(["dequant"]),
    ),
    Variant::cpu(
        "faer",
        "library baseline, f32 weights only: one whole-matrix faer GEMM (its packing, rayon threads)",
        |s| {
            s.only(&[])?;
            Ok(MatVecVariant::Faer)
        },
        |_, _| bare(["faer"]),
    ),
    Variant::cuda(
        "cuda_gemv",
        "CUDA dequantising GEMV (one warp per output row, decode in registers): f16, sym4g32, q4_0, q8_0; batch ≤ 8; --device cuda",
        |s| {
            s.only(&[])?;
            Ok(MatVecVariant::Cuda)
        },
        |_, _| bare(["cuda_gemv"]),
    ),
];

/// The tier a spec pins (`isa=avx2`), or `None` for `auto` (the run's).
fn isa(spec: &VariantSpec, name: &str) -> Result<Option<Isa>> {
    match spec.params.get("isa").map_or("auto", String::as_str) {
        "auto" => Ok(None),
        tier => Isa::parse(tier)
            .map(Some)
            .map_err(|e| KernelError::Unsupported(format!("{name}: {e} (or auto)"))),
    }
}

fn fused(spec: &VariantSpec) -> Result<MatVecVariant> {
    spec.only(&["isa", "act"])?;
    let isa = isa(spec, "fused")?;
    match spec.params.get("act").map_or("f32", String::as_str) {
        "f32" => Ok(MatVecVariant::Fused(isa)),
        "q8" => Ok(MatVecVariant::FusedQ8(isa)),
        other => Err(KernelError::Unsupported(format!(
            "fused: act must be f32 or q8, got '{other}'"
        ))),
    }
}
