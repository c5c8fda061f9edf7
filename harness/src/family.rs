//! What a family is, to the harness: the `Family` record each `families/<name>/mod.rs`
//! defines (`pub const FAMILY`) and the table in `families/mod.rs` lists, with the parts a
//! family may have — a check, experiments, replay — and the `VariantInfo` that `harness list`
//! prints. Shared layer: families import it; it imports no family.

use crate::case_file::CaseFile;
use crate::case_job::Prepared;
use crate::checking::Ctx;
use crate::error::Result;
use crate::render::RenderFn;
use crate::run_files::ExpRequest;

/// One family's record.
pub struct Family {
    /// The name `--family`, a spec's `family` and a case file's `family` use.
    pub name: &'static str,
    /// One line for `harness list`.
    pub about: &'static str,
    /// Its variants, as `harness list` shows them.
    pub variants: fn() -> Vec<VariantInfo>,
    /// `harness check --family NAME`: records rows through the context.
    pub check: Option<fn(&mut Ctx) -> Result<()>>,
    /// `harness exp` for specs with `family = NAME`.
    pub exp: Option<ExpFamily>,
    /// `harness replay` of case files with `family = NAME`.
    pub replay: Option<ReplayFamily>,
    /// Its CUDA sources (each `.cu` with the prelude), what the CI compile check compiles and
    /// the fake driver serves; empty for a family with no CUDA code.
    pub cuda: &'static [kernel_cuda::KernelSource],
}

/// A family's experiments: the grid keys a spec may set, which variant names it takes, the
/// runner, and the report of a run.
pub struct ExpFamily {
    /// (key, meaning) of every grid key.
    pub grid_keys: &'static [(&'static str, &'static str)],
    /// Fails with one line unless the name is a variant these experiments run.
    pub variant: fn(&str) -> Result<()>,
    /// Runs the experiment; the exit code (1 when a row is wrong).
    pub run: fn(&ExpRequest) -> Result<i32>,
    /// Tables and plots of a run from its CSV.
    pub render: RenderFn,
    /// Whether its runner times peers (`peers = [...]`, `--peer`).
    pub peers: bool,
}

/// A family's case files: the tensors it needs (for errors) and the jobs of one file.
pub struct ReplayFamily {
    pub needs: &'static str,
    pub prepare: fn(&CaseFile, &[String]) -> Result<Prepared>,
}

/// A variant as `harness list` shows it: its name, where it runs and what it is.
#[derive(Debug, Clone)]
pub struct VariantInfo {
    pub family: &'static str,
    pub name: &'static str,
    /// cpu or cuda (explicit: `cuda_` in a name is a spelling, not the source of truth).
    pub device: &'static str,
    pub about: &'static str,
}

/// A row of a variant table: a kernel crate's `Variant` (with its constructor) or the plain
/// `VariantInfo` of a family whose experiments run fixed named variants.
pub trait TableRow {
    fn row(&self) -> kernel_common::VariantInfo;
}

impl TableRow for kernel_common::VariantInfo {
    fn row(&self) -> kernel_common::VariantInfo {
        *self
    }
}

impl<K: 'static> TableRow for kernel_common::Variant<K> {
    fn row(&self) -> kernel_common::VariantInfo {
        self.info()
    }
}

/// The rows of a variant table as this family's list.
pub fn listed<R: TableRow>(family: &'static str, table: &[R]) -> Vec<VariantInfo> {
    table
        .iter()
        .map(|r| {
            let v = r.row();
            VariantInfo {
                family,
                name: v.name,
                device: v.device.as_str(),
                about: v.about,
            }
        })
        .collect()
}

/// Fails with one line unless `name` is one of `table`'s variants: the check of a family whose
/// experiments run fixed named variants (an allocator, the engine, the driver).
pub fn one_of<R: TableRow>(family: &str, table: &[R], name: &str) -> Result<()> {
    if table.iter().any(|v| v.row().name == name) {
        return Ok(());
    }
    let known: Vec<&str> = table.iter().map(|v| v.row().name).collect();
    Err(crate::error::HarnessError::Usage(format!(
        "'{name}' is not a variant of a {family} experiment (it has: {})",
        known.join(", ")
    )))
}
