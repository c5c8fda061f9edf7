//! Peers of the quant and decode families end to end through the real binary, with test peers
//! in plain Python: a matmul peer is checked against the f64 product and timed beside our
//! formats (a wrong one is `fail`); a quantiser peer's bytes are compared with ours byte for
//! byte (one flipped bit is `fail`, naming the block) and timed beside our quantiser, for the
//! formats it serves only; a decode peer is timed in rounds alternating with ours at the
//! points it serves (one sequence, native weights) and says `unsupported` at the others, once
//! its greedy tokens pass the check against our model (a continuation that does not is
//! `fail`, a model without a tokenizer `error`, and neither is timed);
//! peer options reach the peer, and bad ones are one line, exit 2, nothing written.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

mod common;
#[path = "common/peers.rs"]
mod peer_setup;
use common::TempDir;
use peer_setup::{python_present, register};

const BIN: &str = env!("CARGO_BIN_EXE_harness");
const PYQUANT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/pyquant.py");
const PYDECODE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/pydecode.py");
const REPO_ROOFLINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../results/roofline");

/// A checkout-like folder with one spec, results/roofline seeded and a peers/ folder.
fn setup(test: &str, spec_name: &str, spec: &str) -> TempDir {
    let t = TempDir::new("peers_families", test);
    fs::create_dir_all(t.join("experiments")).unwrap();
    fs::create_dir_all(t.join("peers")).unwrap();
    fs::write(t.join(&format!("experiments/{spec_name}.toml")), spec).unwrap();
    let roof = t.join("results/roofline");
    fs::create_dir_all(&roof).unwrap();
    for e in fs::read_dir(REPO_ROOFLINE).into_iter().flatten().flatten() {
        let _ = fs::copy(e.path(), roof.join(e.file_name()));
    }
    t
}

