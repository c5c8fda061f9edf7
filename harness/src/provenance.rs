//! Provenance of a run, written beside its CSV as `<run-id>.json` when the run starts and
//! rewritten when it ends: git sha and dirty flag, host, CPU, ISA tier, threads, device, rustc,
//! command line, the grid, the roofline measured at the start, times and status.

use crate::error::{HarnessError, Result};
use crate::machine;
use crate::roofline::Roofline;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Provenance of a run, beside its CSV.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Provenance {
    pub run_id: String,
    pub experiment: String,
    pub spec_file: String,
    pub claims: Vec<String>,
    pub status: String,
    pub command_line: String,
    pub git_sha: String,
    pub git_dirty: bool,
    pub host: String,
    pub cpu_model: String,
    pub logical_cores: usize,
    pub threads: usize,
    pub device: String,
    pub gpu: Option<String>,
    /// The CPU kernels' ISA tier in this run (avx512, avx2, portable; `--isa`); a variant
    /// that names its own tier (`fused:isa=avx2`) records it in its row.
    #[serde(default)]
    pub isa: String,
    /// The widest tier this CPU has.
    #[serde(default)]
    pub isa_detected: String,
    pub rustc: String,
    pub quick: bool,
    pub seed: u64,
    pub grid: std::collections::BTreeMap<String, Vec<String>>,
    pub roofline: Roofline,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub rows: usize,
}

impl Provenance {
    /// Provenance for a run starting now.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        run_id: &str,
        experiment: &str,
        spec_file: &Path,
        claims: &[String],
        device: &str,
        quick: bool,
        seed: u64,
        grid: std::collections::BTreeMap<String, Vec<String>>,
        roofline: Roofline,
    ) -> Provenance {
        let (git_sha, git_dirty) = machine::git_state();
        Provenance {
            run_id: run_id.into(),
            experiment: experiment.into(),
            spec_file: spec_file.display().to_string(),
            claims: claims.to_vec(),
            status: "running (if no process is running, it was interrupted)".into(),
            command_line: machine::command_line(),
            git_sha,
            git_dirty,
            host: machine::host(),
            cpu_model: machine::cpu_model(),
            logical_cores: machine::logical_cores(),
            threads: rayon::current_num_threads(),
            device: device.into(),
            gpu: None,
            isa: machine::isa(),
            isa_detected: machine::isa_detected(),
            rustc: machine::rustc().into(),
            quick,
            seed,
            grid,
            roofline,
            started_at: machine::now_rfc3339(),
            finished_at: None,
            rows: 0,
        }
    }

    /// Writes (or rewrites) the JSON file, atomically: a reader or a killed run sees the
    /// previous version or this one.
    pub fn write(&self, path: &Path) -> Result<()> {
        crate::atomic::write(path, serde_json::to_string_pretty(self)? + "\n")
    }

    /// Reads a provenance file.
    pub fn read(path: &Path) -> Result<Provenance> {
        let text = std::fs::read_to_string(path)
            .map_err(HarnessError::io(format!("reading {}", path.display())))?;
        Ok(serde_json::from_str(&text)?)
    }
}
