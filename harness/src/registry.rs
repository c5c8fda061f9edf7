//! The variant registry: resolves a variant spec string to a kernel of any crate of the
//! attention family (attention: reference, naive, flash2; paged: paged), to a product variant
//! of the quant family (fused, dequant, faer) or an expert variant of the moe family (grouped,
//! naive), and lists them.

use crate::error::{HarnessError, Result};
use attention_kernels::AttentionKernel;
use kernel_common::{Device, VariantSpec};

/// Families `harness check --family` knows.
pub const FAMILIES: &[&str] = &["attention", "paged", "quant", "moe", "spec"];

/// The kernel for `spec` (`flash2:br=64`, `paged:bs=16,split=auto`, ...).
pub fn attention_kernel(spec: &str) -> Result<Box<dyn AttentionKernel>> {
    let parsed = VariantSpec::parse(spec)?;
    if let Some(k) = attention_kernels::kernel_from_spec(&parsed)? {
        return Ok(k);
    }
    if let Some(k) = paged_kernels::kernel_from_spec(&parsed)? {
        return Ok(k);
    }
    let known: Vec<&str> = all_variants().iter().map(|(_, n, _)| *n).collect();
    Err(HarnessError::Usage(format!(
        "unknown variant '{}' (known: {})",
        parsed.name,
        known.join(", ")
    )))
}

/// The quant-family variant for `spec` (`fused`, `fused:isa=avx2`, `fused:act=q8`, `dequant`), with its
/// canonical name.
pub fn quant_variant(spec: &str) -> Result<(String, quant_kernels::MatVecVariant)> {
    let parsed = VariantSpec::parse(spec)?;
    match quant_kernels::variant_from_spec(&parsed)? {
        Some(v) => Ok((spec.to_string(), v)),
        None => {
            let known: Vec<&str> = quant_kernels::VARIANTS.iter().map(|(n, _)| *n).collect();
            Err(HarnessError::Usage(format!(
                "unknown quant variant '{}' (known: {})",
                parsed.name,
                known.join(", ")
            )))
        }
    }
}

/// The moe-family variant for `spec` (`grouped`, `naive`).
pub fn moe_variant(spec: &str) -> Result<(String, moe_kernels::ExpertVariant)> {
    let parsed = VariantSpec::parse(spec)?;
    match moe_kernels::variant_from_spec(&parsed)? {
        Some(v) => Ok((parsed.name.clone(), v)),
        None => {
            let known: Vec<&str> = moe_kernels::VARIANTS.iter().map(|(n, _)| *n).collect();
            Err(HarnessError::Usage(format!(
                "unknown moe variant '{}' (known: {})",
                parsed.name,
                known.join(", ")
            )))
        }
    }
}

/// (crate, name, description) of every variant.
pub fn all_variants() -> Vec<(&'static str, &'static str, &'static str)> {
    let mut out = vec![];
    for (n, d) in attention_kernels::VARIANTS {
        out.push(("attention", *n, *d));
    }
    for (n, d) in paged_kernels::VARIANTS {
        out.push(("paged", *n, *d));
    }
    for (n, d) in quant_kernels::VARIANTS {
        out.push(("quant", *n, *d));
    }
    for (n, d) in moe_kernels::VARIANTS {
        out.push(("moe", *n, *d));
    }
    for (n, d) in spec_kernels::VARIANTS {
        out.push(("spec", *n, *d));
    }
    out
}

/// Fails with one line when a variant asked for cannot run on `device`: `cuda_*` variants
/// need `--device cuda`, the others run on the CPU.
pub fn require_variant_devices(names: &[String], device: Device) -> Result<()> {
    let cuda = matches!(device, Device::Cuda(_));
    match names.iter().find(|n| n.starts_with("cuda_") != cuda) {
        Some(name) => Err(HarnessError::Usage(format!(
            "variant {name} does not run on {device} (cuda_* variants need --device cuda, the others run on the CPU)"
        ))),
        None => Ok(()),
    }
}
