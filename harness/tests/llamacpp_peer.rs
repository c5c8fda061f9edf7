//! The `llamacpp` peer script (`scripts/peers/llamacpp/peer.py`) over its JSON-line protocol,
//! with stand-in `llama-bench` and `llama-batched-bench` executables (no llama.cpp build is
//! needed): batch 1 times through llama-bench (ms per generated token), batch B > 1 through
//! llama-batched-bench with `-npp CONTEXT -ntg STEPS -npl B -c B·(CONTEXT + STEPS)` (ms per
//! step of B tokens, from its jsonl `t_tg`), and a batch point without llama-batched-bench is
//! `unsupported`, not an error; the check's `run` answers llama-simple's stdout and its
//! decoded count, and without llama-simple says `unsupported`.

mod common;

use common::TempDir;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

const PEER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../scripts/peers/llamacpp/peer.py"
);

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A scratch folder with the stand-ins' `build-<build>/bin`, or None (and a SKIPPED line)
/// without python3, which the peer script needs.
fn builds(name: &str, build: &str) -> Option<(TempDir, std::path::PathBuf)> {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED: python3 is not on PATH (the peer is a Python script)");
        return None;
    }
    let t = TempDir::new("llamacpp_peer", name);
    let bin = t.join(&format!("build-{build}/bin"));
    std::fs::create_dir_all(&bin).unwrap();
    Some((t, bin))
}

/// Sends `requests` to a fresh peer over `dir`'s builds and returns its replies.
fn talk(dir: &Path, requests: &[Value]) -> Vec<Value> {
    let mut child = Command::new("python3")
        .arg(PEER)
        .env("WORKBENCH_LLAMACPP_DIR", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut replies = vec![];
    for r in requests {
        writeln!(stdin, "{r}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        replies.push(serde_json::from_str(&line).unwrap());
    }
    drop(stdin);
    child.wait().unwrap();
    replies
}

#[test]
fn batched_points_go_through_llama_batched_bench() {
    let Some((t, bin)) = builds("batched", "native") else {
        return;
    };
    let args_log = t.join("batched.args");
    // 8 ms for the 8 generated tokens of llama-bench; 0.2 s for 8 steps of 4 sequences.
    script(
        &bin.join("llama-bench"),
        r#"echo '[{"samples_ns": [8000000], "avg_ts": 1000.0}]'"#,
    );
    script(
        &bin.join("llama-batched-bench"),
        &format!(
            r#"echo "$@" > {}
echo 'main: n_kv_max = 96' >&2
echo '{{"pp": 16, "tg": 8, "pl": 4, "n_kv": 96, "t_pp": 0.1, "speed_pp": 640.0, "t_tg": 0.2, "speed_tg": 160.0, "t": 0.3, "speed": 320.0}}'"#,
            args_log.display()
        ),
    );
    let model = t.join("m.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    let load = |batch: usize| {
        json!({"op": "load", "inputs": model.display().to_string(), "threads": 2, "device": "cpu",
               "point": {"phase": "decode", "batch": batch, "context": 16, "steps": 8}})
    };
    let time = json!({"op": "time", "reps": 1});
    let hello = json!({"op": "hello", "options": {"build": "native"}});
    let r = talk(
        &t.0,
        &[hello.clone(), load(4), time.clone(), load(1), time.clone()],
    );
    assert_eq!(r[0]["ok"], true, "{r:?}");
    assert_eq!(r[1]["ok"], true, "{r:?}");
    // 0.2 s over 8 steps: 25 ms per step of 4 tokens.
    assert_eq!(r[2]["times_ms"], json!([25.0]), "{r:?}");
    assert_eq!(r[2]["tokens_per_s"], json!([160.0]), "{r:?}");
    let args = std::fs::read_to_string(&args_log).unwrap();
    for want in [
        "-npp 16",
        "-ntg 8",
        "-npl 4",
        "-c 96",
        "-t 2",
        "--output-format jsonl",
    ] {
        assert!(args.contains(want), "{want} in {args}");
    }
    // Batch 1: llama-bench's 8 ms over 8 tokens.
    assert_eq!(r[4]["times_ms"], json!([1.0]), "{r:?}");
    // Without llama-batched-bench a batch point is unsupported; batch 1 still loads.
    std::fs::remove_file(bin.join("llama-batched-bench")).unwrap();
    let r = talk(&t.0, &[hello, load(4), load(1)]);
    assert!(
        r[1]["unsupported"]
            .as_str()
            .is_some_and(|w| w.contains("llama-batched-bench")),
        "{r:?}"
    );
    assert_eq!(r[2]["ok"], true, "{r:?}");
}

#[test]
fn a_verify_point_is_a_k_token_prompt_at_the_contexts_depth() {
    let Some((t, bin)) = builds("verify", "native") else {
        return;
    };
    let args_log = t.join("bench.args");
    // 6 ms for the whole 8-token step.
    script(
        &bin.join("llama-bench"),
        &format!(
            r#"echo "$@" > {}
echo '[{{"samples_ns": [6000000], "avg_ts": 1333.3}}]'"#,
            args_log.display()
        ),
    );
    let model = t.join("m.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    let r = talk(
        &t.0,
        &[
            json!({"op": "hello", "options": {"build": "native"}}),
            json!({"op": "load", "inputs": model.display().to_string(), "threads": 2,
                   "device": "cpu",
                   "point": {"phase": "verify", "batch": 1, "context": 16, "tokens": 8}}),
            json!({"op": "time", "reps": 1}),
        ],
    );
    assert_eq!(r[1]["ok"], true, "{r:?}");
    assert_eq!(r[2]["times_ms"], json!([6.0]), "{r:?}");
    let args = std::fs::read_to_string(&args_log).unwrap();
    for want in ["-p 8", "-n 0", "-d 16", "-t 2"] {
        assert!(args.contains(want), "{want} in {args}");
    }
}

#[test]
fn the_check_runs_llama_simple_on_the_prompt() {
    let Some((t, bin)) = builds("simple", "avx2") else {
        return;
    };
    script(&bin.join("llama-bench"), "exit 0");
    let args_log = t.join("simple.args");
    script(
        &bin.join("llama-simple"),
        &format!(
            r#"echo "$@" > {}
printf 'Hi there. Fine\n'
echo 'main: decoded 2 tokens in 0.01 s, speed: 200.00 t/s' >&2"#,
            args_log.display()
        ),
    );
    let model = t.join("m.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    let hello = json!({"op": "hello", "options": {"build": "avx2"}});
    let load = json!({"op": "load", "inputs": model.display().to_string(), "threads": 2,
                      "device": "cpu", "point": {"phase": "decode", "batch": 1, "context": 16, "steps": 8}});
    let run = json!({"op": "run", "check": {"prompt": "Hi there.", "tokens": 2}});
    let r = talk(&t.0, &[hello.clone(), load.clone(), run.clone()]);
    assert_eq!(r[2]["ok"], true, "{r:?}");
    assert_eq!(r[2]["text"], "Hi there. Fine\n", "{r:?}");
    assert_eq!(r[2]["decoded"], 2, "{r:?}");
    let args = std::fs::read_to_string(&args_log).unwrap();
    assert!(args.contains("-n 2 Hi there."), "{args}");
    assert!(args.contains(&format!("-m {}", model.display())), "{args}");
    std::fs::remove_file(bin.join("llama-simple")).unwrap();
    let r = talk(&t.0, &[hello, load, run]);
    assert!(
        r[2]["unsupported"]
            .as_str()
            .is_some_and(|w| w.contains("llama-simple")),
        "{r:?}"
    );
}
