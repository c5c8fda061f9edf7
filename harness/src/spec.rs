//! Experiment specs are data: `experiments/<name>.toml` holds the question, the claim ids it
//! bears on, the variants, the grid (every key a list; the run is their cartesian product),
//! the `--quick` replacements, the per-point limits and the plot. This module parses a spec,
//! checks what every family shares (claims, variants present), checks grid keys and variants
//! against the family's (`validate_for`), and applies `--quick` and `--set`; each family
//! expands the resolved grid into its own points.

use crate::error::{HarnessError, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A spec file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentSpec {
    pub name: String,
    pub question: String,
    pub claims: Vec<String>,
    pub family: String,
    pub variants: Vec<String>,
    /// External peers timed and checked beside the variants (`scripts/peers/<name>`).
    #[serde(default)]
    pub peers: Vec<String>,
    /// The variants `--device cuda` runs when no `--variant` is given.
    #[serde(default)]
    pub cuda_variants: Vec<String>,
    pub grid: BTreeMap<String, Vec<toml::Value>>,
    #[serde(default)]
    pub quick: BTreeMap<String, Vec<toml::Value>>,
    #[serde(default)]
    pub limits: Limits,
    /// Limits that replace `limits` under `--device cuda` (a GPU's memory and speed).
    #[serde(default)]
    pub cuda_limits: Option<Limits>,
    #[serde(default)]
    pub reps: Option<usize>,
    pub plot: PlotSpec,
    /// More plots, written as `<run-id>-2.svg`, `-3.svg`, ...
    #[serde(default)]
    pub extra_plots: Vec<PlotSpec>,
    #[serde(default)]
    pub report: ReportSpec,
}

/// Points over these limits are recorded as skipped instead of run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest useful GFLOP count of one call.
    #[serde(default = "default_max_gflop")]
    pub max_gflop: f64,
    /// Largest K+V size in MiB (the paged pool is a second copy).
    #[serde(default = "default_max_kv_mib")]
    pub max_kv_mib: f64,
    /// Largest score-matrix workspace naive may allocate, in MiB (per running head × threads).
    #[serde(default = "default_max_scores_mib")]
    pub max_scores_mib: f64,
    /// Seconds of timed repetitions per point before stopping early (at least 3 reps run).
    #[serde(default = "default_seconds_per_point")]
    pub seconds_per_point: f64,
}

fn default_max_gflop() -> f64 {
    100.0
}
fn default_max_kv_mib() -> f64 {
    1024.0
}
fn default_max_scores_mib() -> f64 {
    4096.0
}
fn default_seconds_per_point() -> f64 {
    2.0
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_gflop: default_max_gflop(),
            max_kv_mib: default_max_kv_mib(),
            max_scores_mib: default_max_scores_mib(),
            seconds_per_point: default_seconds_per_point(),
        }
    }
}

/// What the SVG shows: one panel per value of `panel`, one line per value of `series`,
/// `x` on the horizontal axis and `y[panel value]` (or `y["*"]`) vertically, rows filtered by
/// `filter` (column = value, or any of `v1|v2|...`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlotSpec {
    pub x: String,
    pub panel: String,
    pub series: String,
    pub y: BTreeMap<String, String>,
    #[serde(default)]
    pub filter: BTreeMap<String, String>,
    #[serde(default = "yes")]
    pub log_x: bool,
    /// Logarithmic vertical axis (errors spanning decades).
    #[serde(default)]
    pub log_y: bool,
    /// Where the legend goes: upper_left (default), upper_right, lower_left, lower_right.
    #[serde(default = "upper_left")]
    pub legend: String,
}

fn upper_left() -> String {
    "upper_left".into()
}

fn yes() -> bool {
    true
}

/// Extra tables in the markdown report.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSpec {
    /// Variant whose time the others are compared with (speed-up = its time / theirs).
    #[serde(default)]
    pub baseline: Option<String>,
    /// A peer (`peers`) to compare with as well: a second speed-up table, its time / ours
    /// (shown only when the run has rows of it).
    #[serde(default)]
    pub peer: Option<String>,
}

impl ExperimentSpec {
    /// Loads `experiments/<name>.toml` (or a path ending in .toml).
    pub fn load(dir: &Path, name: &str) -> Result<(ExperimentSpec, PathBuf)> {
        let path = if name.ends_with(".toml") {
            PathBuf::from(name)
        } else {
            dir.join(format!("{name}.toml"))
        };
        let bytes = std::fs::read(&path).map_err(|e| {
            HarnessError::Usage(format!(
                "unknown experiment '{name}': cannot read {} ({e}); `harness list` shows the experiments",
                path.display()
            ))
        })?;
        Ok((Self::parse(&path, &bytes)?, path))
    }

