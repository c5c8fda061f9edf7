//! What the sweep tests (`sweep.rs`, `slurm.rs`) compare: a run's rows by point.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// A run's rows as point → [(variant, status)] in file order.
pub fn points_of(csv: &Path) -> BTreeMap<String, Vec<(String, String)>> {
    let mut reader = csv::Reader::from_path(csv).unwrap();
    let h = reader.headers().unwrap().clone();
    let col = |n: &str| {
        h.iter()
            .position(|c| c == n)
            .unwrap_or_else(|| panic!("no {n}"))
    };
    let (p, v, s) = (col("point"), col("variant"), col("status"));
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for r in reader.records() {
        let r = r.unwrap();
        out.entry(r[p].to_string())
            .or_default()
            .push((r[v].to_string(), r[s].to_string()));
    }
    out
}

/// The one plain run's CSV in `dir` (a timestamped name, not a sweep's).
pub fn plain_csv(dir: &Path) -> PathBuf {
    let found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            name.ends_with(".csv") && name.starts_with('2') && !name.contains(".shard-")
        })
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}
