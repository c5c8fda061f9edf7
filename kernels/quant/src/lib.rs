//! Group quantisation of weight matrices and the products that read them: symmetric and
//! asymmetric int2–8 groups (claims C16–C18), ggml's blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
//! IQ4_NL, the K-quants Q2_K..Q6_K and Q8_K, bf16) byte for byte as llama.cpp writes them,
//! and Y = X·Wᵀ fused with dequantisation (GEMV at batch 1, tiled GEMM
//! above) against f32 and f16 weight baselines, with an f64 reference.
//!
//! Non-finite weights are refused when stored (the first one named); a NaN or ±Inf in an
//! activation row makes that row's outputs non-finite in every product, the int8-activation
//! ones included (`act_q8` gives such a chunk a NaN scale).

/// CUDA dequantising GEMV (`quant.cu`).
pub mod cuda;

/// A pass's int8 activations interleaved by block, as the packed tile kernels read them.
pub(crate) mod act_group;
/// The int8 activation of llama.cpp's path (quantise, permute, per-chunk sums).
pub mod act_q8;
/// The AVX-512 and AVX2 loops of `act_q8`'s quantiser (bit-identical to its definition).
pub(crate) mod act_q8_simd;
/// The Q8_K activation of the Q4_K packed product.
pub mod act_q8k;
/// AVX2 (x86-64-v3) in-register decode + dot kernels.
pub mod avx2;
/// AVX-512 in-register decode + dot kernels.
pub mod avx512;
/// The family's one case list: random formats and shapes, then the edge cases.
pub mod cases;
/// The codec formats' products (Q5_0, Q5_1, IQ4_NL, K-quants) at every tier, one source each.
pub mod codec_kernels;
/// The table of the formats with a `Codec` (`with_codec!`).
pub mod codecs;
/// Weight formats and byte layouts.
pub mod format;
/// ggml Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 block codecs and bf16.
pub mod ggml;
/// ggml type ids and names.
pub mod ggml_types;
/// Symmetric/asymmetric b-bit groups and LSB-first bit packing.
pub mod group;
/// ggml IQ4_NL (non-linear 4-bit table) codec.
pub mod iq4nl;
/// ggml K-quant codecs (Q2_K..Q6_K, Q8_K) and the scale searches they share.
pub mod kquants;
/// A weight matrix in some format: quantise, adopt bytes, decode.
pub mod matrix;
/// Fused dequant GEMV/GEMM and the unfused baseline.
pub mod matvec;
/// 16-row interleaved tiles for the int8-activation product (the `packed` variant).
pub mod packed;
/// Where each ggml block's bytes go in a packed tile-block, and back.
pub mod packed_codes;
/// The byte layout of the packed tiles.
pub mod packed_layout;
/// The portable tier's bodies of the packed tiles (SSE2 integer cores on x86-64, plain loops
/// elsewhere).
pub mod packed_portable;
/// The K-quant packed products (Q4_K, Q5_K, Q6_K): Q8_K activations and the dispatch.
pub mod packed_q4k;
/// What the in-register kernels know of a format; header readers; per-format dispatch.
pub mod plan;
/// Plain-loop products: any CPU.
pub mod portable;
/// A weight matrix in the layout of the variant that reads it (rows or packed tiles).
pub mod prepared;
/// The f64 reference product.
pub mod reference;
/// The f64 dequantiser of every ggml block, field by field.
pub mod reference_blocks;
/// The codes + per-16 (a, b) form the new ggml codecs decode through.
pub mod unpack;
/// The variant table: every product's name, device, constructor and check specs.
pub mod variants;
/// Random weights (Gaussian, outlier channels) for checks and experiments.
pub mod weights;

pub use format::{ScaleType, WeightFormat};
pub use ggml_types::ggml_type_name;
pub use kernel_cpu::Isa;
pub use matrix::{QuantError, QuantMatrix};
pub use matvec::{activation_as_seen, matmul, supports, MatVecVariant};
pub use packed::PackedMatrix;
pub use prepared::Prepared;
pub use variants::VARIANTS;
pub use weights::WeightDist;

use kernel_common::{error::Result, VariantSpec};

/// The variant for `spec`, or `None` when no row of `VARIANTS` has its name.
pub fn variant_from_spec(spec: &VariantSpec) -> Result<Option<MatVecVariant>> {
    kernel_common::build_from(&[VARIANTS], spec)
}
