//! Atomic file writes, for every file under results/ that is not streamed (provenance JSON,
//! the report's markdown and SVGs, the roofline records): the bytes go to a temporary file in
//! the same folder, are synced to disk, and the temporary is renamed over the target (POSIX
//! `rename` is atomic within a file system), so a reader, or a run killed half-way through a
//! write, sees the old file or the new one and never half of one. The CSVs are the exception:
//! streamed and flushed row by row, so that an interrupted run keeps every finished row.

use crate::error::{HarnessError, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The temporary beside `path`: hidden, named by the process so concurrent writers do not meet.
fn temporary(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// Writes `contents` to `path` atomically (temporary file, sync, rename).
pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> Result<()> {
    let tmp = temporary(path);
    let context = format!("writing {}", path.display());
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(contents.as_ref())?;
        f.sync_all()
    });
    let renamed = written.and_then(|()| std::fs::rename(&tmp, path));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed.map_err(HarnessError::io(context))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_sees_the_old_file_or_the_new_one_never_half() {
        let dir = std::env::temp_dir().join(format!("atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.json");
        let doc = |i: usize| format!("{{\"rows\": {i}, \"pad\": \"{}\"}}\n", "x".repeat(64 << 10));
        write(&path, doc(0)).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let v: serde_json::Value = serde_json::from_str(&text)
                        .unwrap_or_else(|e| panic!("a torn read ({} bytes): {e}", text.len()));
                    assert!(v["rows"].is_u64());
                    reads += 1;
                }
                reads
            });
            for i in 1..200 {
                write(&path, doc(i)).unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(reader.join().unwrap() > 0);
        });
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary is left behind");
        assert!(write(&dir.join("missing").join("x.json"), "{}").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
