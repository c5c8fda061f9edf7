//! `harness replay` end to end on case files written by third-party code (PyTorch SDPA, paged
//! decode over SDPA and a Mixtral-style MoE in tests/cases, the `gguf` package's quantisers in
//! kernels/quant/tests/data), on a tampered output (exit 1) and on corrupted files (exit 2
//! with one line).

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_harness");

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn replay(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("replay")
        .args(["--reps", "2", "--threads", "2"])
        .args(args)
        .output()
        .expect("the harness binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Rows printed by `--format json`.
fn json_rows(files: &[&Path], extra: &[&str]) -> (i32, Vec<serde_json::Value>) {
    let mut args: Vec<&str> = files.iter().map(|p| p.to_str().unwrap()).collect();
    args.extend(["--format", "json"]);
    args.extend(extra);
    let out = replay(&args);
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{stderr}", text(&out.stdout)));
    (out.status.code().unwrap(), rows.as_array().unwrap().clone())
}

fn status_of<'a>(rows: &'a [serde_json::Value], variant: &str) -> Vec<&'a str> {
    rows.iter()
        .filter(|r| r["variant"].as_str().unwrap().starts_with(variant))
        .map(|r| r["status"].as_str().unwrap())
        .collect()
}

#[test]
fn pytorch_attention_cases_agree() {
    for case in ["sdpa_gqa_causal", "sdpa_gqa_causal_bf16"] {
        let path = repo(&format!("tests/cases/{case}.safetensors"));
        let (code, rows) = json_rows(&[&path], &[]);
        assert_eq!(code, 0, "{case}: {rows:#?}");
        for v in ["naive", "flash2"] {
            assert_eq!(status_of(&rows, v), vec!["agree"], "{case} {v}: {rows:#?}");
        }
        // PyTorch's own output is within tolerance of the f64 reference.
        let stored = &rows
            .iter()
            .find(|r| r["variant"] == "(stored out)")
            .unwrap();
        assert!(
            stored["note"].as_str().unwrap().contains("within"),
            "{stored}"
        );
        // Paged decode serves at most 16 new tokens: 97 queries are unsupported, not wrong.
        assert_eq!(status_of(&rows, "paged"), vec!["unsupported"]);
    }
}

#[test]
fn pytorch_paged_case_agrees() {
    let path = repo("tests/cases/paged_decode_sdpa.safetensors");
    let (code, rows) = json_rows(&[&path], &[]);
    assert_eq!(code, 0, "{rows:#?}");
    assert_eq!(status_of(&rows, "paged"), vec!["agree", "agree"]);
    for r in rows.iter().filter(|r| r["status"] == "agree") {
        assert!(r["vs_stored_rel_l2"].as_f64().unwrap() < 1e-5, "{r}");
        assert!(r["median_ms"].as_f64().unwrap() > 0.0, "{r}");
    }
}

#[test]
fn pytorch_moe_case_agrees() {
    let path = repo("tests/cases/moe_mixtral_top2.safetensors");
    let (code, rows) = json_rows(&[&path], &[]);
    assert_eq!(code, 0, "{rows:#?}");
    assert_eq!(status_of(&rows, "grouped"), vec!["agree"]);
    assert_eq!(status_of(&rows, "naive"), vec!["agree"]);
    let stored = rows
        .iter()
        .find(|r| r["variant"] == "(stored out)")
        .unwrap();
    assert!(
        stored["note"].as_str().unwrap().contains("within"),
        "{stored}"
    );
}

#[test]
fn gguf_cases_are_byte_exact() {
    let files: Vec<PathBuf> = ["q8_0", "q4_0", "q4_1"]
        .iter()
        .map(|f| repo(&format!("kernels/quant/tests/data/gguf_{f}.safetensors")))
        .collect();
    let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let (code, rows) = json_rows(&refs, &[]);
    assert_eq!(code, 0, "{rows:#?}");
    assert_eq!(status_of(&rows, "quantize"), vec!["agree"; 3]);
    assert_eq!(status_of(&rows, "dequantize"), vec!["agree"; 3]);
    for r in rows.iter().filter(|r| r["variant"] == "quantize") {
        assert!(
            r["note"].as_str().unwrap().contains("bytes identical"),
            "{r}"
        );
    }
    // --variant narrows the rows.
    let (code, rows) = json_rows(&refs[..1], &["--variant", "dequantize"]);
    assert_eq!(code, 0);
    assert_eq!(rows.len(), 1, "{rows:#?}");
}

