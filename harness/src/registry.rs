//! The variant registry: resolves a variant spec string (`name:key=value,...`, parsed by
//! `kernel_common::VariantSpec`) to a kernel of the kernel crates — an `AttentionKernel` of the
//! attention or paged crate, a quant `MatVecVariant`, a moe `ExpertVariant` — and answers where
//! a variant runs from the crates' `VARIANTS` tables (each entry names its device).

use crate::error::{HarnessError, Result};
use attention_kernels::AttentionKernel;
use kernel_common::{Device, Runs, VariantInfo, VariantSpec};

/// Every kernel crate's variant table.
fn tables() -> [&'static [VariantInfo]; 5] {
    [
        attention_kernels::VARIANTS,
        paged_kernels::VARIANTS,
        quant_kernels::VARIANTS,
        moe_kernels::VARIANTS,
        spec_kernels::VARIANTS,
    ]
}

/// The names of the variants behind `AttentionKernel` (attention and paged crates).
pub fn attention_variant_names() -> Vec<&'static str> {
    attention_kernels::VARIANTS
        .iter()
        .chain(paged_kernels::VARIANTS)
        .map(|v| v.name)
        .collect()
}

/// The kernel for `spec` (`flash2:br=64`, `paged:bs=16,split=auto`, ...).
pub fn attention_kernel(spec: &str) -> Result<Box<dyn AttentionKernel>> {
    let parsed = VariantSpec::parse(spec)?;
    if let Some(k) = attention_kernels::kernel_from_spec(&parsed)? {
        return Ok(k);
    }
    if let Some(k) = paged_kernels::kernel_from_spec(&parsed)? {
        return Ok(k);
    }
    Err(HarnessError::Usage(format!(
        "unknown variant '{}' (known: {})",
        parsed.name,
        attention_variant_names().join(", ")
    )))
}

/// The quant-family variant for `spec` (`fused`, `fused:isa=avx2`, `fused:act=q8`, `dequant`),
/// with its canonical name.
pub fn quant_variant(spec: &str) -> Result<(String, quant_kernels::MatVecVariant)> {
    let parsed = VariantSpec::parse(spec)?;
    match quant_kernels::variant_from_spec(&parsed)? {
        Some(v) => Ok((spec.to_string(), v)),
        None => Err(unknown("quant", &parsed.name, quant_kernels::VARIANTS)),
    }
}

/// The moe-family expert variant for `spec` (`grouped`, `naive`, `cuda_grouped:dtype=f16`),
/// with its name as given.
pub fn moe_variant(spec: &str) -> Result<(String, moe_kernels::ExpertVariant)> {
    let parsed = VariantSpec::parse(spec)?;
    match moe_kernels::variant_from_spec(&parsed)? {
        Some(v) => Ok((spec.to_string(), v)),
        None => Err(unknown("moe", &parsed.name, moe_kernels::VARIANTS)),
    }
}

fn unknown(family: &str, name: &str, table: &[VariantInfo]) -> HarnessError {
    let known: Vec<&str> = table
        .iter()
        .filter(|v| v.device == Runs::Cpu)
        .map(|v| v.name)
        .collect();
    HarnessError::Usage(format!(
        "unknown {family} variant '{name}' (known: {})",
        known.join(", ")
    ))
}

/// Where variant `name` (a spec; its base name is looked up) runs: its table entry's device,
/// or for a name no table lists, the `cuda_` spelling.
pub fn runs_on(name: &str) -> Runs {
    let base = name.split(':').next().unwrap_or(name);
    tables()
        .iter()
        .flat_map(|t| t.iter())
        .find(|v| v.name == base)
        .map_or(
            if base.starts_with("cuda_") {
                Runs::Cuda
            } else {
                Runs::Cpu
            },
            |v| v.device,
        )
}

/// Fails with one line when a variant asked for cannot run on `device`: the CUDA variants
/// need `--device cuda`, the others run on the CPU.
pub fn require_variant_devices(names: &[String], device: Device) -> Result<()> {
    let want = match device {
        Device::Cuda(_) => Runs::Cuda,
        Device::Cpu => Runs::Cpu,
    };
    match names.iter().find(|n| runs_on(n) != want) {
        Some(name) => Err(HarnessError::Usage(format!(
            "variant {name} does not run on {device} (cuda_* variants need --device cuda, the others run on the CPU)"
        ))),
        None => Ok(()),
    }
}
