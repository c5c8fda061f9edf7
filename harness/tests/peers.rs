//! Peers end to end through the real binary, with a test peer in plain Python
//! (`tests/peers/pyattn.py`): a correct peer passes and is timed, a wrong one is `fail`, one
//! that crashes, hangs past its timeout or prints garbage is `error` and the run goes on, a
//! missing one is `unavailable` with its install line; the inputs reach the peer bit for bit;
//! rounds alternate between peers; bad peer names are one line, exit 2, nothing written.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
#[path = "common/peers.rs"]
mod peer_setup;
use common::{run_csv, TempDir};
use peer_setup::python_present;

const BIN: &str = env!("CARGO_BIN_EXE_harness");
const PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/pyattn.py");
const REPO_ROOFLINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../results/roofline");

/// Registers an attention peer `name` running `command` (timeout `timeout_s`).
fn register(peers: &Path, name: &str, command: &[&str], timeout_s: f64) {
    peer_setup::register(peers, name, "attention", command, timeout_s, "");
}

/// A checkout-like folder: experiments/tiny_peers.toml, results/roofline seeded, peers/.
fn setup(test: &str) -> TempDir {
    let t = TempDir::new("peers", test);
    fs::create_dir_all(t.join("experiments")).unwrap();
    fs::write(
        t.join("experiments/tiny_peers.toml"),
        r#"name = "tiny_peers"
question = "Do peers run beside the variants?"
claims = ["C8"]
family = "attention"
variants = ["naive", "flash2"]
reps = 4

[grid]
mode = ["decode", "prefill"]
dtype = ["f32"]
batch = [1]
q_heads = [4]
heads = ["4/2"]
kv_len = [12]
head_dim = [8]

[plot]
x = "kv_len"
panel = "mode"
series = "variant"
y = { "*" = "median_ms" }

[report]
baseline = "good"
"#,
    )
    .unwrap();
    let roof = t.join("results/roofline");
    fs::create_dir_all(&roof).unwrap();
    for e in fs::read_dir(REPO_ROOFLINE).into_iter().flatten().flatten() {
        let _ = fs::copy(e.path(), roof.join(e.file_name()));
    }
    t
}

fn exp(t: &TempDir, extra: &[&str]) -> Output {
    let mut args = vec![
        "exp".to_string(),
        "tiny_peers".into(),
        "--threads".into(),
        "1".into(),
        "--experiments-dir".into(),
        t.join("experiments").display().to_string(),
        "--results-dir".into(),
        t.join("results").display().to_string(),
        "--peers-dir".into(),
        t.join("peers").display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Command::new(BIN).args(&args).output().unwrap()
}

/// The rows of the run's CSV as (variant, mode, status, note, peer_version, median_ms, seed).
fn rows(t: &TempDir) -> Vec<Vec<String>> {
    let mut r = run_csv(&t.join("results/tiny_peers"));
    let h = r.headers().unwrap().clone();
    let col = |n: &str| h.iter().position(|c| c == n).unwrap();
    let cols = [
        col("variant"),
        col("mode"),
        col("status"),
        col("note"),
        col("peer_version"),
        col("median_ms"),
        col("seed"),
        col("rel_l2_err"),
    ];
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            cols.iter().map(|&c| rec[c].to_string()).collect()
        })
        .collect()
}

