//! Which sweep a run belongs to: the options that make `harness exp` a shard of one
//! (`--shard`, `--sweep-id`, `--resume`; `harness plan`'s `--shards`), the definition every
//! shard of a sweep must share (a digest of the spec file, the resolved grid and the options
//! that change what is measured), the sweep id derived from it and the commit when none is
//! given, and the shard's file names `<sweep-id>.shard-<i>-of-<n>.{csv,json}`.

use super::key::{digest, Shard};
use crate::error::{HarnessError, Result};
use std::path::{Path, PathBuf};

/// How `harness exp` splits and resumes a sweep, or that `harness plan` only counts it.
#[derive(Debug, Clone, Default)]
pub struct SweepOptions {
    pub shard: Option<Shard>,
    pub sweep_id: Option<String>,
    pub resume: bool,
    /// `harness plan --shards n`: the points are enumerated, nothing measured or written.
    pub plan: Option<usize>,
}

impl SweepOptions {
    /// Whether the run writes shard files (any of `--shard`, `--sweep-id`, `--resume`).
    pub fn is_sweep(&self) -> bool {
        self.shard.is_some() || self.sweep_id.is_some() || self.resume
    }
}

/// What shards of one sweep must agree on.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    /// Digest of everything below and of the options (16 hex digits).
    pub digest: String,
    /// Digest of the spec file's bytes.
    pub spec_digest: String,
}

impl Definition {
    /// The definition of a sweep of the spec file `spec_text` with `options` (a JSON object
    /// of the resolved grid and the options that change what is measured).
    pub fn of(spec_text: &[u8], options: &serde_json::Value) -> Definition {
        let spec_digest = hex(digest(spec_text));
        let whole = format!("{spec_digest} {options}");
        Definition {
            digest: hex(digest(whole.as_bytes())),
            spec_digest,
        }
    }

    /// The sweep id when none is given: the experiment, `quick` for `--quick`, and a digest
    /// of the definition and the commit, so shards started from one checkout with the same
    /// arguments share it wherever they run.
    pub fn derived_id(&self, experiment: &str, quick: bool, git_sha: &str) -> String {
        let tag = digest(format!("{} {git_sha}", self.digest).as_bytes()) >> 16;
        format!(
            "{experiment}{}-{tag:012x}",
            if quick { "-quick" } else { "" }
        )
    }
}

fn hex(v: u64) -> String {
    format!("{v:016x}")
}

/// Fails with one line unless `id` can name files: letters, digits, `.`, `_` and `-`,
/// starting with a letter or digit, at most 120 characters, without `.shard-`.
pub fn check_sweep_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 120
        && id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !id.contains(".shard-")
        && !id.contains("..");
    if ok {
        Ok(())
    } else {
        Err(HarnessError::Usage(format!(
            "--sweep-id '{id}': use letters, digits, '.', '_' and '-' (starting with a letter or digit, at most 120, no '.shard-')"
        )))
    }
}

/// `<dir>/<sweep-id>.shard-<i>-of-<n>.csv`.
pub fn shard_csv(dir: &Path, sweep_id: &str, shard: Shard) -> PathBuf {
    dir.join(format!("{sweep_id}.{}.csv", shard.label()))
}

/// The sweep id and shard a shard CSV's name gives (`id.shard-2-of-4.csv`), if it is one.
pub fn parse_shard_name(path: &Path) -> Option<(String, Shard)> {
    let name = path.file_name()?.to_str()?.strip_suffix(".csv")?;
    let (id, rest) = name.rsplit_once(".shard-")?;
    let (i, n) = rest.split_once("-of-")?;
    let shard = Shard::parse(&format!("{i}/{n}")).ok()?;
    Some((id.to_string(), shard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_definition_and_the_commit() {
        let grid = serde_json::json!({"grid": {"kv_len": ["128", "1024"]}, "seed": 42});
        let a = Definition::of(b"name = \"x\"", &grid);
        assert_eq!(a, Definition::of(b"name = \"x\"", &grid));
        let other_spec = Definition::of(b"name = \"y\"", &grid);
        assert_ne!(a.digest, other_spec.digest);
        assert_ne!(a.spec_digest, other_spec.spec_digest);
        let other_grid = Definition::of(b"name = \"x\"", &serde_json::json!({"seed": 7}));
        assert_ne!(a.digest, other_grid.digest);
        assert_eq!(a.spec_digest, other_grid.spec_digest);
        let id = a.derived_id("flash_vs_paged", true, "abc");
        assert!(
            id.starts_with("flash_vs_paged-quick-") && id.len() == 21 + 12,
            "{id}"
        );
        assert_eq!(id, a.derived_id("flash_vs_paged", true, "abc"));
        assert_ne!(id, a.derived_id("flash_vs_paged", true, "abd"));
        check_sweep_id(&id).unwrap();
    }

    #[test]
    fn sweep_ids_name_files_and_shard_names_parse_back() {
        for bad in ["", "../x", "a/b", "-x", "a b", "x.shard-1", "a..b"] {
            assert!(check_sweep_id(bad).is_err(), "{bad}");
        }
        let shard = Shard { index: 2, count: 5 };
        let p = shard_csv(Path::new("/r/exp"), "run-1.a", shard);
        assert_eq!(p, Path::new("/r/exp/run-1.a.shard-2-of-5.csv"));
        assert_eq!(parse_shard_name(&p), Some(("run-1.a".into(), shard)));
        assert_eq!(parse_shard_name(Path::new("/r/exp/run.csv")), None);
        assert_eq!(parse_shard_name(Path::new("x.shard-3-of-2.csv")), None);
    }
}
