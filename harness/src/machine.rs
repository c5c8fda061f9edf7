//! Facts about this machine and this checkout for run provenance: CPU model, cores, host,
//! git sha and dirty flag, rustc, UTC timestamps and run ids.

use std::process::Command;
use std::time::SystemTime;

/// The CPU model from /proc/cpuinfo (or the architecture where that is absent).
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Logical cores available to this process.
pub fn logical_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Host name.
pub fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// A file-name-safe key for this kind of machine: CPU model and core count
/// (hosts are ephemeral here; the hardware is what a roofline belongs to).
pub fn machine_key() -> String {
    let mut slug = String::new();
    for c in cpu_model().to_lowercase().chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c);
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    format!("{}-{}c", slug.trim_matches('-'), logical_cores())
}

/// (sha, dirty) of the git checkout in the working directory, or ("unknown", false).
///
/// Read once per process, at the first call (`main` makes it before any command runs), so a
/// file the run itself rewrites — the machine's roofline in `results/roofline/` — does not
/// mark a run from a clean tree as dirty.
pub fn git_state() -> (String, bool) {
    static STATE: std::sync::OnceLock<(String, bool)> = std::sync::OnceLock::new();
    STATE.get_or_init(read_git_state).clone()
}

fn read_git_state() -> (String, bool) {
    let run = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match run(&["rev-parse", "HEAD"]) {
        Some(sha) => {
            let dirty = run(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| s.lines().any(|l| !is_roofline_cache(porcelain_path(l))));
            (sha, dirty)
        }
        None => ("unknown".into(), false),
    }
}

/// The path of a `git status --porcelain` line (`XY path`; its leading space may have been
/// trimmed).
fn porcelain_path(line: &str) -> &str {
    line.trim_start()
        .split_once(' ')
        .map_or(line, |(_, p)| p.trim_start())
}

/// Whether `path` (from the checkout's root) is a roofline file a run rewrites as it starts
/// (`results/roofline/<machine>-<t>t.json`, or a script's `results/<dir>/runs/roofline/`):
/// the best values seen, a cache, not code, so a run after another from the same clean commit
/// is still clean.
fn is_roofline_cache(path: &str) -> bool {
    let p = std::path::Path::new(path);
    path.starts_with("results/")
        && p.extension().is_some_and(|e| e == "json")
        && p.parent()
            .and_then(|d| d.file_name())
            .is_some_and(|d| d == "roofline")
}

/// The rustc that built this binary.
pub fn rustc() -> &'static str {
    env!("HARNESS_RUSTC")
}

/// Now as RFC 3339 UTC with seconds.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// A run id from the current UTC time, `20261129T221502Z`, plus a suffix when given.
pub fn run_id(suffix: &str) -> String {
    let t: String = now_rfc3339()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    if suffix.is_empty() {
        t
    } else {
        format!("{t}-{suffix}")
    }
}

/// The ISA tier the CPU kernels use in this run (the detected tier lowered by `--isa` /
/// `WORKBENCH_ISA`), as provenance records it.
pub fn isa() -> String {
    kernel_cpu::Isa::active().name().to_string()
}

/// The widest ISA tier this CPU has.
pub fn isa_detected() -> String {
    kernel_cpu::Isa::detected().name().to_string()
}

/// One line for `harness list`: the tier in use, the CPU's, and how to change it.
pub fn isa_summary() -> String {
    use kernel_cpu::Isa;
    let tiers: Vec<String> = Isa::ALL
        .iter()
        .map(|t| match t.missing() {
            m if m.is_empty() => t.name().to_string(),
            m => format!("{} (lacks {})", t.name(), m.join(", ")),
        })
        .collect();
    format!(
        "ISA: {} in use; this CPU has {} (tiers: {}; lower with --isa or {})",
        Isa::active(),
        Isa::detected(),
        tiers.join(", "),
        kernel_cpu::isa::ENV_VAR
    )
}

/// The full command line as typed.
pub fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_keys_are_file_safe() {
        let id = run_id("quick");
        assert!(id.ends_with("-quick") && id.starts_with('2') && id.contains('T'));
        assert!(machine_key()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert!(logical_cores() >= 1);
        assert!(rustc().starts_with("rustc"));
    }

    #[test]
    fn only_roofline_files_under_results_leave_a_tree_clean() {
        for cache in [
            "results/roofline/intel-xeon-2c-2t.json",
            "results/flash2_vs_sdpa_cpu/runs/roofline/intel-xeon-2c-2t.json",
        ] {
            assert!(is_roofline_cache(cache), "{cache}");
        }
        for code in [
            "harness/src/roofline.rs",
            "results/roofline/notes.md",
            "results/decode_roofline/20261203T143624Z.json",
            "scripts/roofline/x.json",
        ] {
            assert!(!is_roofline_cache(code), "{code}");
        }
        for line in [
            " M results/roofline/a-2t.json",
            "M results/roofline/a-2t.json",
            "MM results/roofline/a-2t.json",
        ] {
            assert_eq!(
                porcelain_path(line),
                "results/roofline/a-2t.json",
                "{line:?}"
            );
        }
    }
}
