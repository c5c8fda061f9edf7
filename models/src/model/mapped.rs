//! The bytes of a model file: memory-mapped (`memmap2`), so a loaded model does not hold the
//! file and its decoded tensors at once — each tensor is copied out of the mapping and its
//! pages are then dropped from the process (`madvise(MADV_DONTNEED)` on a read-only mapping:
//! they stay in the page cache, and a later read faults them back in from the file) — or
//! owned (a buffer already in memory: tests, fuzzing).

use kernel_common::{error::Result, KernelError};
use memmap2::{Mmap, UncheckedAdvice};
use std::path::Path;

/// A file's bytes.
pub enum FileBytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl FileBytes {
    /// Maps `path` read-only.
    pub fn map(path: &Path) -> Result<FileBytes> {
        let bad = |e: std::io::Error| {
            KernelError::BadFile(format!("{}: cannot read ({e})", path.display()))
        };
        let file = std::fs::File::open(path).map_err(bad)?;
        // SAFETY: the mapping is read-only and private to this process; a file truncated or
        // rewritten by another process while mapped is outside what the loader can guard
        // against (as for llama.cpp's mmap loading).
        let map = unsafe { Mmap::map(&file) }.map_err(bad)?;
        Ok(FileBytes::Mapped(map))
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Owned(v) => v,
        }
    }

    /// A copy of `range` (checked by the caller), whose mapped pages are then released.
    pub fn copy_out(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        let out = self.as_slice()[range.clone()].to_vec();
        if let FileBytes::Mapped(m) = self {
            if !range.is_empty() {
                // SAFETY: the mapping is read-only, so dropping its pages (memmap2 widens the
                // range to whole pages) loses nothing: a later read faults the file's bytes
                // back in. The advice is a memory hint; its failure changes nothing the loader
                // relies on.
                let _ = unsafe {
                    m.unchecked_advise_range(UncheckedAdvice::DontNeed, range.start, range.len())
                };
            }
        }
        out
    }
}