    /// Parses the spec file `bytes` (named `path` in errors) and checks what every family
    /// shares; one line naming the file and the first problem.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<ExperimentSpec> {
        let bad = |m: String| HarnessError::Usage(format!("{}: {m}", path.display()));
        let text = std::str::from_utf8(bytes).map_err(|e| {
            bad(format!(
                "not UTF-8 text (byte {} is invalid)",
                e.valid_up_to()
            ))
        })?;
        let spec: ExperimentSpec = toml::from_str(text)
            .map_err(|e| bad(e.message().split_whitespace().collect::<Vec<_>>().join(" ")))?;
        spec.validate_static()?;
        Ok(spec)
    }

    /// Every experiment spec under `dir`, sorted by name (every `.toml` file but the claims'
    /// declarations).
    pub fn list(dir: &Path) -> Result<Vec<ExperimentSpec>> {
        let mut out = vec![];
        let entries = std::fs::read_dir(dir)
            .map_err(|e| HarnessError::Usage(format!("cannot read {}: {e}", dir.display())))?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .filter(|p| !p.ends_with(CLAIMS_FILE))
            .collect();
        paths.sort();
        for p in paths {
            out.push(Self::load(dir, &p.to_string_lossy())?.0);
        }
        Ok(out)
    }

    fn validate_static(&self) -> Result<()> {
        let bad = |m: String| {
            Err(HarnessError::Usage(format!(
                "experiment '{}': {m}",
                self.name
            )))
        };
        if self.variants.is_empty() {
            return bad("no variants".into());
        }
        if self.claims.iter().any(|c| !is_claim_id(c)) {
            return bad("claims must be ids like C8".into());
        }
        Ok(())
    }

    /// Fails with one line unless every grid key is one of `keys` (the family's) and every
    /// variant passes `variant` (the family's lookup).
    pub fn validate_for(
        &self,
        keys: &[(&str, &str)],
        variant: impl Fn(&str) -> Result<()>,
    ) -> Result<()> {
        for key in self.grid.keys().chain(self.quick.keys()) {
            if !keys.iter().any(|(k, _)| k == key) {
                return Err(HarnessError::Usage(format!(
                    "experiment '{}': unknown grid key '{key}'",
                    self.name
                )));
            }
        }
        for v in &self.variants {
            variant(v)
                .map_err(|e| HarnessError::Usage(format!("experiment '{}': {e}", self.name)))?;
        }
        Ok(())
    }

    /// The grid after `--quick` and `--set` replacements (`keys`: the family's grid keys);
    /// fails on unknown keys.
    pub fn resolve_grid(
        &self,
        keys: &[(&str, &str)],
        quick: bool,
        sets: &[(String, Vec<String>)],
    ) -> Result<BTreeMap<String, Vec<String>>> {
        let mut grid: BTreeMap<String, Vec<String>> = self
            .grid
            .iter()
            .map(|(k, vs)| (k.clone(), vs.iter().map(value_text).collect()))
            .collect();
        if quick {
            for (k, vs) in &self.quick {
                grid.insert(k.clone(), vs.iter().map(value_text).collect());
            }
        }
        for (k, vs) in sets {
            if !keys.iter().any(|(g, _)| g == k) {
                let known: Vec<&str> = keys.iter().map(|(g, _)| *g).collect();
                return Err(HarnessError::Usage(format!(
                    "unknown --set key '{k}' (known: {})",
                    known.join(", ")
                )));
            }
            grid.insert(k.clone(), vs.clone());
        }
        let points = grid
            .values()
            .try_fold(1usize, |n, vs| n.checked_mul(vs.len().max(1)));
        match points {
            Some(n) if n <= MAX_GRID_POINTS => Ok(grid),
            _ => Err(HarnessError::Usage(format!(
                "experiment '{}': the grid's lists multiply to more than {MAX_GRID_POINTS} points",
                self.name
            ))),
        }
    }
}

/// The most points a grid may expand into (the product of its lists' lengths): far more than
/// any run could measure, and a bound on what expanding a small spec file may allocate.
pub const MAX_GRID_POINTS: usize = 100_000;

/// The file in experiments/ that declares the claims' checks (`harness paper`), not a spec.
pub const CLAIMS_FILE: &str = "claims.toml";

fn is_claim_id(c: &str) -> bool {
    c.strip_prefix('C')
        .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| (1..=27).contains(&n)))
}

fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Parses `key=v1,v2` from `--set`.
pub fn parse_set(text: &str) -> Result<(String, Vec<String>)> {
    let (k, vs) = text
        .split_once('=')
        .ok_or_else(|| HarnessError::Usage(format!("--set '{text}' must look like key=v1,v2")))?;
    let values: Vec<String> = vs.split(',').map(str::trim).map(String::from).collect();
    if k.is_empty() || values.iter().any(String::is_empty) {
        return Err(HarnessError::Usage(format!(
            "--set '{text}' has an empty key or value"
        )));
    }
    Ok((k.to_string(), values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_and_claims() {
        assert_eq!(
            parse_set("kv_len=1,2").unwrap(),
            ("kv_len".into(), vec!["1".into(), "2".into()])
        );
        assert!(parse_set("kv_len").is_err());
        assert!(parse_set("kv_len=1,").is_err());
        assert!(is_claim_id("C8") && !is_claim_id("C28") && !is_claim_id("X1"));
    }
}
