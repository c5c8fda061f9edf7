//! The texts model quality is measured on. No dataset hub is reachable, so they are real text
//! that ships with the machine or the repository, never text written for the purpose, each
//! recorded with its sha256:
//!
//! - `gpl3`: the GNU GPL version 3, `/usr/share/common-licenses/GPL-3` (Debian's base-files,
//!   on every Debian system): English prose;
//! - `licenses`: every file of `/usr/share/common-licenses` (regular files, sorted by name,
//!   concatenated): ~260 KB of English prose;
//! - `rust`: the workbench's own kernel sources (`kernels/*/src/**/*.rs` of the checkout,
//!   sorted by path, concatenated): code — it changes with the code, hence the hash;
//! - `seeds`: the four source documents of the claims (`../shared/seeds/*.txt` beside the
//!   checkout, sorted): Chinese;
//! - `python`: the Python standard library's top-level modules (`/usr/lib/python3.N/*.py` of
//!   the newest python3 installed, sorted): ~4.7 MB of Python code (3.11 on Debian 12), a
//!   corpus for retrieval drafting;
//! - anything else: a path to a UTF-8 file.

use crate::error::{HarnessError, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// A text to evaluate on.
#[derive(Debug, Clone)]
pub struct Text {
    /// The name it was asked for by (`gpl3`, a path).
    pub name: String,
    /// Where it came from, for provenance.
    pub origin: String,
    pub content: String,
    pub sha256: String,
}

const LICENSES: &str = "/usr/share/common-licenses";

/// The sha256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Files under `dir` (recursively) whose name ends with `ext`, sorted by path.
fn files_under(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, ext, out);
        } else if p.is_file() && p.to_string_lossy().ends_with(ext) {
            out.push(p);
        }
    }
}

/// The regular files directly in `dir` that `keep` accepts, sorted by path (none when `dir`
/// cannot be read).
fn files_in(dir: &Path, keep: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && keep(p))
        .collect();
    files.sort();
    files
}

/// `/usr/lib/python3.N` with the largest N.
fn newest_python_lib() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let minor = e
                .file_name()
                .to_str()?
                .strip_prefix("python3.")?
                .parse::<u32>()
                .ok()?;
            Some((minor, e.path()))
        })
        .filter(|(_, p)| p.is_dir())
        .max_by_key(|(minor, _)| *minor)
        .map(|(_, p)| p)
}

fn read_utf8(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path)
        .map_err(|e| HarnessError::Usage(format!("--text {}: {e}", path.display())))?;
    String::from_utf8(bytes).map_err(|e| {
        HarnessError::Usage(format!(
            "--text {}: not UTF-8 (byte {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

fn concat(name: &str, origin: String, files: &[PathBuf], missing: &str) -> Result<Text> {
    if files.is_empty() {
        return Err(HarnessError::Usage(format!("text '{name}': {missing}")));
    }
    let mut content = String::new();
    for f in files {
        content.push_str(&read_utf8(f)?);
        if !content.ends_with('\n') {
            content.push('\n');
        }
    }
    Ok(Text {
        name: name.into(),
        origin,
        sha256: sha256_hex(content.as_bytes()),
        content,
    })
}

impl Text {
    /// The text `name` names; `root` is the checkout (for `rust` and `seeds`).
    pub fn resolve(name: &str, root: Option<&Path>) -> Result<Text> {
        match name {
            "gpl3" => {
                let p = Path::new(LICENSES).join("GPL-3");
                concat(
                    name,
                    p.display().to_string(),
                    &[p.clone()]
                        .into_iter()
                        .filter(|p| p.is_file())
                        .collect::<Vec<_>>(),
                    &format!(
                        "{} is absent (Debian's base-files installs it)",
                        p.display()
                    ),
                )
            }
            "licenses" => {
                let files = files_in(Path::new(LICENSES), |p| !p.is_symlink());
                concat(
                    name,
                    format!("{LICENSES}/* ({} files)", files.len()),
                    &files,
                    &format!("{LICENSES} is absent or empty (Debian's base-files installs it)"),
                )
            }
            "rust" | "seeds" => {
                let root = root.ok_or_else(|| {
                    HarnessError::Usage(format!(
                        "text '{name}' needs a checkout (see WORKBENCH_ROOT)"
                    ))
                })?;
                let mut files = vec![];
                let origin = if name == "rust" {
                    for e in std::fs::read_dir(root.join("kernels"))
                        .into_iter()
                        .flatten()
                        .flatten()
                    {
                        files_under(&e.path().join("src"), ".rs", &mut files);
                    }
                    format!("{}/kernels/*/src/**/*.rs", root.display())
                } else {
                    let dir = root.join("../shared/seeds");
                    files_under(&dir, ".txt", &mut files);
                    format!("{}/*.txt", dir.display())
                };
                files.sort();
                concat(
                    name,
                    origin.clone(),
                    &files,
                    &format!("no files at {origin}"),
                )
            }
            "python" => {
                let lib = newest_python_lib().ok_or_else(|| {
                    HarnessError::Usage(
                        "text 'python': no /usr/lib/python3.N (install python3)".into(),
                    )
                })?;
                let files = files_in(&lib, |p| p.extension().is_some_and(|e| e == "py"));
                concat(
                    name,
                    format!("{}/*.py ({} files)", lib.display(), files.len()),
                    &files,
                    &format!("no *.py files in {}", lib.display()),
                )
            }
            path => {
                let p = Path::new(path);
                if !p.is_file() {
                    return Err(HarnessError::Usage(format!(
                        "--text '{path}': not a file, nor one of gpl3, licenses, rust, seeds, python"
                    )));
                }
                concat(path, p.display().to_string(), &[p.to_path_buf()], "empty")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_abc_is_the_standard_one() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn python_is_the_newest_stdlibs_modules_where_one_is_installed() {
        let Some(lib) = newest_python_lib() else {
            return;
        };
        let t = Text::resolve("python", None).unwrap();
        assert!(
            t.origin.starts_with(&lib.display().to_string()),
            "{}",
            t.origin
        );
        // os.py and re's neighbours: Python source, not bytecode.
        assert!(t.content.contains("\ndef ") && t.content.contains("\nimport "));
    }

    #[test]
    fn unknown_texts_are_one_line() {
        let e = Text::resolve("/no/such/file.txt", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a file"), "{e}");
        let e = Text::resolve("rust", None).unwrap_err().to_string();
        assert!(e.contains("needs a checkout"), "{e}");
    }
}