#[test]
fn peers_are_checked_timed_and_their_failures_recorded() {
    if !python_present() {
        eprintln!("SKIPPED: python3 is not on PATH (the test peer is a Python script)");
        return;
    }
    let t = setup("statuses");
    let peers = t.join("peers");
    let log = t.join("good.log");
    let log_s = log.display().to_string();
    register(
        &peers,
        "good",
        &["python3", PEER, "--name", "good", "--log", &log_s],
        30.0,
    );
    register(
        &peers,
        "twin",
        &["python3", PEER, "--name", "twin", "--log", &log_s],
        30.0,
    );
    for behave in ["wrong", "crash", "hang", "garbage"] {
        register(&peers, behave, &["python3", PEER, "--behave", behave], 2.0);
    }
    register(&peers, "missing", &["/nonexistent/python", PEER], 2.0);
    let mut args = vec![];
    for p in [
        "good", "twin", "wrong", "crash", "hang", "garbage", "missing",
    ] {
        args.push("--peer");
        args.push(p);
    }
    let out = exp(&t, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a wrong peer fails the run:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let rows = rows(&t);
    assert_eq!(rows.len(), 2 * (2 + 7), "2 modes x (2 variants + 7 peers)");
    for r in &rows {
        let (variant, status, note) = (&r[0], &r[2], &r[3]);
        let base = variant.split(':').next().unwrap();
        let want = match base {
            "naive" | "flash2" | "good" | "twin" => "ok",
            "wrong" => "fail",
            "crash" | "hang" | "garbage" => "error",
            "missing" => "unavailable",
            other => panic!("unexpected row {other}"),
        };
        assert_eq!(status, want, "{variant} {}: {note}", r[1]);
        match variant.as_str() {
            "good" | "twin" => {
                assert_eq!(r[4], "pyattn 1.0 (test peer)");
                assert!(r[5].parse::<f64>().unwrap() > 0.0, "timed: {r:?}");
                assert!(r[7].parse::<f64>().unwrap() < 1e-5, "checked: {r:?}");
            }
            "wrong" => assert!(r[7].parse::<f64>().unwrap() > 1e-2),
            "crash" => assert!(note.contains("crashing on purpose"), "{note}"),
            "hang" => assert!(note.contains("no answer within"), "{note}"),
            "garbage" => assert!(note.contains("not JSON"), "{note}"),
            "missing" => assert!(note.contains("pip install missing-test"), "{note}"),
            _ => assert!(r[4].is_empty()),
        }
    }
    // Rounds alternate: good and twin take turns, 4 rounds beside each of the 2 variants at
    // each of the 2 points.
    let ops: Vec<String> = fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.ends_with(" time"))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(ops.len(), 2 * 2 * 4 * 2, "{ops:?}");
    for pair in ops.chunks(2) {
        assert_eq!(pair, ["good", "twin"], "rounds alternate: {ops:?}");
    }
    // The last point's inputs reached the peer bit for bit: its q is the seeded q.
    let case = PathBuf::from(format!("{log_s}.case"));
    let bytes = fs::read(&case).expect("the good peer copies its last case file");
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let q = st.tensor("q").unwrap();
    assert_eq!(q.shape(), [1, 4, 12, 8]);
    let seed: u64 = rows.iter().rev().find(|r| r[0] == "good").unwrap()[6]
        .parse()
        .unwrap();
    let shape = kernel_attention::AttentionShape::new(1, 4, 2, 12, 12, 8, true);
    let want = kernel_attention::AttentionInputs::random(&shape, kernel_common::DType::F32, seed)
        .q
        .to_f32();
    let got: Vec<f32> = q
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(
        got.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "q differs from the seeded inputs"
    );
}

#[test]
fn bad_peer_names_are_one_line_and_write_nothing() {
    let t = setup("bad_names");
    fs::create_dir_all(t.join("peers")).unwrap();
    let out = exp(&t, &["--peer", "no_such_peer"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown peer 'no_such_peer'"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!t.join("results/tiny_peers").exists());
    // A peer of another family.
    let dir = t.join("peers/linear");
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("peer.toml"),
        "name = \"linear\"\nabout = \"x\"\nfamilies = [\"quant\"]\ncommand = [\"python3\"]\ninstall = \"x\"\n",
    )
    .unwrap();
    let out = exp(&t, &["--peer", "linear"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("serves quant experiments"));
    assert!(!t.join("results/tiny_peers").exists());
}

#[test]
fn peers_obey_the_spec_limits() {
    if !python_present() {
        eprintln!("SKIPPED: python3 is not on PATH (the test peer is a Python script)");
        return;
    }
    let t = setup("limits");
    let spec = t.join("experiments/tiny_peers.toml");
    let text = fs::read_to_string(&spec).unwrap();
    fs::write(
        &spec,
        text.replace("[plot]", "[limits]\nmax_gflop = 1e-9\n\n[plot]"),
    )
    .unwrap();
    register(&t.join("peers"), "good", &["python3", PEER], 30.0);
    let out = exp(&t, &["--peer", "good"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in rows(&t) {
        assert_eq!(r[2], "skipped", "{r:?}");
        assert!(r[3].contains("max_gflop"), "{r:?}");
    }
}

#[test]
fn quant_peers_that_are_not_installed_are_unavailable_never_error() {
    // The real quant peers (scripts/peers) with a Python that does not exist: every peer row,
    // the matmul and the quantize ones, says `unavailable` with its install line.
    let t = TempDir::new("peers", "quant_unavailable");
    let out = Command::new(BIN)
        .args([
            "exp",
            "quant_tradeoff",
            "--quick",
            "--reps",
            "1",
            "--threads",
            "1",
            "--set",
            "shape=256x512",
            "--results-dir",
            t.join("results").to_str().unwrap(),
        ])
        .env("WORKBENCH_PEER_PYTHON", "/nonexistent/python")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let mut r = run_csv(&t.join("results/quant_tradeoff"));
    let h = r.headers().unwrap().clone();
    let col = |n: &str| h.iter().position(|c| c == n).unwrap();
    let (variant, op, status, note) = (col("variant"), col("op"), col("status"), col("note"));
    let mut seen = std::collections::BTreeSet::new();
    for rec in r.records() {
        let rec = rec.unwrap();
        let v = &rec[variant];
        if v.starts_with("gguf_py") || v.starts_with("torch_linear") {
            seen.insert((
                v.split(':').next().unwrap().to_string(),
                rec[op].to_string(),
            ));
            assert_eq!(
                &rec[status], "unavailable",
                "{v} {}: {}",
                &rec[op], &rec[note]
            );
            assert!(rec[note].contains("install with"), "{}", &rec[note]);
        }
    }
    assert!(
        seen.iter()
            .any(|(v, op)| v == "gguf_py" && op == "quantize"),
        "a gguf_py quantize row: {seen:?}"
    );
}