fn exp(t: &TempDir, name: &str, extra: &[&str]) -> Output {
    let dir = |d: &str| t.join(d).display().to_string();
    let mut args: Vec<String> = vec![
        "exp".into(),
        name.into(),
        "--threads".into(),
        "1".into(),
        "--experiments-dir".into(),
        dir("experiments"),
        "--results-dir".into(),
        dir("results"),
        "--peers-dir".into(),
        dir("peers"),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Command::new(BIN).args(&args).output().unwrap()
}

/// Every row of the run's CSV as column name → value.
fn rows(dir: &Path) -> Vec<std::collections::HashMap<String, String>> {
    common::csv_rows(dir)
}

const QUANT_SPEC: &str = r#"name = "tiny_quant"
question = "Do quant peers run beside the formats?"
claims = ["C16"]
family = "quant"
variants = ["fused"]
reps = 4

[grid]
format = ["f32", "q8_0", "q4_0"]
shape = ["8x64"]
weights = ["gaussian"]
batch = [1, 2]

[report]
peer = "good_mm"

[plot]
x = "batch"
panel = "shape"
series = "format"
y = { "*" = "median_ms" }
"#;

#[test]
fn quant_peers_are_checked_against_the_reference_and_our_bytes() {
    if !python_present() {
        eprintln!("SKIPPED: python3 is not on PATH (the test peers are Python scripts)");
        return;
    }
    let t = setup("quant", "tiny_quant", QUANT_SPEC);
    let peers = t.join("peers");
    let mm = r#"modes = ["matmul"]
options = { dtype = ["f32"] }"#;
    let q = "modes = [\"quantize\"]\nformats = [\"q8_0\"]";
    let py = |op: &'static str, behave: &'static str| {
        ["python3", PYQUANT, "--op", op, "--behave", behave]
    };
    register(&peers, "good_mm", "quant", &py("matmul", "ok"), 30.0, mm);
    register(
        &peers,
        "wrong_mm",
        "quant",
        &py("matmul", "wrong"),
        30.0,
        mm,
    );
    register(&peers, "good_q", "quant", &py("quantize", "ok"), 30.0, q);
    register(
        &peers,
        "wrong_q",
        "quant",
        &py("quantize", "wrong"),
        30.0,
        q,
    );
    let args = [
        "--peer",
        "good_mm:dtype=f32",
        "--peer",
        "wrong_mm",
        "--peer",
        "good_q",
        "--peer",
        "wrong_q",
    ];
    let out = exp(&t, "tiny_quant", &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the wrong peers fail the run:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let rows = rows(&t.join("results/tiny_quant"));
    // Per batch: 3 formats of ours + 2 matmul peers; once: our q8_0 quantiser + 2 peers.
    assert_eq!(rows.len(), 2 * (3 + 2) + 3, "{rows:#?}");
    let find = |variant: &str, batch: &str| {
        rows.iter()
            .filter(|r| r["variant"] == variant && r["batch"] == batch)
            .collect::<Vec<_>>()
    };
    for batch in ["1", "2"] {
        let good = find("good_mm:dtype=f32", batch);
        assert_eq!(good.len(), 1);
        let g = good[0];
        assert_eq!(g["status"], "ok", "{g:?}");
        assert_eq!(g["op"], "matmul");
        assert_eq!(g["format"], "f32");
        assert!(
            g["peer_version"].contains(r#"{"dtype": "f32"}"#),
            "options reach the peer: {g:?}"
        );
        assert!(g["rel_l2_err"].parse::<f64>().unwrap() < 1e-5, "{g:?}");
        assert!(g["median_ms"].parse::<f64>().unwrap() > 0.0, "{g:?}");
        assert!(
            !g["speedup_vs_f32"].is_empty(),
            "a peer's time against our f32: {g:?}"
        );
        let wrong = find("wrong_mm", batch);
        assert_eq!(wrong[0]["status"], "fail", "{:?}", wrong[0]);
        assert!(wrong[0]["rel_l2_err"].parse::<f64>().unwrap() > 1e-2);
    }
    let quantize: Vec<_> = rows.iter().filter(|r| r["op"] == "quantize").collect();
    assert_eq!(
        quantize.len(),
        3,
        "q8_0 only: ours and two peers: {quantize:#?}"
    );
    for r in &quantize {
        assert_eq!(r["format"], "q8_0");
        assert_eq!(r["batch"], "0");
        assert!(r["median_ms"].parse::<f64>().unwrap() > 0.0, "{r:?}");
        match r["variant"].as_str() {
            "quantize" => assert_eq!(r["status"], "ok"),
            "good_q" => {
                assert_eq!(r["status"], "ok", "{r:?}");
                assert!(
                    r["note"].contains("bytes identical to ours (16 blocks)"),
                    "{r:?}"
                );
            }
            "wrong_q" => {
                assert_eq!(r["status"], "fail", "{r:?}");
                assert!(
                    r["note"].contains("1 of 16 blocks differ from ours (first: row 0 block 0)"),
                    "{r:?}"
                );
            }
            other => panic!("unexpected quantize row {other}"),
        }
    }
    // The report compares every row with the report's peer.
    let md = fs::read_dir(t.join("results/tiny_quant"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "md"))
        .unwrap();
    let md = fs::read_to_string(md).unwrap();
    assert!(md.contains("× good_mm:dtype=f32"), "{md}");
    assert!(md.contains("## Quantisers"), "{md}");
}

#[test]
fn bad_peer_options_are_one_line_and_write_nothing() {
    let t = setup("options", "tiny_quant", QUANT_SPEC);
    register(
        &t.join("peers"),
        "good_mm",
        "quant",
        &["python3", PYQUANT, "--op", "matmul"],
        30.0,
        "options = { dtype = [\"f32\", \"bf16\"] }",
    );
    for (peer, why) in [
        (
            "good_mm:dtype=f64",
            "option dtype='f64' is not one of f32, bf16",
        ),
        (
            "good_mm:threads=4",
            "has no option 'threads' (it takes: dtype)",
        ),
        ("good_mm:dtype", "bad variant"),
    ] {
        let out = exp(&t, "tiny_quant", &["--peer", peer]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{peer}: {err}");
        assert!(err.contains(why), "{peer}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(!t.join("results/tiny_quant").exists());
    }
}

const SMOLLM2: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../models/cache/SmolLM2-135M-Instruct.Q4_1.gguf"
);

/// A decode spec over `model`.
fn decode_spec(model: &str) -> String {
    format!(
        r#"name = "tiny_decode"
question = "Does a decode peer run beside the model?"
claims = ["C1"]
family = "decode"
variants = ["model"]

[grid]
model = ["{model}"]
weights = ["native", "q8_0"]
matmul = ["fused"]
batch = [1, 2]
context = [8]
steps = [2]
prefill_tokens = [16]

[report]
peer = "pydecode"

[plot]
x = "batch"
panel = "matmul"
series = "weights"
y = {{ "*" = "tokens_per_s" }}
"#
    )
}

/// SmolLM2's path, or `None` after saying why the test skips.
fn smollm2() -> Option<&'static str> {
    if !python_present() {
        eprintln!("SKIPPED: python3 is not on PATH (the test peer is a Python script)");
        return None;
    }
    if !Path::new(SMOLLM2).exists() {
        eprintln!("SKIPPED: {SMOLLM2} is absent (run scripts/fetch-models.sh)");
        return None;
    }
    Some(SMOLLM2)
}

/// Registers pydecode (its check's tokens from our `harness generate`, swapped if `corrupt`).
fn register_pydecode(t: &TempDir, log: &Path, corrupt: bool) {
    let log_s = log.display().to_string();
    let mut command = vec!["python3", PYDECODE, "--log", &log_s, "--harness", BIN];
    if corrupt {
        command.push("--corrupt");
    }
    register(
        &t.join("peers"),
        "pydecode",
        "decode",
        &command,
        60.0,
        "modes = [\"decode\", \"prefill\"]",
    );
}

#[test]
fn decode_peers_alternate_with_ours_where_they_serve() {
    let Some(model) = smollm2() else { return };
    let t = setup("decode", "tiny_decode", &decode_spec(model));
    let log = t.join("decode.log");
    register_pydecode(&t, &log, false);
    let out = exp(&t, "tiny_decode", &["--peer", "pydecode"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let rows = rows(&t.join("results/tiny_decode"));
    // Ours: 2 weights x (2 batches + 1 prefill); the peer: native only, 3 points.
    assert_eq!(rows.len(), 2 * 3 + 3, "{rows:#?}");
    let peer: Vec<_> = rows.iter().filter(|r| r["variant"] == "pydecode").collect();
    assert_eq!(peer.len(), 3);
    for r in &peer {
        assert_eq!(r["weights"], "native", "{r:?}");
        assert_eq!(r["peer_version"], "pydecode 1.0 (test peer)");
        match (r["phase"].as_str(), r["batch"].as_str()) {
            ("decode", "1") | ("prefill", "1") => {
                assert_eq!(r["status"], "ok", "{r:?}");
                assert_eq!(r["reps"], "3", "one sample per round of ours: {r:?}");
                // Our own greedy tokens, scored by the same model and threads: no margin.
                assert!(r["note"].starts_with("checked: "), "{r:?}");
                assert!(r["note"].contains("worst margin 0.000 logits"), "{r:?}");
                assert!(r["tokens_per_s"].parse::<f64>().unwrap() > 0.0);
            }
            ("decode", "2") => {
                assert_eq!(r["status"], "unsupported", "{r:?}");
                assert!(r["note"].contains("one sequence"), "{r:?}");
            }
            other => panic!("unexpected peer row {other:?}"),
        }
    }
    // With a peer live, decode runs 3 passes over the batch list (2 steps each), the batch the
    // peer does not serve too, so every batch's samples span the run; without one (q8_0), 1.
    let ours = |w: &str, phase: &str, b: &str| {
        rows.iter()
            .find(|r| {
                r["variant"] == "model"
                    && r["weights"] == w
                    && r["phase"] == phase
                    && r["batch"] == b
            })
            .unwrap()["reps"]
            .clone()
    };
    assert_eq!(ours("native", "decode", "1"), "6");
    assert_eq!(ours("native", "decode", "2"), "6");
    assert_eq!(ours("q8_0", "decode", "1"), "2");
    // The peer's timed calls: 3 at decode batch 1, then 3 at the prefill, each after a load.
    let lines: Vec<String> = fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let times: Vec<&String> = lines.iter().filter(|l| l.contains(" time ")).collect();
    assert_eq!(
        times,
        [
            "pydecode time decode 1",
            "pydecode time decode 1",
            "pydecode time decode 1",
            "pydecode time prefill 1",
            "pydecode time prefill 1",
            "pydecode time prefill 1"
        ],
        "{lines:#?}"
    );
    let md = fs::read_dir(t.join("results/tiny_decode"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "md"))
        .unwrap();
    let md = fs::read_to_string(md).unwrap();
    assert!(md.contains("## Against pydecode"), "{md}");
    assert!(md.contains("pydecode decodes one sequence"), "{md}");
}

/// A decode run of `model` beside pydecode (`corrupt`: its check's words swapped): the rows
/// and pydecode's request log.
fn decode_run(
    test: &str,
    model: &str,
    corrupt: bool,
) -> (Vec<std::collections::HashMap<String, String>>, String) {
    let t = setup(test, "tiny_decode", &decode_spec(model));
    let log = t.join("decode.log");
    register_pydecode(&t, &log, corrupt);
    let out = exp(&t, "tiny_decode", &["--peer", "pydecode"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let log_text = fs::read_to_string(&log).unwrap();
    (rows(&t.join("results/tiny_decode")), log_text)
}

#[test]
fn a_decode_peer_is_timed_only_once_its_tokens_agree_with_ours() {
    let Some(model) = smollm2() else { return };
    // Its continuation with two words swapped: our model is sure of the first, so it fails.
    let (got, log_text) = decode_run("decode_corrupt", model, true);
    for r in got
        .iter()
        .filter(|r| r["variant"] == "pydecode" && r["batch"] == "1")
    {
        assert_eq!(r["status"], "fail", "{r:?}");
        assert_eq!(r["reps"], "0", "{r:?}");
        assert!(
            r["note"].contains("worst margin") && r["note"].contains("(bound 0.7)"),
            "{r:?}"
        );
    }
    assert!(
        !log_text.contains(" time "),
        "a failed peer is never timed: {log_text}"
    );
    assert!(
        log_text.contains("pydecode run "),
        "the check ran: {log_text}"
    );
    // A preset has no tokenizer: nothing to compare the peer's text with, so no times either.
    let (got, log_text) = decode_run("decode_preset", "tiny-gqa", false);
    for r in got
        .iter()
        .filter(|r| r["variant"] == "pydecode" && r["batch"] == "1")
    {
        assert_eq!(r["status"], "error", "{r:?}");
        assert!(r["note"].contains("no tokenizer"), "{r:?}");
    }
    assert!(
        !log_text.contains(" time ") && !log_text.contains(" run "),
        "{log_text}"
    );
}
