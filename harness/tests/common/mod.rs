//! Helpers shared by the harness's integration tests.

use std::fs;
use std::path::PathBuf;

/// A fresh folder under the system temp dir, removed when dropped (also when a test fails).
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `<tmp>/harness-<suite>-<pid>-<test>`, emptied first.
    pub fn new(suite: &str, test: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("harness-{suite}-{}-{test}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn join(&self, part: &str) -> PathBuf {
        self.0.join(part)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A reader of the one CSV a run wrote in `dir` (its results folder).
#[allow(dead_code)]
pub fn run_csv(dir: &std::path::Path) -> csv::Reader<fs::File> {
    let csv_path = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "csv"))
        .expect("a csv");
    csv::Reader::from_path(csv_path).unwrap()
}

/// Every row of the one CSV in `dir` (a run's results folder) as column name → value.
#[allow(dead_code)]
pub fn csv_rows(dir: &std::path::Path) -> Vec<std::collections::HashMap<String, String>> {
    let mut r = run_csv(dir);
    let h = r.headers().unwrap().clone();
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            h.iter()
                .zip(rec.iter())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}
