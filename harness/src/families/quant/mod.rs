//! The quant family: group quantisation (symmetric/asymmetric 2–8-bit groups, ggml's
//! q8_0/q4_0/q4_1, f16) and the products that read it — fused dequantise-in-register GEMV and
//! tiles per ISA tier, int8 activations (llama.cpp's path), the repacked 16-row tiles, the
//! dequantise-then-GEMM baseline, and the CUDA GEMV.

use crate::family::{listed, ExpFamily, Family, ReplayFamily, VariantInfo};

/// `harness check --family quant`.
pub mod check;
/// The rows of quant experiments.
pub mod cols;
/// `harness exp` for quant specs.
pub mod exp;
/// Peers of quant experiments: PyTorch's `F.linear`, gguf-py's quantisers.
mod peers;
/// `harness replay` of quant case files.
pub mod replay;
/// The tables of a quant run.
pub mod report;

pub const FAMILY: Family = Family {
    name: "quant",
    about: "quantised weights: formats, codecs and the products that read them",
    variants,
    check: Some(check::check),
    exp: Some(ExpFamily {
        grid_keys: GRID_KEYS,
        variant: |v| crate::registry::quant_variant(v).map(|_| ()),
        run: exp::run,
        render: report::render,
        peers: true,
    }),
    cuda: &[kernel_quant::cuda::SOURCE],
    replay: Some(ReplayFamily {
        needs: "x ([rows, cols] f32), optionally q (u8 packed blocks) and out, act and y",
        prepare: replay::prepare,
    }),
};

fn variants() -> Vec<VariantInfo> {
    listed("quant", kernel_quant::VARIANTS)
}

/// Grid keys a quant experiment understands.
pub const GRID_KEYS: &[(&str, &str)] = &[
    (
        "format",
        "f32 | f16 | q8_0 | q4_0 | q4_1 | sym<bits>g<group>[s32] | asym<bits>g<group>[s32]",
    ),
    (
        "shape",
        "ROWSxCOLS of the weight matrix (out × in), e.g. 4096x11008",
    ),
    (
        "weights",
        "gaussian | outliers (8 input channels × 50) | outliers:CHANNELS:SCALE",
    ),
    ("batch", "activation vectors per call (1 = GEMV, decode)"),
];
