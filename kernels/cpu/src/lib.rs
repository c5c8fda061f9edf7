//! CPU primitives every kernel family builds on: the instruction-set layer (`isa`: detect the
//! CPU once, cap it with `--isa` / `WORKBENCH_ISA`, lower it per thread for tests), lane-array
//! f32 primitives (`simd`), row-blocked decode products with AVX-512, AVX2 or portable bodies
//! (`rows`), tile GEMMs through faer's `gemm` or `matrixmultiply` (`gemm`), the row-wise ops of
//! a layer (`ops`), and a persistent spinning thread team for the short parallel regions of a
//! decode step (`team`).

/// Dense f32 tile products (faer's `gemm` or `matrixmultiply`) and f16/bf16 widening.
pub mod gemm;
/// The instruction-set tiers (avx512, avx2, portable): detection, cap, per-thread choice.
pub mod isa;
/// Row-wise ops of a layer and of sampling (RMSNorm, RoPE, SwiGLU, argmax, softmax) per tier.
pub mod ops;
/// Row-blocked decode products (q_r·k, o_r += p·v) with AVX-512, AVX2 or portable loops.
pub mod rows;
/// Vectorised f32 primitives (dot, axpy, scale, max, exp).
pub mod simd;
/// A persistent spinning team for the short parallel regions of a decode step.
pub mod team;

pub use isa::{Isa, IsaError};
