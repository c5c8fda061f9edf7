//! The variant lookups: a variant spec string (`name:key=value,...`, parsed by
//! `kernel_common::VariantSpec`) to a kernel of the kernel crates — an `AttentionKernel` of the
//! attention or paged crate, a quant `MatVecVariant`, a moe `ExpertVariant` — built by the
//! row of the crate's `VARIANTS` table that has its name. The tables are the only registry:
//! nothing here lists a variant, and where a variant runs is its row's `device`.

use crate::error::{HarnessError, Result};
use crate::family::VariantInfo;
use kernel_attention::AttentionKernel;
use kernel_common::{build_from, Device, Runs, Variant, VariantSpec};

/// The tables of the variants behind `AttentionKernel`: the attention and paged crates'.
pub const ATTENTION_TABLES: &[&[Variant<Box<dyn AttentionKernel>>]] =
    &[kernel_attention::VARIANTS, kernel_paged::VARIANTS];

/// The names of the variants behind `AttentionKernel` (attention and paged crates).
pub fn attention_variant_names() -> Vec<&'static str> {
    ATTENTION_TABLES
        .iter()
        .flat_map(|t| t.iter())
        .map(|v| v.name)
        .collect()
}

/// The kernel for `spec` (`flash2:br=64`, `paged:bs=16,split=auto`, ...).
pub fn attention_kernel(spec: &str) -> Result<Box<dyn AttentionKernel>> {
    let parsed = VariantSpec::parse(spec)?;
    build_from(ATTENTION_TABLES, &parsed)?.ok_or_else(|| {
        HarnessError::Usage(format!(
            "unknown variant '{}' (known: {})",
            parsed.name,
            attention_variant_names().join(", ")
        ))
    })
}

/// The quant-family variant for `spec` (`fused`, `fused:isa=avx2`, `fused:act=q8`, `dequant`),
/// with its name as given.
pub fn quant_variant(spec: &str) -> Result<(String, kernel_quant::MatVecVariant)> {
    built("quant", spec, &[kernel_quant::VARIANTS])
}

/// The moe-family expert variant for `spec` (`grouped`, `naive`, `cuda_grouped:dtype=f16`),
/// with its name as given.
pub fn moe_variant(spec: &str) -> Result<(String, kernel_moe::ExpertVariant)> {
    built("moe", spec, &[kernel_moe::VARIANTS])
}

/// `spec` built by the row of `tables` with its name; an unknown name lists the CPU rows.
fn built<K: 'static>(family: &str, spec: &str, tables: &[&[Variant<K>]]) -> Result<(String, K)> {
    let parsed = VariantSpec::parse(spec)?;
    match build_from(tables, &parsed)? {
        Some(v) => Ok((spec.to_string(), v)),
        None => {
            let known: Vec<&str> = tables
                .iter()
                .flat_map(|t| t.iter())
                .filter(|v| v.device == Runs::Cpu)
                .map(|v| v.name)
                .collect();
            Err(HarnessError::Usage(format!(
                "unknown {family} variant '{}' (known: {})",
                parsed.name,
                known.join(", ")
            )))
        }
    }
}

/// The specs `check` runs on case `case` on `device`: every row of `tables` that runs there,
/// in table order, each drawing its parameters from `draw`.
pub fn check_specs<K: 'static>(
    tables: &[&[Variant<K>]],
    device: Device,
    case: usize,
    draw: &mut dyn rand::RngCore,
) -> Vec<String> {
    kernel_common::check_specs(tables, runs(device), case, draw)
}

/// The variants `check` runs of tables whose rows draw no parameters (quant, moe,
/// speculative): every row of `device` as its check specs, each built by its row.
pub fn case_free_variants<K: 'static>(
    family: &str,
    tables: &[&[Variant<K>]],
    device: Device,
) -> Result<Vec<(String, K)>> {
    kernel_common::case_free_check_specs(tables, runs(device))
        .iter()
        .map(|spec| built(family, spec, tables))
        .collect()
}

/// What runs on `device`: CUDA rows on a CUDA device, the others on the CPU.
pub fn runs(device: Device) -> Runs {
    match device {
        Device::Cuda(_) => Runs::Cuda,
        Device::Cpu => Runs::Cpu,
    }
}

/// Where variant `name` (a spec; its base name is looked up) runs, by the row of `known`
/// (a family's variants) with its name; a name no row lists runs on the CPU.
pub fn runs_on(name: &str, known: &[VariantInfo]) -> Runs {
    let base = name.split(':').next().unwrap_or(name);
    match known.iter().find(|v| v.name == base).map(|v| v.device) {
        Some("cuda") => Runs::Cuda,
        _ => Runs::Cpu,
    }
}

/// Fails with one line when a variant asked for cannot run on `device` (by its row among
/// `known`): the CUDA variants need `--device cuda`, the others run on the CPU.
pub fn require_variant_devices(
    names: &[String],
    device: Device,
    known: &[VariantInfo],
) -> Result<()> {
    match names.iter().find(|n| runs_on(n, known) != runs(device)) {
        Some(name) => Err(HarnessError::Usage(format!(
            "variant {name} does not run on {device} (cuda_* variants need --device cuda, the others run on the CPU)"
        ))),
        None => Ok(()),
    }
}
