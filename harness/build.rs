//! Records the rustc version the harness was built with, for run provenance.
fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=HARNESS_RUSTC={}", version.trim());
    println!("cargo:rerun-if-changed=build.rs");
}
