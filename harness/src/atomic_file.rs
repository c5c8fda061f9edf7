//! Files replaced whole or not at all: written to a temporary beside the target (named by
//! this process, so concurrent writers never share one), then renamed over it. A process
//! killed mid-write, or a reader racing a writer (shards of one sweep sharing a results
//! folder and a roofline file), sees the old file or the new one, never half of either.

use crate::error::{HarnessError, Result};
use std::path::Path;

/// Replaces `path` with `bytes` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            HarnessError::Io {
                context: format!("writing {}", path.display()),
                source: e,
            }
        })
}
