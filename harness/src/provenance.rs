//! Provenance of a run, written beside its CSV as `<run-id>.json` when the run starts and
//! rewritten when it ends: git sha and dirty flag, host, CPU, ISA tier, threads, device, rustc,
//! command line, the grid, the roofline measured at the start, times and status, and the
//! machine's load around the run. A shard of a sweep adds its `sweep` record (which sweep,
//! which shard, every session that worked on it); a merged sweep its `merged` record (every
//! shard's machine, commit and roofline).

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
    /// Files the run read that its numbers depend on (texts, model files), with their
    /// sha256: `text gpl3` → `sha256:…`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub inputs: std::collections::BTreeMap<String, String>,
    /// How busy the machine was: load average at the start and end, other processes' CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<crate::machine_load::LoadRecord>,
    /// Set on a shard of a sweep (`harness exp --shard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<ShardRecord>,
    /// Set on a merged sweep (`harness merge`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged: Option<MergeRecord>,
}

/// What a shard's provenance adds: the sweep it belongs to, what the sweep measures, the
/// grid's points and every session (a start or a `--resume`) that wrote rows into it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShardRecord {
    pub sweep_id: String,
    pub shard: usize,
    pub shards: usize,
    /// Digest of the spec file, the grid, variants, peers, reps, seed, device and `--quick`:
    /// shards of one sweep, and a resumed shard, must agree on it.
    pub definition: String,
    /// Digest of the spec file alone (to say "different specs" rather than "different
    /// sweeps").
    pub spec_digest: String,
    /// Every point key of the grid in the runner's order (this shard's and the others'),
    /// complete once the shard has finished: the merged CSV's row order.
    pub points: Vec<String>,
    /// Points this shard measures.
    pub owned: usize,
    pub sessions: Vec<Session>,
}

/// One process that worked on a shard: where, on which commit, against which roofline.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Session {
    pub host: String,
    /// CPU model and cores (`machine::machine_key`): what "the same machine" means.
    pub machine: String,
    pub cpu_model: String,
    pub isa: String,
    pub isa_detected: String,
    pub threads: usize,
    pub device: String,
    pub git_sha: String,
    pub git_dirty: bool,
    pub roofline: Roofline,
    pub started_at: String,
    pub finished_at: Option<String>,
    /// Points already complete in the CSV when this session started.
    pub points_before: usize,
}

impl Session {
    /// This process, starting now.
    pub fn now(device: &str, roofline: Roofline, points_before: usize) -> Session {
        let (git_sha, git_dirty) = machine::git_state();
        Session {
            host: machine::host(),
            machine: machine::machine_key(),
            cpu_model: machine::cpu_model(),
            isa: machine::isa(),
            isa_detected: machine::isa_detected(),
            threads: rayon::current_num_threads(),
            device: device.into(),
            git_sha,
            git_dirty,
            roofline,
            started_at: machine::now_rfc3339(),
            finished_at: None,
            points_before,
        }
    }

    /// The commit, as mixing is judged (a dirty tree is another commit).
    pub fn commit(&self) -> String {
        format!(
            "{}{}",
            self.git_sha,
            if self.git_dirty { "+dirty" } else { "" }
        )
    }

    /// The machine as mixing is judged: hardware, ISA tier in use, threads and device.
    pub fn machine_kind(&self) -> String {
        format!(
            "{} isa={} threads={} device={}",
            self.machine, self.isa, self.threads, self.device
        )
    }
}

/// What a merged sweep's provenance adds: its shards and whether they were mixed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MergeRecord {
    pub sweep_id: String,
    pub shards: Vec<MergedShard>,
    /// `commits` and/or `machines` when the shards differ there (`--allow-mixed`).
    pub mixed: Vec<String>,
}

/// One shard of a merged sweep.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MergedShard {
    pub shard: usize,
    pub csv: String,
    pub rows: usize,
    pub points: usize,
    pub sessions: Vec<Session>,
}

/// The GPU a `--device cuda` run ran on, as its device roofline (measured on that device at
/// the start of the run) names it: "NVIDIA H200 (132 SMs)". None on the CPU.
pub fn gpu_of(device: &str, roofline: &Roofline) -> Option<String> {
    (device.starts_with("cuda") && roofline.machine.starts_with("cuda-"))
        .then(|| format!("{} ({} SMs)", roofline.cpu_model, roofline.threads))
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
            gpu: gpu_of(device, &roofline),
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
            inputs: Default::default(),
            load: crate::machine_load::at_start(),
            sweep: None,
            merged: None,
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
