//! `harness replay` end to end on case files written by third-party code (PyTorch SDPA, paged
//! decode over SDPA, a Mixtral-style MoE and plain PyTorch ports of the MoE routing
//! conventions — DeepSpeed-MoE, Tutel, Switch, rerouting, expert choice — in tests/cases, the
//! `gguf` package's quantisers in kernels/quant/tests/data), on a tampered output and on a
//! convention the file was not written in (exit 1), and on corrupted files (exit 2 with one
//! line).

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
fn transformers_sliding_window_softcap_case_agrees() {
    // transformers' sliding-window mask (Mistral, Gemma-3) and Gemma-2's soft-capped eager
    // attention, 12 new tokens over 40: every variant, paged included, agrees.
    let path = repo("tests/cases/hf_sliding_window_softcap.safetensors");
    let (code, rows) = json_rows(&[&path], &[]);
    assert_eq!(code, 0, "{rows:#?}");
    for v in ["naive", "flash2", "paged"] {
        assert_eq!(status_of(&rows, v), vec!["agree"], "{v}: {rows:#?}");
    }
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

/// The routing-convention cases of tests/cases/make_moe_conventions.py.
const MOE_CONVENTIONS: [&str; 7] = [
    "moe_deepspeed_top2",
    "moe_deepspeed_min_capacity",
    "moe_tutel_top2",
    "moe_deepspeed_topk_probs",
    "moe_switch_top1",
    "moe_reroute_top2",
    "moe_expert_choice",
];

#[test]
fn pytorch_moe_convention_cases_agree() {
    for case in MOE_CONVENTIONS {
        let path = repo(&format!("tests/cases/{case}.safetensors"));
        let (code, rows) = json_rows(&[&path], &[]);
        assert_eq!(code, 0, "{case}: {rows:#?}");
        for v in ["grouped", "naive"] {
            assert_eq!(status_of(&rows, v), vec!["agree"], "{case} {v}: {rows:#?}");
        }
        for r in rows.iter().filter(|r| r["status"] == "agree") {
            assert!(
                r["vs_stored_rel_l2"].as_f64().unwrap() < 1e-5,
                "{case}: {r}"
            );
        }
    }
}

#[test]
fn a_moe_case_replayed_in_another_convention_disagrees() {
    // (case, metadata key, value): each a neighbouring convention whose decisions or weights
    // differ on that file, so the cases tell the conventions apart.
    for (case, key, value) in [
        ("moe_deepspeed_top2", "policy", "order"),
        ("moe_deepspeed_top2", "norm", "renormalize"),
        ("moe_deepspeed_min_capacity", "min_capacity", "1"),
        ("moe_tutel_top2", "norm", "renormalize_kept"),
        ("moe_deepspeed_topk_probs", "policy", "gshard"),
        ("moe_switch_top1", "norm", "renormalize"),
        ("moe_reroute_top2", "policy", "gshard"),
        ("moe_expert_choice", "norm", "renormalize_kept"),
    ] {
        let path = rewrite_case(case, &format!("{case}-{key}"), |_, m| {
            m.insert(key.into(), value.into());
        });
        let (code, rows) = json_rows(&[&path], &["--variant", "grouped"]);
        assert_eq!(code, 1, "{case} as {key}={value}: {rows:#?}");
        assert_eq!(status_of(&rows, "grouped"), vec!["disagree"], "{case}");
        std::fs::remove_file(path).unwrap();
    }
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

/// A tensor of a case being rewritten: name, dtype, shape, bytes.
type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

/// The committed SDPA case with `edit` applied to its tensors and metadata, written to a temp
/// file.
fn rewrite(name: &str, edit: impl FnOnce(&mut Tensors, &mut HashMap<String, String>)) -> PathBuf {
    rewrite_case("sdpa_gqa_causal", name, edit)
}

/// The committed case `tests/cases/{case}.safetensors` with `edit` applied, in a temp file.
fn rewrite_case(
    case: &str,
    name: &str,
    edit: impl FnOnce(&mut Tensors, &mut HashMap<String, String>),
) -> PathBuf {
    let bytes = std::fs::read(repo(&format!("tests/cases/{case}.safetensors"))).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta = header.metadata().clone().unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Tensors = st
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
                m.insert("family".into(), "speculative".into());
            }),
            "cannot be replayed",
        ),
    ];
    // A moe case's routing metadata: unknown names, expert choice with a k, a floor of 0
    // slots, a weight rule expert choice cannot apply.
    let moe = |name: &str, edits: &[(&str, &str)], drop: &[&str]| {
        let (edits, drop): (Vec<(String, String)>, Vec<String>) = (
            edits
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            drop.iter().map(|k| k.to_string()).collect(),
        );
        rewrite_case("moe_deepspeed_top2", name, move |_, m| {
            for k in drop {
                m.remove(&k);
            }
            m.extend(edits);
        })
    };
    let mut cases = cases;
    cases.extend([
        (
            moe("policy", &[("policy", "random")], &[]),
            "policy 'random'",
        ),
        (moe("norm", &[("norm", "softmax")], &[]), "norm 'softmax'"),
        (
            moe("routing", &[("routing", "both")], &[]),
            "routing='both'",
        ),
        (
            moe(
                "ec_k",
                &[("routing", "expert_choice"), ("norm", "raw")],
                &["policy"],
            ),
            "takes no top_k",
        ),
        (
            moe("min_cap", &[("min_capacity", "-1")], &[]),
            "min_capacity='-1'",
        ),
        (
            moe(
                "zero_slots",
                &[
                    ("routing", "expert_choice"),
                    ("norm", "raw"),
                    ("capacity", "0.01"),
                    ("min_capacity", "0"),
                ],
                &["top_k", "policy"],
            ),
            "0 slots",
        ),
        (
            moe(
                "ec_norm",
                &[("routing", "expert_choice"), ("norm", "renormalize")],
                &["top_k", "policy"],
            ),
            "no top-k to renormalise",
        ),
    ]);
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
