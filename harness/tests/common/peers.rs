//! What the peer tests share (included by `peers.rs` and `peers_families.rs` as a module of
//! their own): whether python3 is there, and registering a test peer.

use std::fs;
use std::path::Path;
use std::process::Command;

pub fn python_present() -> bool {
    Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Registers a peer `name` of `family` under `peers` running `command` (timeout `timeout_s`),
/// with `extra` manifest lines (`modes = [...]`, `options = {...}`, ...).
pub fn register(
    peers: &Path,
    name: &str,
    family: &str,
    command: &[&str],
    timeout_s: f64,
    extra: &str,
) {
    let dir = peers.join(name);
    fs::create_dir_all(&dir).unwrap();
    let command: Vec<String> = command.iter().map(|a| format!("{a:?}")).collect();
    fs::write(
        dir.join("peer.toml"),
        format!(
            "name = \"{name}\"\nabout = \"test peer\"\nfamilies = [\"{family}\"]\ncommand = [{}]\ninstall = \"pip install {name}-test\"\ntimeout_s = {timeout_s}\n{extra}\n",
            command.join(", ")
        ),
    )
    .unwrap();
}
