//! Result files of a run: rows streamed to `results/<exp>/<run-id>.csv` (flushed per row, so
//! a killed run keeps every finished row), and `<run-id>.json` provenance written when the run
//! starts and rewritten when it ends (git sha and dirty flag, host, CPU, threads, device,
//! rustc, command line, roofline, times, status).

use crate::error::{HarnessError, Result};
use crate::machine;
use crate::roofline::Roofline;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};

/// One measured (or skipped) variant at one grid point. Column names are stable.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExpRow {
    pub run_id: String,
    pub experiment: String,
    pub variant: String,
    pub mode: String,
    pub dtype: String,
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// Host threads (rayon); under `--device cuda` the kernels run on the device regardless.
    pub threads: usize,
    pub device: String,
    /// ok | fail (wrong output) | skipped (over a limit) | unsupported | error
    pub status: String,
    pub reps: usize,
    pub median_ms: Option<f64>,
    pub p10_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub gbps: Option<f64>,
    pub gflops: Option<f64>,
    /// Roofline time / measured time, in %.
    pub pct_roofline: Option<f64>,
    /// memory | compute: the side of the ridge point this call's cost model lies on.
    pub bound: String,
    pub bytes: u64,
    pub flops: u64,
    /// Peak heap bytes allocated during one call, MiB (measured by the counting allocator);
    /// empty for CUDA variants, whose workspace is device memory.
    pub scratch_mib: Option<f64>,
    pub prepare_ms: Option<f64>,
    pub max_abs_err: Option<f64>,
    pub rel_l2_err: Option<f64>,
    pub nmse: Option<f64>,
    pub checked_rows: usize,
    pub seed: u64,
    pub note: String,
}

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

    /// Writes (or rewrites) the JSON file.
    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")
            .map_err(HarnessError::io(format!("writing {}", path.display())))
    }

    /// Reads a provenance file.
    pub fn read(path: &Path) -> Result<Provenance> {
        let text = std::fs::read_to_string(path)
            .map_err(HarnessError::io(format!("reading {}", path.display())))?;
        Ok(serde_json::from_str(&text)?)
    }
}

/// A CSV file that flushes after every row.
pub struct RowWriter {
    writer: csv::Writer<File>,
    pub path: PathBuf,
    pub rows: usize,
}

impl RowWriter {
    /// Creates `path` (its folder must exist).
    pub fn create(path: PathBuf) -> Result<RowWriter> {
        let file = File::create(&path)
            .map_err(HarnessError::io(format!("creating {}", path.display())))?;
        Ok(RowWriter {
            writer: csv::Writer::from_writer(file),
            path,
            rows: 0,
        })
    }

    /// Appends one row and flushes it to disk.
    pub fn write<R: Serialize>(&mut self, row: &R) -> Result<()> {
        self.writer.serialize(row)?;
        self.writer
            .flush()
            .map_err(HarnessError::io(format!("writing {}", self.path.display())))?;
        self.rows += 1;
        Ok(())
    }
}

/// Every row of a CSV written by `RowWriter`.
pub fn read_rows<R: DeserializeOwned>(path: &Path) -> Result<Vec<R>> {
    let mut reader = csv::Reader::from_path(path)
        .map_err(|e| HarnessError::Usage(format!("{}: {e}", path.display())))?;
    reader
        .deserialize()
        .map(|r| r.map_err(|e| HarnessError::Usage(format!("{}: {e}", path.display()))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_through_csv() {
        let dir = std::env::temp_dir().join(format!("harness-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.csv");
        let row = ExpRow {
            run_id: "r".into(),
            experiment: "e".into(),
            variant: "paged:bs=16,split=auto".into(),
            mode: "decode".into(),
            dtype: "f32".into(),
            batch: 1,
            q_heads: 2,
            kv_heads: 1,
            q_len: 1,
            kv_len: 9,
            head_dim: 4,
            causal: true,
            threads: 2,
            device: "cpu".into(),
            status: "ok".into(),
            reps: 3,
            median_ms: Some(1.5),
            p10_ms: None,
            p90_ms: Some(2.0),
            gbps: Some(1.0),
            gflops: None,
            pct_roofline: Some(50.0),
            bound: "memory".into(),
            bytes: 10,
            flops: 20,
            scratch_mib: Some(0.0),
            prepare_ms: None,
            max_abs_err: Some(1e-7),
            rel_l2_err: Some(1e-8),
            nmse: Some(1e-16),
            checked_rows: 4,
            seed: 7,
            note: "a, \"quoted\" note".into(),
        };
        let mut w = RowWriter::create(path.clone()).unwrap();
        w.write(&row).unwrap();
        w.write(&row).unwrap();
        let back: Vec<ExpRow> = read_rows(&path).unwrap();
        assert_eq!(back, vec![row.clone(), row]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
