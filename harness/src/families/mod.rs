//! The family table: everything the harness knows about a family lives in its folder
//! (`families/<name>/`: its check, its experiment runner and row columns, its tables, its
//! replay preparation), and this file lists one record per family. The commands (`check`,
//! `exp`, `replay`, `render`, `list`) look families up here and never match on a family's name;
//! a family imports only the shared layer (`checking`, `run_files`, `row`, `render`, `spec`,
//! `registry`, `model_source`, `case_job`, ...), never another family.
//! Adding a family: a folder with a `mod.rs` that defines `pub const FAMILY: Family`, and one
//! line in `FAMILIES`.

use crate::error::{HarnessError, Result};
use crate::family::{ExpFamily, Family, ReplayFamily, VariantInfo};

pub mod accuracy;
pub mod attention;
pub mod decode;
pub mod kv;
pub mod kv_alloc;
pub mod kv_precision;
pub mod moe;
pub mod paged;
pub mod quant;
pub mod serving;
pub mod speculative;

/// Every family, in the order `check` runs them and `list` prints them.
pub const FAMILIES: &[Family] = &[
    attention::FAMILY,
    paged::FAMILY,
    quant::FAMILY,
    moe::FAMILY,
    speculative::FAMILY,
    kv::FAMILY,
    kv_alloc::FAMILY,
    kv_precision::FAMILY,
    serving::FAMILY,
    decode::FAMILY,
    accuracy::FAMILY,
];

/// The names of the families that have `what` (for error messages).
fn names(what: impl Fn(&Family) -> bool) -> String {
    FAMILIES
        .iter()
        .filter(|f| what(f))
        .map(|f| f.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The family `name`, if it has a check.
pub fn checked(name: &str) -> Result<&'static Family> {
    FAMILIES
        .iter()
        .find(|f| f.name == name && f.check.is_some())
        .ok_or_else(|| {
            HarnessError::Usage(format!(
                "unknown family '{name}' (known: {})",
                names(|f| f.check.is_some())
            ))
        })
}

/// The experiment side of family `name`.
pub fn experiment(name: &str) -> Result<&'static ExpFamily> {
    FAMILIES
        .iter()
        .find(|f| f.name == name)
        .and_then(|f| f.exp.as_ref())
        .ok_or_else(|| {
            HarnessError::Usage(format!(
                "unknown family '{name}' (known: {})",
                names(|f| f.exp.is_some())
            ))
        })
}

/// The replay side of family `name`, for a case file.
pub fn replayable(name: &str) -> std::result::Result<&'static ReplayFamily, String> {
    FAMILIES
        .iter()
        .find(|f| f.name == name)
        .and_then(|f| f.replay.as_ref())
        .ok_or_else(|| {
            format!(
                "family '{name}' cannot be replayed (replayable: {})",
                names(|f| f.replay.is_some())
            )
        })
}

/// Every family's variants, in table order.
pub fn all_variants() -> Vec<VariantInfo> {
    FAMILIES.iter().flat_map(|f| (f.variants)()).collect()
}

/// Every family's CUDA sources in table order, then the roofline's: what the CI compile
/// check compiles.
pub fn cuda_sources() -> Vec<kernel_cuda::KernelSource> {
    FAMILIES
        .iter()
        .flat_map(|f| f.cuda.iter().copied())
        .chain([kernel_cuda::roofline::SOURCE])
        .collect()
}
