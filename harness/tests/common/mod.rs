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
