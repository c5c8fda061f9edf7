//! How the CLI tests judge an exit: a success with JSON on stdout, or a refusal — exit 2, one
//! line on stderr naming the problem, nothing on stdout.
// Each test binary that includes this file uses some of these.
#![allow(dead_code)]

use std::process::Output;

/// Exit 0; stderr shown otherwise.
pub fn ok_exit(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Exit 0 and stdout parsed as JSON.
pub fn json_ok(out: &Output) -> serde_json::Value {
    ok_exit(out);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Exit 2, one stderr line containing `needle`, nothing on stdout.
pub fn one_line_exit_2(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(needle), "want '{needle}' in {stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout after a refusal");
}
