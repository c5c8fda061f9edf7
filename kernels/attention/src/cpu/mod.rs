//! Optimised CPU attention variants (rayon threads, f32 accumulation, AVX2/FMA picked at run
//! time); `mod.rs` only re-exports.

/// FlashAttention-2 tiling with online softmax.
pub mod flash2;
/// Small dense products on f32 tiles and dtype widening (shared with other families; lives in
/// kernel-cpu).
pub use kernel_cpu::gemm;
/// Standard attention with the score matrix materialised per head.
pub mod naive;
/// Logit soft-capping (cap · tanh(s / cap)) with a vectorisable tanh.
pub mod softcap;
