//! The CUDA runtime shared by every kernel family: `.cu` sources as `KernelSource`s (embedded
//! with the prelude by each family's `cuda_source!`), NVRTC compilation (`nvrtc`), ptxas
//! resource reports (`resources`), launch arithmetic (`launch`), the driver probe (`probe`)
//! and the per-process context, module cache and event timing (`runtime`: one warm-up, L2
//! flushed before each repetition unless `Flush::Hot`). Nothing here touches the driver
//! before `probe_cuda` found it. (The CPU emulator and the CI compile check are
//! `kernel-test-support`, used by tests only.)

/// Typed buffers on the device (bytes, NaN-poisoned outputs).
pub mod buffer;
/// Host-side launch arithmetic (grids, shared-memory budgets, int arguments).
pub mod launch;
/// NVRTC compilation to PTX or to a cubin with ptxas' resource report.
pub mod nvrtc;
/// The driver probe: libcuda present, device count, the device's name.
pub mod probe;
/// Parsing ptxas' `-v` report.
pub mod resources;
/// The device's copy bandwidth and tensor-core GEMM rate (`harness roofline --device cuda`).
pub mod roofline;
/// The per-process context, stream, module cache, buffers and event timing (cold: L2
/// flushed before each repetition; or hot).
pub mod runtime;

pub use buffer::DeviceBuffer;
pub use cudarc;
pub use launch::{blocks_for, int_arg, Launch};
pub use probe::{probe_cuda, CudaInfo};
pub use resources::{parse_ptxas_report, KernelResources};
pub use runtime::{flush_bytes, CudaRuntime, Flush};

/// For the macros: `cuda_launch!` names the error type through this path.
#[doc(hidden)]
pub use kernel_common as __common;

/// One `.cu` file of a family: its name, its text and its `extern "C"` entry points.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// The family it belongs to (`attention`, `paged`, ...).
    pub family: &'static str,
    /// File name (`attention.cu`), used as the NVRTC program name and the cache key.
    pub file: &'static str,
    /// The source text.
    pub code: &'static str,
    /// The entry points, `{kernel}_{dtype}`.
    pub entries: &'static [&'static str],
}

/// The dtype suffix of an entry point (`{kernel}_{dtype}`).
pub fn dtype_suffix(dtype: kernel_common::DType) -> &'static str {
    match dtype {
        kernel_common::DType::F32 => "f32",
        kernel_common::DType::F16 => "f16",
        kernel_common::DType::BF16 => "bf16",
    }
}

/// Host element types moved to the device as raw bits: f16/bf16 travel as `u16`.
pub fn f16_bits(x: &[half::f16]) -> Vec<u16> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// The inverse of `f16_bits`.
pub fn f16_from_bits(x: &[u16]) -> Vec<half::f16> {
    x.iter().map(|&b| half::f16::from_bits(b)).collect()
}

/// bf16 as raw bits.
pub fn bf16_bits(x: &[half::bf16]) -> Vec<u16> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// The inverse of `bf16_bits`.
pub fn bf16_from_bits(x: &[u16]) -> Vec<half::bf16> {
    x.iter().map(|&b| half::bf16::from_bits(b)).collect()
}

/// The text every family's `.cu` is compiled with, prepended: storage-type conversions, warp
/// reductions, the m16n8k16 MMA and vector loads.
pub const PRELUDE: &str = include_str!("prelude.cuh");

/// A `KernelSource` for `$file` (relative to the calling crate's `src/cuda/`), with the
/// prelude prepended: `cuda_source!("attention", "attention.cu", &["naive_scores_f32", ...])`.
#[macro_export]
macro_rules! cuda_source {
    ($family:literal, $file:literal, $entries:expr) => {
        $crate::KernelSource {
            family: $family,
            file: $file,
            code: concat!(
                include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../cuda/src/prelude.cuh"
                )),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/cuda/", $file))
            ),
            entries: $entries,
        }
    };
}

/// Launches `$func` on the runtime's stream with the given arguments (each a reference:
/// `&device_buffer.bytes`, `&an_i32`, `&an_f32`); a launch error becomes one line.
#[macro_export]
macro_rules! cuda_launch {
    ($rt:expr, $func:expr, $launch:expr, $($arg:expr),* $(,)?) => {{
        use $crate::cudarc::driver::PushKernelArg;
        let mut builder = $rt.stream.launch_builder(&$func);
        $( builder.arg($arg); )*
        let config = $launch.config();
        // SAFETY: the arguments follow the entry point's signature in its .cu file.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(|e| $crate::__common::KernelError::DeviceFailure(format!("CUDA launch: {e}")))
    }};
}