/// The committed SDPA case with `edit` applied to its tensors and metadata, written to a temp
/// file.
fn rewrite(
    name: &str,
    edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>, &mut HashMap<String, String>),
) -> PathBuf {
    let bytes = std::fs::read(repo("tests/cases/sdpa_gqa_causal.safetensors")).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta = header.metadata().clone().unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut tensors, &mut meta);
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let out = safetensors::serialize(views, &Some(meta)).unwrap();
    let path =
        std::env::temp_dir().join(format!("replay-{}-{name}.safetensors", std::process::id()));
    std::fs::write(&path, out).unwrap();
    path
}

#[test]
fn a_wrong_stored_output_is_exit_1() {
    let path = rewrite("tampered", |t, _| {
        let out = t.iter_mut().find(|x| x.0 == "out").unwrap();
        let v = f32::from_le_bytes(out.3[..4].try_into().unwrap()) + 0.5;
        out.3[..4].copy_from_slice(&v.to_le_bytes());
    });
    let (code, rows) = json_rows(&[&path], &["--variant", "flash2"]);
    assert_eq!(code, 1, "{rows:#?}");
    assert_eq!(status_of(&rows, "flash2"), vec!["disagree"]);
    let stored = rows
        .iter()
        .find(|r| r["variant"] == "(stored out)")
        .unwrap();
    assert!(
        stored["note"].as_str().unwrap().contains("OUTSIDE"),
        "{stored}"
    );
    std::fs::remove_file(path).unwrap();
}

fn expect_malformed(path: &Path, needle: &str) {
    let out = replay(&[path.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}: {stderr}", path.display());
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "want one line, got:\n{stderr}");
    assert!(lines[0].starts_with("error: case "), "{stderr}");
    assert!(lines[0].contains(needle), "want '{needle}' in: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "nothing runs when a file is malformed"
    );
}

#[test]
fn corrupted_cases_are_one_line_exit_2() {
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            rewrite("renamed", |t, _| {
                t.iter_mut().find(|x| x.0 == "q").unwrap().0 = "query".into()
            }),
            "no tensor 'q'",
        ),
        (
            rewrite("rank", |t, _| {
                let q = t.iter_mut().find(|x| x.0 == "q").unwrap();
                q.2 = vec![q.2[0] * q.2[1], q.2[2], q.2[3]];
            }),
            "expected rank 4",
        ),
        (
            rewrite("shapes", |t, _| {
                let v = t.iter_mut().find(|x| x.0 == "v").unwrap();
                let n = v.3.len() / 2;
                v.3.truncate(n);
                v.2[2] /= 2;
                v.2[2] = v.3.len() / 4 / (v.2[0] * v.2[1] * v.2[3]);
            }),
            "shapes do not fit",
        ),
        (
            rewrite("meta", |_, m| {
                m.insert("causal".into(), "maybe".into());
            }),
            "causal='maybe'",
        ),
        (
            rewrite("family", |_, m| {
                m.remove("family");
            }),
            "no \"family\"",
        ),
        (
            rewrite("moe", |_, m| {
                m.insert("family".into(), "spec".into());
            }),
            "cannot be replayed",
        ),
    ];
    for (path, needle) in &cases {
        expect_malformed(path, needle);
        std::fs::remove_file(path).unwrap();
    }
    // A truncated file and a file that is not safetensors at all.
    let bytes = std::fs::read(repo("tests/cases/sdpa_gqa_causal.safetensors")).unwrap();
    let cut = std::env::temp_dir().join(format!("replay-{}-cut.safetensors", std::process::id()));
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    expect_malformed(&cut, "not a valid safetensors file");
    std::fs::write(&cut, b"hello").unwrap();
    expect_malformed(&cut, "not a valid safetensors file");
    std::fs::remove_file(&cut).unwrap();
    expect_malformed(Path::new("/no/such/case.safetensors"), "cannot read");
}
