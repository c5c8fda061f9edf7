//! The real peers every speed claim rests on (scripts/peers: torch SDPA, torch linear in f32
//! and bf16, gguf-py's quantisers, llama.cpp), as installed by scripts/fetch-peers.sh, each on
//! one small point of every mode it serves, through the real binary and the repository's own
//! experiments: every peer row must be `ok` — torch's outputs against the f64 oracle within
//! its dtype's tolerance, gguf-py's bytes identical to ours, llama.cpp's greedy tokens on
//! SmolLM2 scored by our model (`families/decode/peer_check.rs`) before its times count.
//! Skipped with a message where the peers are not installed, unless WORKBENCH_REQUIRE_PEERS=1
//! (CI sets it after installing them), which makes their absence a failure.

mod common;

use common::TempDir;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_harness");
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// Skips (returns false) or, under WORKBENCH_REQUIRE_PEERS=1, fails with `why`.
fn absent(why: &str) -> bool {
    if std::env::var("WORKBENCH_REQUIRE_PEERS").is_ok_and(|v| v == "1") {
        panic!("WORKBENCH_REQUIRE_PEERS=1 but {why} (run scripts/fetch-peers.sh)");
    }
    eprintln!("SKIPPED: {why} (run scripts/fetch-peers.sh)");
    false
}

/// The peers' Python, as the harness finds it, if torch and gguf import in it.
fn peer_python() -> bool {
    let python = std::env::var_os("WORKBENCH_PEER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(ROOT).join("target/peers/venv/bin/python"));
    let ok = Command::new(&python)
        .args(["-c", "import torch, gguf"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok || absent(&format!(
        "torch and gguf do not import in {}",
        python.display()
    ))
}

/// A llama.cpp build with llama-bench, llama-batched-bench and llama-simple.
fn llamacpp_build() -> Option<&'static str> {
    let dir = std::env::var_os("WORKBENCH_LLAMACPP_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(ROOT).join("target/peers/llama.cpp"));
    let found = ["native", "avx512", "avx2"].into_iter().find(|b| {
        ["llama-bench", "llama-batched-bench", "llama-simple"]
            .iter()
            .all(|t| dir.join(format!("build-{b}/bin/{t}")).exists())
    });
    if found.is_none() {
        absent(&format!(
            "no llama.cpp build under {} has llama-bench, llama-batched-bench and llama-simple",
            dir.display()
        ));
    }
    found
}

/// Runs `harness exp` (2 threads, results in `t`) and returns the run's rows.
fn exp(t: &TempDir, args: &[&str]) -> Vec<HashMap<String, String>> {
    let results = t.join("results").display().to_string();
    let out = Command::new(BIN)
        .args(["--results-dir", &results, "exp"])
        .args(args)
        .args(["--threads", "2", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "harness exp {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::csv_rows(&t.join("results").join(args[0]))
}

/// Every row of a peer in `peers` is `ok`, and there are `want` of them.
fn all_ok(rows: &[HashMap<String, String>], peers: &[&str], want: usize) {
    let got: Vec<_> = rows
        .iter()
        .filter(|r| peers.contains(&r["variant"].as_str()))
        .collect();
    assert_eq!(got.len(), want, "{peers:?}: {rows:#?}");
    for r in got {
        assert_eq!(r["status"], "ok", "{r:#?}");
    }
}

#[test]
fn torch_sdpa_at_decode_append_and_prefill() {
    if !peer_python() {
        return;
    }
    let t = TempDir::new("real_peers", "sdpa");
    let rows = exp(
        &t,
        &[
            "naive_vs_flash2",
            "--peer",
            "torch_sdpa",
            "--reps",
            "2",
            "--set",
            "mode=decode,append,prefill",
            "--set",
            "kv_len=128",
            "--set",
            "causal=true",
        ],
    );
    all_ok(&rows, &["torch_sdpa"], 3);
}

#[test]
fn torch_linear_and_gguf_py_at_matmul_and_quantize() {
    if !peer_python() {
        return;
    }
    let t = TempDir::new("real_peers", "quant");
    let rows = exp(
        &t,
        &[
            "quant_tradeoff",
            "--peer",
            "torch_linear",
            "--peer",
            "torch_linear:dtype=bf16",
            "--peer",
            "gguf_py",
            "--reps",
            "2",
            "--set",
            "format=f32,q8_0,q4_0,q5_1",
            "--set",
            "shape=256x512",
            "--set",
            "weights=gaussian",
            "--set",
            "batch=1",
        ],
    );
    all_ok(&rows, &["torch_linear", "torch_linear:dtype=bf16"], 2);
    // gguf-py quantises q8_0, q4_0 and q5_1 of the grid, byte for byte ours.
    all_ok(&rows, &["gguf_py"], 3);
    for r in rows.iter().filter(|r| r["variant"] == "gguf_py") {
        assert!(r["note"].starts_with("bytes identical to ours"), "{r:#?}");
    }
}

#[test]
fn llamacpp_decode_batched_prefill_and_verify_after_its_token_check() {
    let model = Path::new(ROOT).join("models/cache/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        eprintln!(
            "SKIPPED: {} is absent (run scripts/fetch-models.sh)",
            model.display()
        );
        return;
    }
    let Some(build) = llamacpp_build() else {
        return;
    };
    let t = TempDir::new("real_peers", "llamacpp");
    let peer = format!("llamacpp:build={build}");
    let model_set = format!("model={}", model.display());
    let rows = exp(
        &t,
        &[
            "decode_roofline",
            "--peer",
            &peer,
            "--set",
            &model_set,
            "--set",
            "weights=native",
            "--set",
            "matmul=packed",
            "--set",
            "batch=1,2",
            "--set",
            "context=16",
            "--set",
            "steps=4",
            "--set",
            "prefill_tokens=32",
            "--set",
            "verify_tokens=1,4",
        ],
    );
    // Decode at batch 1 and 2, prefill, 1- and 4-token verify steps: each timed, each after
    // the check passed.
    all_ok(&rows, &[&peer], 5);
    let cost = rows
        .iter()
        .find(|r| r["variant"] == peer && r["phase"] == "verify" && r["step_tokens"] == "4")
        .map(|r| r["cost_steps"].parse::<f64>().unwrap());
    assert!(
        cost.is_some_and(|c| c > 0.0),
        "llama.cpp's 4-token step in its steps: {cost:?}"
    );
    for r in rows.iter().filter(|r| r["variant"] == peer) {
        assert!(r["note"].starts_with("checked: "), "{r:#?}");
        assert!(r["tokens_per_s"].parse::<f64>().unwrap() > 0.0, "{r:#?}");
    }
}
