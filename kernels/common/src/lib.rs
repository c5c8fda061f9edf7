//! Shared pieces of every kernel family: storage dtypes, the one error type, seeded random
//! inputs, minimum-traffic cost accounting, error metrics with the per-dtype tolerance table,
//! SIMD primitives with runtime feature detection, and the device probe.

/// Minimum-traffic byte/FLOP accounting used for GB/s, GFLOP/s and % of roofline.
pub mod cost;
/// NVRTC compilation, ptxas resource reports, launch arithmetic and the CUDA runtime.
pub mod cuda;
/// The CPU/CUDA device enum and the driver probe (cudarc panics without a driver).
pub mod device;
/// Storage dtypes (f32, f16, bf16) and the typed buffer every kernel reads and writes.
pub mod dtype;
/// The one error type of the workbench kernels.
pub mod error;
/// Dense f32 tile products (faer's `gemm` or `matrixmultiply`) and f16/bf16 widening.
pub mod gemm;
/// Seeded random inputs and NaN poisoning.
pub mod inputs;
/// Error metrics against an f64 reference and the per-dtype tolerance table.
pub mod metrics;
/// Row-blocked decode products (q_r·k, o_r += p·v) with explicit AVX2 or portable loops.
pub mod rows;
/// Vectorised f32 primitives (dot, axpy, scale) with AVX2/FMA chosen at run time.
pub mod simd;
/// Variant specs `name:key=value,...` as the CLI and experiment files write them.
pub mod variant;

pub use cost::Cost;
pub use cudarc;
pub use device::{probe_cuda, CudaInfo, Device};
pub use dtype::{Buffer, DType, Element};
pub use error::KernelError;
pub use metrics::{tolerance, ErrorStats, Tolerance};
pub use variant::VariantSpec;
