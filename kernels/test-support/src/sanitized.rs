//! The emulated kernel tests once more with the kernels built with AddressSanitizer and
//! UndefinedBehaviorSanitizer (`emu::SANITIZE`): an access past a buffer's end, a misaligned
//! typed access, signed overflow, an index past a fixed array's bound. The library is loaded
//! into a Rust test process, so the ASan runtime must come first: `assert_passes` reruns a test
//! of the calling test binary in a child process with `LD_PRELOAD` naming g++'s `libasan.so`
//! (leak detection off: the Rust side is not instrumented) and asserts that it passes.

use crate::emu::{unavailable, MUTATION_SWITCH, SANITIZE};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

/// g++'s ASan runtime, if it has one.
pub fn asan_runtime() -> Option<PathBuf> {
    let out = Command::new("g++")
        .arg("-print-file-name=libasan.so")
        .env_remove("LD_PRELOAD")
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && path.is_absolute() && path.exists()).then_some(path)
}

/// Whether the ASan runtime is preloaded into this process.
pub fn preloaded() -> bool {
    crate::emu::asan_preloaded()
}

/// Why sanitised runs cannot happen here, or `None`.
pub fn unavailable_here() -> Option<String> {
    if let Some(why) = unavailable() {
        return Some(why);
    }
    asan_runtime()
        .is_none()
        .then(|| "g++ has no libasan.so: the sanitised emulator runs need it".into())
}

/// `cmd` set up to run with sanitised kernels: the ASan runtime preloaded, `SANITIZE` set.
pub fn configure(cmd: &mut Command) -> &mut Command {
    let runtime = asan_runtime().expect("g++'s libasan.so");
    cmd.env("LD_PRELOAD", runtime)
        .env("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1")
        .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        .env(SANITIZE, "1")
}

/// Runs test `test` of the calling test binary in a child process with sanitised kernels and
/// asserts that it passes; returns its seconds. Returns `None` at once inside such a child (a
/// test calling this must not recurse), and skips, with the reason, where g++ lacks the runtime.
pub fn assert_passes(test: &str) -> Option<f64> {
    // Inside a sanitised child, or a mutation's child (`mutations::switched_on`).
    if crate::emu::sanitizing() || std::env::var_os(MUTATION_SWITCH).is_some() {
        return None;
    }
    if let Some(why) = unavailable_here() {
        eprintln!("SKIPPED sanitised emulator run of {test}: {why}");
        return None;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let start = Instant::now();
    let out = configure(&mut Command::new(exe))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null())
        .output()
        .expect("the test binary runs");
    let seconds = start.elapsed().as_secs_f64();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{test} fails with the kernels built with ASan and UBSan ({}):\n{text}",
        out.status
    );
    eprintln!("{test}: passes with ASan and UBSan in {seconds:.1} s");
    Some(seconds)
}
