//! The stand-in CUDA driver for the tests that run the harness with `--device cuda` without a
//! GPU: `tests/fake_cuda/libcuda.c` built with gcc, and the CPU emulator's library of every
//! `.cu` (`kernel_test_support::emu`), which the fake routes launches to.
// Each test binary that includes this file uses some of it.
#![allow(dead_code)]

use kernel_cuda::nvrtc::{include_dirs, nvrtc_present};
use kernel_test_support::emu::{unavailable, EmuModule};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder holding the fake `libcuda.so` (`<tmp>/workbench-fake-cuda-<tag>-<pid>`), and
/// the emulator libraries as `WORKBENCH_EMU_LIBS` takes them; None (after saying why) without
/// gcc/g++ or NVRTC, unless WORKBENCH_REQUIRE_NVRTC is set (CI), which makes that a failure.
pub fn fake_driver(tag: &str) -> Option<(PathBuf, String)> {
    let required = std::env::var_os("WORKBENCH_REQUIRE_NVRTC").is_some();
    let missing = if !nvrtc_present() || include_dirs().is_empty() {
        Some("NVRTC or the CUDA headers are missing (source scripts/fetch-nvrtc.sh)".to_string())
    } else {
        unavailable()
    };
    if let Some(why) = missing {
        assert!(!required, "WORKBENCH_REQUIRE_NVRTC is set but {why}");
        eprintln!("SKIPPED fake-driver CUDA run: {why}");
        return None;
    }
    let dir =
        std::env::temp_dir().join(format!("workbench-fake-cuda-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake_cuda/libcuda.c");
    let out = Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so"))
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("gcc runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let libs: Vec<String> = harness::cuda_sources()
        .iter()
        .map(|s| {
            EmuModule::library(s)
                .unwrap_or_else(|e| panic!("{e}"))
                .display()
                .to_string()
        })
        .collect();
    Some((dir, libs.join(":")))
}
