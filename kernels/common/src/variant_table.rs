//! A kernel crate's variant table, the one registry of its variants: each row carries the
//! name a spec starts with, where it runs, one line on what it is, the constructor from the
//! parsed `name:key=value` spec, and the specs `harness check` (and the conformance suite)
//! run it as on one case. Nothing else lists a crate's variants: the registry lookups, the
//! check lists and `harness list` all read these rows (llama.cpp's `test-backend-ops` keeps
//! its ops the same way, one table the tests walk).

use crate::error::Result;
use crate::variant::{Runs, VariantInfo, VariantSpec};
use rand::RngCore;

/// The specs `check` runs a variant as on case `case`, drawn from the case's generator.
/// Only the rows of the run's device draw, in table order, so a CPU case's draws do not
/// depend on the CUDA rows.
pub type CheckSpecs = fn(case: usize, draw: &mut dyn RngCore) -> Vec<String>;

/// One row of a `VARIANTS` table; `K` is what the crate's variants are (a boxed kernel, an
/// enum of products, ...).
pub struct Variant<K: 'static> {
    /// The name a spec starts with (`flash2` in `flash2:br=64`).
    pub name: &'static str,
    /// Where it runs (explicit: `cuda_` in a name is a spelling, not the source of truth).
    pub device: Runs,
    /// One line for `harness list`, its parameters included.
    pub about: &'static str,
    /// The variant from its parsed spec; a parameter it does not take is an error.
    pub build: fn(&VariantSpec) -> Result<K>,
    /// The specs `check` runs it as (none: it is the oracle, or checked elsewhere).
    pub checks: CheckSpecs,
}

impl<K: 'static> Variant<K> {
    /// A CPU variant.
    pub const fn cpu(
        name: &'static str,
        about: &'static str,
        build: fn(&VariantSpec) -> Result<K>,
        checks: CheckSpecs,
    ) -> Variant<K> {
        Variant {
            name,
            device: Runs::Cpu,
            about,
            build,
            checks,
        }
    }

    /// A CUDA variant (`--device cuda`): a CPU row's fields on the other device.
    pub const fn cuda(
        name: &'static str,
        about: &'static str,
        build: fn(&VariantSpec) -> Result<K>,
        checks: CheckSpecs,
    ) -> Variant<K> {
        Variant {
            device: Runs::Cuda,
            ..Variant::cpu(name, about, build, checks)
        }
    }

    /// The row as `harness list` shows it.
    pub const fn info(&self) -> VariantInfo {
        VariantInfo {
            name: self.name,
            device: self.device,
            about: self.about,
        }
    }
}

/// `check` runs it as its bare name, once per case.
pub fn bare<const N: usize>(names: [&'static str; N]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// No check specs: the oracle itself, or a variant another family's check covers.
pub fn unchecked(_case: usize, _draw: &mut dyn RngCore) -> Vec<String> {
    vec![]
}

/// The variant of `tables` that `spec` names, built; `None` when no row has its name.
pub fn build_from<K: 'static>(tables: &[&[Variant<K>]], spec: &VariantSpec) -> Result<Option<K>> {
    match tables
        .iter()
        .flat_map(|t| t.iter())
        .find(|v| v.name == spec.name)
    {
        Some(v) => (v.build)(spec).map(Some),
        None => Ok(None),
    }
}

/// The check specs of every row of `tables` that runs on `device`, for case `case`, in
/// table order.
pub fn check_specs<K: 'static>(
    tables: &[&[Variant<K>]],
    device: Runs,
    case: usize,
    draw: &mut dyn RngCore,
) -> Vec<String> {
    tables
        .iter()
        .flat_map(|t| t.iter())
        .filter(|v| v.device == device)
        .flat_map(|v| (v.checks)(case, &mut *draw))
        .collect()
}

/// The check specs of tables whose rows draw no parameters (the same on every case: quant's
/// products at every tier, moe's and speculative's bare names).
pub fn case_free_check_specs<K: 'static>(tables: &[&[Variant<K>]], device: Runs) -> Vec<String> {
    check_specs(tables, device, 0, &mut rand::rngs::mock::StepRng::new(0, 0))
}
