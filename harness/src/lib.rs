//! The workbench harness as a library: experiment specs, the variant registry, correctness
//! checks, timing, the roofline, result files and reports. `main.rs` is only the CLI.

/// Counting global allocator (peak scratch memory of a call).
pub mod alloc;
/// Case files (safetensors with a family and fixed tensor names) for `harness replay`.
pub mod case_file;
/// `harness check`: every variant against the f64 reference on random and edge cases.
pub mod check;
/// `check --device cuda`: the MoE kernels stage by stage and the device-built paged pool.
pub mod check_cuda;
/// `harness check --family moe`: router and expert variants on random layers and edge cases.
pub mod check_moe;
/// `harness check --family quant`: product variants on random formats and edge cases.
pub mod check_quant;
/// `harness check --family spec`: tree attention vs its f64 reference.
pub mod check_spec;
/// The harness error type (one line, exit 2).
pub mod error;
/// `harness exp`: grid runner streaming rows to CSV.
pub mod exp;
/// `harness exp` for the decode family: decode and prefill against the bandwidth roofline.
pub mod exp_decode;
/// `harness exp` for the kv family: the exact KV-cache calculator.
pub mod exp_kv;
/// `harness exp` for the kv_alloc family: contiguous vs paged allocation, simulated.
pub mod exp_kv_alloc;
/// `harness exp` for the moe family: capacity × skew × k × experts.
pub mod exp_moe;
/// `harness exp` for the quant family: formats × shapes × weights × batch.
pub mod exp_quant;
/// `harness exp` for the serving family: static, dynamic and continuous batching.
pub mod exp_serving;
/// `harness exp` for the spec family: speculative decoding against plain decoding.
pub mod exp_spec;
/// `harness generate`: greedy generation with a GGUF llama checkpoint.
pub mod generate;
/// Host, CPU, git and rustc facts for provenance.
pub mod machine;
/// Warm-up, cache flushing, repetitions and percentiles.
pub mod measure;
/// CSV rows and JSON provenance.
pub mod output;
/// Variant lookup by spec string across the family's crates.
pub mod registry;
/// Markdown tables and SVG plots from a run's CSV.
pub mod render;
/// `harness replay`: captured tensors against every variant.
pub mod replay;
/// Read bandwidth and FMA peak of this machine.
pub mod roofline;
/// Experiment specs (TOML) and grid expansion.
pub mod spec;

use error::{HarnessError, Result};
use kernel_common::Device;

#[global_allocator]
static GLOBAL: alloc::CountingAlloc = alloc::CountingAlloc;

/// How a command prints its result on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Fails with one line unless `device` is usable: the CPU always is; CUDA needs a driver, a
/// device, and at least one variant with a CUDA implementation.
pub fn require_device(
    device: Device,
    mut supports: impl Iterator<Item = kernel_common::error::Result<()>>,
) -> Result<()> {
    if let Device::Cuda(n) = device {
        // Driver, device and NVRTC, each missing one named in one line; opens the context
        // that the CUDA variants use.
        kernel_cuda::CudaRuntime::get(n)?;
        if !supports.any(|s| s.is_ok()) {
            return Err(HarnessError::Usage(format!(
                "{device} is present but no variant asked for has a CUDA implementation yet; use --device cpu"
            )));
        }
    }
    Ok(())
}

/// Every family's CUDA sources, in family order: what the CI compile check compiles.
pub fn cuda_sources() -> Vec<kernel_cuda::KernelSource> {
    vec![
        attention_kernels::cuda::SOURCE,
        paged_kernels::cuda::SOURCE,
        moe_kernels::cuda::SOURCE,
        quant_kernels::cuda::SOURCE,
        spec_kernels::cuda::SOURCE,
        kernel_cuda::roofline::SOURCE,
    ]
}
