//! Where the workspace is, for the default `--experiments-dir` and `--results-dir`: the
//! `WORKBENCH_ROOT` environment variable if set, else the nearest folder at or above the
//! current directory whose `Cargo.toml` declares `[workspace]` and which has an
//! `experiments/` folder. Never the folder the binary was built in: a binary built in one
//! clone must not read the specs of, or write results into, another.

use crate::error::{HarnessError, Result};
use std::path::{Path, PathBuf};

/// The workspace root, or a one-line error saying how to name one.
pub fn root() -> Result<PathBuf> {
    if let Some(root) = std::env::var_os("WORKBENCH_ROOT") {
        let root = PathBuf::from(root);
        if !root.join("experiments").is_dir() {
            return Err(HarnessError::Usage(format!(
                "WORKBENCH_ROOT={} has no experiments/ folder",
                root.display()
            )));
        }
        return Ok(root);
    }
    let cwd = std::env::current_dir()
        .map_err(|e| HarnessError::Usage(format!("cannot read the current directory: {e}")))?;
    find_from(&cwd).ok_or_else(|| {
        HarnessError::Usage(format!(
            "{} is not inside a workbench checkout (no Cargo.toml with [workspace] and an experiments/ folder above it); run from the checkout, set WORKBENCH_ROOT, or pass --experiments-dir and --results-dir",
            cwd.display()
        ))
    })
}

/// The nearest workbench root at or above `start`.
pub fn find_from(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .find(|dir| is_root(dir))
        .map(Path::to_path_buf)
}

fn is_root(dir: &Path) -> bool {
    dir.join("experiments").is_dir()
        && std::fs::read_to_string(dir.join("Cargo.toml"))
            .is_ok_and(|t| t.lines().any(|l| l.trim() == "[workspace]"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_workspace_above_a_subfolder_and_not_outside() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = find_from(&here.join("src")).expect("the harness sits in the workspace");
        assert_eq!(root, here.parent().unwrap());
        let outside = std::env::temp_dir().join(format!("no-workbench-{}", std::process::id()));
        std::fs::create_dir_all(&outside).unwrap();
        assert_eq!(find_from(&outside), None);
        std::fs::remove_dir_all(outside).unwrap();
    }
}
