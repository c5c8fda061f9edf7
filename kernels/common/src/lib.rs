//! The vocabulary every kernel family shares: storage dtypes, the one error type, seeded random
//! inputs, minimum-traffic cost accounting, error metrics with the per-dtype tolerance table,
//! variant specs and the device enum. (The CPU primitives — ISA tiers, SIMD, row products,
//! GEMMs — are the `kernel-cpu` crate; the CUDA runtime and the driver probe are `kernel-cuda`;
//! the CPU emulator and the compile check used by tests are `kernel-test-support`.)

/// Minimum-traffic byte/FLOP accounting used for GB/s, GFLOP/s and % of roofline.
pub mod cost;
/// The CPU/CUDA device enum.
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
/// A crate's `VARIANTS` table: the one registry of its variants.
pub mod variant_table;

pub use cost::Cost;
pub use device::Device;
pub use dtype::{Buffer, DType, Element};
pub use error::KernelError;
pub use metrics::{tolerance, ErrorStats, Tolerance};
pub use variant::{Runs, VariantInfo, VariantSpec};
pub use variant_table::{build_from, case_free_check_specs, check_specs, CheckSpecs, Variant};
