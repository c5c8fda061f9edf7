//! Shared pieces of every kernel family: storage dtypes, the one error type, seeded random
//! inputs, minimum-traffic cost accounting, error metrics with the per-dtype tolerance table,
//! and the device probe. (The CPU primitives — ISA tiers, SIMD, row products, GEMMs — are the
//! `kernel-cpu` crate.)

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
/// Seeded random inputs and NaN poisoning.
pub mod inputs;
/// Error metrics against an f64 reference and the per-dtype tolerance table.
pub mod metrics;
/// Variant specs `name:key=value,...` as the CLI and experiment files write them.
pub mod variant;

pub use cost::Cost;
pub use cudarc;
pub use device::{probe_cuda, CudaInfo, Device};
pub use dtype::{Buffer, DType, Element};
pub use error::KernelError;
pub use metrics::{tolerance, ErrorStats, Tolerance};
pub use variant::{Runs, VariantInfo, VariantSpec};
