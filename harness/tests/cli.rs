//! End-to-end checks of the real `harness` binary: bad input exits 2 with one `error:` line and writes nothing, a tiny experiment writes its CSV/JSON/MD/SVG with the expected rows, an interrupted run keeps its finished rows, and `check` and `list` work.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::TempDir;
#[path = "common/specs.rs"]
mod specs;
use specs::{decode_spec, TINY, TINY_KV, TINY_MOE, TINY_QUANT};

const BIN: &str = env!("CARGO_BIN_EXE_harness");
const REPO_ROOFLINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../results/roofline");

/// Kills a spawned harness if the test ends before it does.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn harness(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("the harness binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Creates `<results>/roofline/` and copies the repository's stored rooflines into it, so
/// `exp` needs no fresh measurement when one matches; returns the relative paths copied.
fn seed_roofline(results: &Path) -> Vec<PathBuf> {
    let dst = results.join("roofline");
    fs::create_dir_all(&dst).unwrap();
    let mut copied = vec![PathBuf::from("roofline")];
    if let Ok(entries) = fs::read_dir(REPO_ROOFLINE) {
        for e in entries.flatten() {
            if e.path().is_file() {
                fs::copy(e.path(), dst.join(e.file_name())).unwrap();
                copied.push(Path::new("roofline").join(e.file_name()));
            }
        }
    }
    copied.sort();
    copied
}

/// Every file and folder under `dir`, relative to it, sorted (empty when `dir` is absent).
fn entries_under(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().to_path_buf());
            if p.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = vec![];
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Files under `dir` (not recursive) with extension `ext`.
fn files_with_ext(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == ext))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Exit code 2, exactly one non-empty `error:` line on stderr mentioning `needle`
/// (case-insensitive), no panic, and nothing under `results` but the seeded rooflines.
fn assert_usage_error(out: &Output, what: &str, needle: &str, results: &Path, seeded: &[PathBuf]) {
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{what}: want exit 2, got {:?}; stderr:\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{what}: panic:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: want exactly one stderr line, got:\n{stderr}"
    );
    let line = lines[0];
    assert!(
        line.starts_with("error:") && line.len() > "error:".len() + 1,
        "{what}: want a non-empty 'error:' line, got: {line}"
    );
    assert!(
        line.to_lowercase().contains(&needle.to_lowercase()),
        "{what}: the error should mention '{needle}': {line}"
    );
    assert_eq!(
        entries_under(results),
        seeded,
        "{what}: bad input wrote under the results dir"
    );
}

/// A temp experiments folder holding `tiny.toml`, and a temp results folder with the
/// repository's rooflines copied in.
struct Setup {
    _tmp: TempDir,
    exps: PathBuf,
    results: PathBuf,
    seeded: Vec<PathBuf>,
}

impl Setup {
    fn new(test: &str) -> Setup {
        let tmp = TempDir::new("cli", test);
        let exps = tmp.join("experiments");
        let results = tmp.join("results");
        fs::create_dir_all(&exps).unwrap();
        fs::write(exps.join("tiny.toml"), TINY).unwrap();
        fs::write(exps.join("tinyq.toml"), TINY_QUANT).unwrap();
        fs::write(exps.join("tinymoe.toml"), TINY_MOE).unwrap();
        fs::write(exps.join("tinykv.toml"), TINY_KV).unwrap();
        let seeded = seed_roofline(&results);
        Setup {
            _tmp: tmp,
            exps,
            results,
            seeded,
        }
    }

    /// The repository's spec `experiments/<name>.toml` copied into this setup's experiments.
    fn copy_spec(&self, name: &str) {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments");
        let file = format!("{name}.toml");
        fs::copy(repo.join(&file), self.exps.join(&file)).unwrap();
    }

    /// `harness <args> --experiments-dir <exps> --results-dir <results>`.
    fn run(&self, args: &[&str]) -> Output {
        let mut all: Vec<&str> = args.to_vec();
        all.extend([
            "--experiments-dir",
            self.exps.to_str().unwrap(),
            "--results-dir",
            self.results.to_str().unwrap(),
        ]);
        harness(&all)
    }

    fn expect_usage_error(&self, args: &[&str], needle: &str) {
        let out = self.run(args);
        assert_usage_error(&out, &args.join(" "), needle, &self.results, &self.seeded);
    }
}

// A. Bad input: exit 2, one `error:` line, nothing written.

#[test]
fn unknown_experiment_is_one_line() {
    let s = Setup::new("unknown_experiment");
    s.expect_usage_error(&["exp", "no_such_exp"], "no_such_exp");
}

#[test]
fn unparsable_spec_is_one_line() {
    let s = Setup::new("unparsable_spec");
    let broken = s.exps.join("broken.toml");
    fs::write(
        &broken,
        "name = \"broken\"\nquestion = \"unterminated\nclaims = [\n",
    )
    .unwrap();
    s.expect_usage_error(&["exp", broken.to_str().unwrap()], "broken.toml");
}

#[test]
fn unknown_spec_fields_are_one_line() {
    let s = Setup::new("unknown_spec_fields");
    let extra_field = TINY
        .replace("name = \"tiny\"", "name = \"extra_field\"")
        .replace("reps = 2", "reps = 2\ncolour = \"red\"");
    fs::write(s.exps.join("extra_field.toml"), extra_field).unwrap();
    s.expect_usage_error(&["exp", "extra_field"], "colour");

    let extra_key = TINY
        .replace("name = \"tiny\"", "name = \"extra_key\"")
        .replace("batch = [1]", "batch = [1]\nseq_len = [7]");
    fs::write(s.exps.join("extra_key.toml"), extra_key).unwrap();
    s.expect_usage_error(&["exp", "extra_key"], "seq_len");
}

#[test]
fn bad_set_is_one_line() {
    let s = Setup::new("bad_set");
    s.expect_usage_error(&["exp", "tiny", "--set", "nonsense=1"], "nonsense");
    s.expect_usage_error(&["exp", "tiny", "--set", "kv_len=abc"], "kv_len='abc'");
}

#[test]
fn kv_heads_not_dividing_q_heads_is_one_line() {
    let s = Setup::new("kv_heads_divide");
    s.expect_usage_error(
        &["exp", "tiny", "--set", "q_heads=32", "--set", "heads=32/3"],
        "must divide",
    );
}

#[test]
fn zero_head_dim_is_one_line() {
    let s = Setup::new("zero_head_dim");
    s.expect_usage_error(&["exp", "tiny", "--set", "head_dim=0"], "head_dim");
}

#[test]
fn bad_variants_are_one_line() {
    let s = Setup::new("bad_variants");
    s.expect_usage_error(&["exp", "tiny", "--variant", "nosuch"], "nosuch");
    s.expect_usage_error(&["exp", "tiny", "--variant", "paged:bs=0"], "block size");
    s.expect_usage_error(&["exp", "tiny", "--variant", "flash2:br=0"], "br=0");
}

#[test]
fn cuda_without_gpu_is_one_line() {
    let gpu = Command::new("nvidia-smi")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if gpu {
        eprintln!("cuda_without_gpu_is_one_line: skipped, nvidia-smi reports a GPU here");
        return;
    }
    let s = Setup::new("cuda_without_gpu");
    let missing = "no CUDA driver";
    s.expect_usage_error(&["exp", "tiny", "--device", "cuda"], missing);
    s.expect_usage_error(&["check", "--device", "cuda"], missing);
    s.expect_usage_error(&["check", "--device", "cuda:1", "--family", "moe"], missing);
    s.expect_usage_error(&["roofline", "--device", "cuda"], missing);
    s.expect_usage_error(
        &[
            "exp",
            "tiny",
            "--device",
            "cuda",
            "--variant",
            "cuda_flash2",
        ],
        missing,
    );
}

#[test]
fn cuda_variants_on_the_cpu_are_one_line() {
    let s = Setup::new("cuda_variant_on_cpu");
    s.expect_usage_error(
        &["exp", "tiny", "--variant", "cuda_flash2"],
        "does not run on cpu",
    );
    s.expect_usage_error(
        &["exp", "tiny", "--variant", "cuda_paged:bs=0"],
        "block size",
    );
}

#[test]
fn bad_family_and_threads_are_one_line() {
    let s = Setup::new("bad_family_threads");
    s.expect_usage_error(&["check", "--family", "nosuch"], "nosuch");
    s.expect_usage_error(&["exp", "tiny", "--threads", "0"], "--threads");
    s.expect_usage_error(&["check", "--threads", "0"], "--threads");
}

#[test]
fn a_variant_pinned_above_the_isa_cap_is_one_line() {
    let s = Setup::new("variant_above_cap");
    s.expect_usage_error(
        &[
            "--isa",
            "portable",
            "exp",
            "tinyq",
            "--variant",
            "fused:isa=avx2",
        ],
        "above the ISA cap",
    );
    s.expect_usage_error(&["exp", "tinyq", "--variant", "packed:isa=neon"], "neon");
}

#[test]
fn bad_quant_grids_are_one_line() {
    let s = Setup::new("bad_quant");
    s.expect_usage_error(&["exp", "tinyq", "--set", "format=q9_0"], "q9_0");
    s.expect_usage_error(&["exp", "tinyq", "--set", "format=sym9g32"], "bits");
    s.expect_usage_error(&["exp", "tinyq", "--set", "shape=40x100"], "multiple");
    s.expect_usage_error(&["exp", "tinyq", "--set", "shape=40"], "ROWSxCOLS");
    s.expect_usage_error(&["exp", "tinyq", "--set", "batch=0"], "batch");
    s.expect_usage_error(&["exp", "tinyq", "--set", "weights=uniform"], "uniform");
    s.expect_usage_error(&["exp", "tinyq", "--set", "kv_len=64"], "kv_len");
    s.expect_usage_error(&["exp", "tinyq", "--variant", "flash2"], "flash2");
    s.expect_usage_error(&["exp", "tinyq", "--variant", "fused:isa=neon"], "isa");
}

#[test]
fn bad_pipeline_experiments_write_nothing() {
    // Models, drafters, lengths and formats are checked before results/ is touched.
    let s = Setup::new("bad_pipeline");
    for name in [
        "batching",
        "decode_roofline",
        "spec_tree",
        "kv_alloc",
        "serving_spec",
    ] {
        s.copy_spec(name);
    }
    let quick = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut a = vec!["exp", "--quick"];
        a.extend_from_slice(extra);
        a
    };
    s.expect_usage_error(&quick(&["batching", "--set", "model=nosuch"]), "nosuch");
    s.expect_usage_error(&quick(&["batching", "--set", "mode=fifo"]), "fifo");
    s.expect_usage_error(&quick(&["batching", "--set", "kv_blocks=2"]), "KV blocks");
    s.expect_usage_error(
        &quick(&["serving_spec", "--set", "text=/no/such/text.txt"]),
        "/no/such/text.txt",
    );
    s.expect_usage_error(
        &quick(&["serving_spec", "--set", "matmul=nosuch"]),
        "nosuch",
    );
    s.expect_usage_error(
        &quick(&["serving_spec", "--set", "text=licenses,rust"]),
        "one value",
    );
    s.expect_usage_error(
        &quick(&["decode_roofline", "--set", "prefill_tokens=999999"]),
        "prefill_tokens",
    );
    s.expect_usage_error(
        &quick(&["decode_roofline", "--set", "weights=sym4g48"]),
        "sym4g48",
    );
    s.expect_usage_error(
        &quick(&["decode_roofline", "--set", "context=5000"]),
        "context",
    );
    s.expect_usage_error(
        &quick(&["decode_roofline", "--set", "matmul=bogus"]),
        "bogus",
    );
    s.expect_usage_error(
        &quick(&["decode_roofline", "--set", "verify_tokens=2,4"]),
        "verify_tokens must include 1",
    );
    s.expect_usage_error(
        &quick(&["decode_roofline", "--set", "verify_tokens=1,9999"]),
        "verify_tokens",
    );
    s.expect_usage_error(
        &quick(&["decode_roofline", "--set", "kv_cache=f12"]),
        "kv_cache 'f12'",
    );
    s.expect_usage_error(
        &quick(&["decode_roofline", "--set", "kv_cache=f32,f16"]),
        "one value",
    );
    s.expect_usage_error(
        &quick(&["kv_alloc", "--set", "budget_tokens=1500"]),
        "budget",
    );
    s.expect_usage_error(
        &quick(&["spec_tree", "--set", "tree=static:3/0"]),
        "static:3/0",
    );
    s.expect_usage_error(&quick(&["spec_tree", "--set", "prompt=poem"]), "poem");
    s.expect_usage_error(&quick(&["spec_tree", "--set", "adaptive=maybe"]), "maybe");
    let tiny_kv = |set: &'static str| -> Vec<&'static str> { vec!["exp", "tinykv", "--set", set] };
    s.expect_usage_error(&tiny_kv("kv_cache=int9"), "int9");
    s.expect_usage_error(&tiny_kv("kv_cache=progressive:window=8"), "old=");
    s.expect_usage_error(&tiny_kv("part=both"), "both");
    s.expect_usage_error(&tiny_kv("window=64x0"), "64x0");
    s.expect_usage_error(&tiny_kv("window=9000x1"), "context");
    s.expect_usage_error(&tiny_kv("window=2048x40"), "gpl3");
    s.expect_usage_error(&tiny_kv("decode=b1:h3/2:d8:ctx4"), "b1:h3/2:d8:ctx4");
    s.expect_usage_error(&tiny_kv("block_size=0"), "block");
    s.expect_usage_error(&tiny_kv("model=nosuch"), "nosuch");
    // These two need the fetched model (the spec experiment runs on SmolLM2 only).
    if models::smollm2_path().exists() {
        s.expect_usage_error(&quick(&["spec_tree", "--set", "drafter=nosuch"]), "nosuch");
        s.expect_usage_error(&quick(&["spec_tree", "--set", "max_new=9000"]), "context");
    }
}

#[test]
fn bad_moe_grids_are_one_line() {
    let s = Setup::new("bad_moe");
    s.expect_usage_error(&["exp", "tinymoe", "--set", "top_k=0"], "top_k");
    s.expect_usage_error(
        &["exp", "tinymoe", "--set", "top_k=5"],
        "top_k must be in 1..=4",
    );
    s.expect_usage_error(&["exp", "tinymoe", "--set", "capacity=0"], "capacity");
    s.expect_usage_error(&["exp", "tinymoe", "--set", "capacity=-1.5"], "capacity");
    s.expect_usage_error(&["exp", "tinymoe", "--set", "skew=-1"], "skew");
    s.expect_usage_error(
        &["exp", "tinymoe", "--set", "policy=random"],
        "policy 'random' is not order, gshard, score or reroute",
    );
    s.expect_usage_error(
        &["exp", "tinymoe", "--set", "norm=softmax"],
        "norm 'softmax' is not renormalize, raw or renormalize_kept",
    );
    s.expect_usage_error(&["exp", "tinymoe", "--set", "d_model=0"], "d_model");
    s.expect_usage_error(
        &["exp", "tinymoe", "--variant", "flash2"],
        "unknown moe variant",
    );
    s.expect_usage_error(
        &["exp", "tinymoe", "--set", "routing=both"],
        "routing 'both'",
    );
    s.expect_usage_error(
        &["exp", "tinymoe", "--set", "min_capacity=-1"],
        "min_capacity",
    );
    // Expert choice: no top-k to give, no top-k to renormalise over, and a factor that
    // truncates to 0 tokens per expert without a floor.
    let ec = ["exp", "tinymoe", "--set", "routing=expert_choice"];
    s.expect_usage_error(
        &[&ec[..], &["--set", "norm=raw", "--set", "top_k=2"]].concat(),
        "takes no top_k",
    );
    s.expect_usage_error(&ec, "none of the grid's norms");
    s.expect_usage_error(
        &[
            &ec[..],
            &[
                "--set",
                "norm=raw",
                "--set",
                "min_capacity=0",
                "--set",
                "capacity=0.05",
            ],
        ]
        .concat(),
        "0 slots per expert",
    );
    s.expect_usage_error(
        &["exp", "tinymoe", "--variant", "cuda_grouped:dtype=f32"],
        "f16 or bf16",
    );
}

#[test]
fn kv_calculator_is_exact() {
    let tmp = TempDir::new("cli", "kv_calc");
    let results = tmp.join("results");
    seed_roofline(&results);
    let r = results.to_str().unwrap();
    let out = harness(&["exp", "kv_calc", "--quick", "--results-dir", r]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let csv_path = files_with_ext(&results.join("kv_calc"), "csv").remove(0);
    let mut reader = csv::Reader::from_path(&csv_path).unwrap();
    let h = reader.headers().unwrap().clone();
    let (m, len, n, kib, gib) = (
        column(&h, "model"),
        column(&h, "seq_len"),
        column(&h, "sessions"),
        column(&h, "kv_kib_per_token"),
        column(&h, "total_gib"),
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    let find = |model: &str, l: &str, s: &str| {
        rows.iter()
            .find(|r| &r[m] == model && &r[len] == l && &r[n] == s)
            .unwrap_or_else(|| panic!("no row {model} {l} {s}"))
    };
    // C3: 2 × 32 × 32 × 128 × 2 bytes × 4096 tokens = 2 GiB exactly.
    assert_eq!(&find("llama-2-7b", "4096", "1")[gib], "2.0");
    // C2: Llama-2-70B (8 KV heads) holds 320 KiB per token, not 40.
    assert_eq!(&find("llama-2-70b", "1000", "100")[kib], "320.0");
    let bad = harness(&["exp", "kv_calc", "--set", "model=gpt-5", "--results-dir", r]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("unknown model"),
        "{}",
        text(&bad.stderr)
    );
}

// B. Happy path.

#[test]
fn tiny_moe_experiment_writes_rows() {
    let s = Setup::new("tiny_moe");
    let out = s.run(&["exp", "tinymoe", "--threads", "2"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "exp tinymoe failed:\n{stderr}");
    let csv_path = files_with_ext(&s.results.join("tinymoe"), "csv").remove(0);
    let mut reader = csv::Reader::from_path(&csv_path).unwrap();
    let headers = reader.headers().unwrap().clone();
    let (status, cap, drop, err) = (
        column(&headers, "status"),
        column(&headers, "capacity"),
        column(&headers, "drop_rate"),
        column(&headers, "out_rel_err_vs_dropless"),
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 8, "2 capacities x 2 skews x 2 variants");
    for r in &rows {
        assert_eq!(&r[status], "ok", "{r:?}");
        let (d, e): (f64, f64) = (r[drop].parse().unwrap(), r[err].parse().unwrap());
        if &r[cap] == "dropless" {
            assert_eq!(d, 0.0);
            assert!(e < 1e-5, "dropless equals itself: {e}");
        } else {
            // 40 tokens x 2 / 4 experts x 0.5 = 10 slots for 20 assignments each on average.
            assert!(d >= 0.5, "capacity 0.5 drops at least half: {d}");
            assert!(e > 0.1, "dropping changes the output: {e}");
        }
    }
}

#[test]
fn tiny_moe_conventions_write_their_statistics() {
    let s = Setup::new("tiny_moe_conventions");
    let out = s.run(&[
        "exp",
        "tinymoe",
        "--threads",
        "2",
        "--variant",
        "grouped",
        "--set",
        "capacity=0.5",
        "--set",
        "skew=1.5",
        "--set",
        "policy=order,gshard,score,reroute",
        "--set",
        "norm=raw,renormalize_kept",
        "--set",
        "routing=token_choice,expert_choice",
        "--set",
        "min_capacity=0",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let csv_path = files_with_ext(&s.results.join("tinymoe"), "csv").remove(0);
    let mut reader = csv::Reader::from_path(&csv_path).unwrap();
    let h = reader.headers().unwrap().clone();
    let col = |name: &str| column(&h, name);
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    // 4 policies x 2 norms of token choice, 2 norms of expert choice.
    assert_eq!(rows.len(), 10, "{rows:?}");
    let num = |r: &csv::StringRecord, c: &str| -> f64 { r[col(c)].parse().unwrap() };
    let find = |routing: &str, policy: &str, norm: &str| {
        rows.iter()
            .find(|r| {
                &r[col("routing")] == routing
                    && &r[col("policy")] == policy
                    && &r[col("norm")] == norm
            })
            .unwrap_or_else(|| panic!("no row {routing} {policy} {norm}"))
    };
    for r in &rows {
        assert_eq!(&r[col("status")], "ok", "{r:?}");
    }
    // The same load and capacity drop the same number under every non-rerouting policy;
    // reroute moves some of them instead.
    let dropped = num(find("token_choice", "gshard", "raw"), "dropped");
    assert!(dropped > 0.0);
    for p in ["order", "score"] {
        assert_eq!(num(find("token_choice", p, "raw"), "dropped"), dropped);
    }
    let rerouted = find("token_choice", "reroute", "raw");
    assert!(num(rerouted, "rerouted") > 0.0, "{rerouted:?}");
    assert_eq!(
        num(rerouted, "dropped") + num(rerouted, "rerouted"),
        dropped,
        "every drop of gshard either stays dropped or is rerouted"
    );
    assert_eq!(num(find("token_choice", "order", "raw"), "rerouted"), 0.0);
    // Expert choice: no top_k, no policy, nothing dropped, every expert full.
    let ec = find("expert_choice", "", "raw");
    assert_eq!(&ec[col("top_k")], "");
    assert_eq!(num(ec, "dropped"), 0.0);
    let slots = num(ec, "capacity_slots");
    assert_eq!(slots, (40.0f64 * 0.5 / 4.0).floor());
    assert_eq!(num(ec, "assignments"), 4.0 * slots);
    assert!(num(ec, "unserved_tokens") > 0.0, "{ec:?}");
    // The weight rules differ only in the weights: the same decisions, other outputs.
    let (a, b) = (
        find("token_choice", "gshard", "raw"),
        find("token_choice", "gshard", "renormalize_kept"),
    );
    assert_eq!(num(a, "unserved_tokens"), num(b, "unserved_tokens"));
    assert_ne!(
        num(a, "out_rel_err_vs_dropless"),
        num(b, "out_rel_err_vs_dropless")
    );
}

#[test]
fn tiny_quant_experiment_writes_rows_and_plots() {
    let s = Setup::new("tiny_quant");
    let out = s.run(&["exp", "tinyq", "--threads", "2"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "exp tinyq failed:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let dir = s.results.join("tinyq");
    assert_eq!(files_with_ext(&dir, "svg").len(), 2, "plot and extra plot");
    let csv_path = files_with_ext(&dir, "csv").remove(0);
    let mut reader = csv::Reader::from_path(&csv_path).unwrap();
    let headers = reader.headers().unwrap().clone();
    let (format, variant, status, speedup, snr) = (
        column(&headers, "format"),
        column(&headers, "variant"),
        column(&headers, "status"),
        column(&headers, "speedup_vs_f32"),
        column(&headers, "w_snr_db"),
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    // 3 formats x fused + faer on f32 only, x 2 weights x 2 batches.
    assert_eq!(rows.len(), 16, "{rows:?}");
    for r in &rows {
        assert_eq!(&r[status], "ok", "{r:?}");
        assert!(
            !r[speedup].is_empty(),
            "every row has a speed-up over f32: {r:?}"
        );
        if &r[format] == "f32" {
            assert_eq!(&r[snr], "inf");
        } else {
            assert_eq!(&r[variant], "fused", "faer runs f32 weights only: {r:?}");
            let db: f64 = r[snr].parse().unwrap();
            assert!(db > 5.0 && db < 60.0, "SNR of {}: {db}", &r[format]);
        }
    }
    let md = fs::read_to_string(csv_path.with_extension("md")).unwrap();
    assert!(
        md.contains("## Quantisation error") && md.contains("sym3g32"),
        "{md}"
    );
}

#[test]
fn tiny_kv_precision_experiment_writes_rows_and_plots() {
    let s = Setup::new("tiny_kv");
    let out = s.run(&["exp", "tinykv", "--threads", "2"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "exp tinykv failed:\n{stderr}");
    let dir = s.results.join("tinykv");
    assert_eq!(files_with_ext(&dir, "svg").len(), 2, "plot and extra plot");
    let csv_path = files_with_ext(&dir, "csv").remove(0);
    let mut reader = csv::Reader::from_path(&csv_path).unwrap();
    let headers = reader.headers().unwrap().clone();
    let col = |name: &str| column(&headers, name);
    let (part, kv, status, kl, top1, bytes, speedup, err) = (
        col("part"),
        col("kv_cache"),
        col("status"),
        col("kl_mean"),
        col("top1_agreement"),
        col("bytes_vs_f32"),
        col("speedup_vs_f32"),
        col("rel_l2_err"),
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    // f32 and the three grid formats, quality and decode.
    assert_eq!(rows.len(), 8, "{rows:?}");
    for r in &rows {
        assert_eq!(&r[status], "ok", "{r:?}");
        let ratio: f64 = r[bytes].parse().unwrap();
        if &r[kv] == "f32" {
            assert_eq!(ratio, 1.0);
        } else {
            assert!(ratio > 0.2 && ratio < 0.6, "{r:?}");
        }
        if &r[part] == "quality" {
            let (kl, top1): (f64, f64) = (r[kl].parse().unwrap(), r[top1].parse().unwrap());
            assert!(
                kl.is_finite() && kl >= 0.0 && top1 > 0.0 && top1 <= 1.0,
                "{r:?}"
            );
            assert_eq!(
                &r[kv] == "f32",
                kl == 0.0,
                "only the f32 cache has no KL: {r:?}"
            );
        } else {
            assert!(!r[speedup].is_empty(), "{r:?}");
            assert!(r[err].parse::<f64>().unwrap() < 1e-4, "{r:?}");
        }
    }
    let prov = fs::read_to_string(csv_path.with_extension("json")).unwrap();
    assert!(
        prov.contains("\"text gpl3\""),
        "the text's sha256 in the provenance: {prov}"
    );
    let md = fs::read_to_string(csv_path.with_extension("md")).unwrap();
    assert!(
        md.contains("## Quality: tiny-gqa on gpl3") && md.contains("## Paged decode b2:h4/2"),
        "{md}"
    );
}

#[test]
fn verify_cost_rows_count_a_k_token_step_in_one_token_steps() {
    let s = Setup::new("verify_cost");
    s.copy_spec("verify_cost");
    let out = s.run(&["exp", "verify_cost", "--quick", "--threads", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let csv_path = files_with_ext(&s.results.join("verify_cost"), "csv").remove(0);
    let mut reader = csv::Reader::from_path(&csv_path).unwrap();
    let headers = reader.headers().unwrap().clone();
    let col = |name: &str| column(&headers, name);
    let (phase, k, status, cost, roof, err) = (
        col("phase"),
        col("step_tokens"),
        col("status"),
        col("cost_steps"),
        col("roofline_steps"),
        col("rel_err_vs_batch1"),
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    let verify: Vec<&csv::StringRecord> = rows.iter().filter(|r| &r[phase] == "verify").collect();
    // The quick grid's k = 1, 2, 4, 8, each checked against one token at a time.
    let ks: Vec<usize> = verify.iter().map(|r| r[k].parse().unwrap()).collect();
    assert_eq!(ks, [1, 2, 4, 8], "{rows:?}");
    let mut last_roof = 0.0;
    for r in &verify {
        assert_eq!(&r[status], "ok", "{r:?}");
        let (c, p): (f64, f64) = (r[cost].parse().unwrap(), r[roof].parse().unwrap());
        assert!(c.is_finite() && c > 0.0, "{r:?}");
        // The roofline's cost starts at 1 and never falls as k grows.
        assert!(p >= last_roof && p >= 1.0, "{r:?}");
        last_roof = p;
        if &r[k] == "1" {
            assert_eq!(c, 1.0, "{r:?}");
            assert!(r[err].is_empty(), "{r:?}");
        } else {
            assert!(r[err].parse::<f64>().unwrap() < 1e-3, "{r:?}");
        }
    }
    let md = fs::read_to_string(csv_path.with_extension("md")).unwrap();
    assert!(
        md.contains("## A k-token step of one sequence in 1-token steps"),
        "{md}"
    );
}

fn column(headers: &csv::StringRecord, name: &str) -> usize {
    headers
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("CSV header lacks '{name}': {headers:?}"))
}

#[test]
fn tiny_experiment_writes_every_output() {
    let s = Setup::new("tiny_experiment");
    let out = s.run(&["exp", "tiny", "--threads", "1"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "exp tiny failed:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let dir = s.results.join("tiny");
    let mut found = vec![];
    for ext in ["csv", "json", "md", "svg"] {
        let files = files_with_ext(&dir, ext);
        assert_eq!(files.len(), 1, "want one .{ext} in {}", dir.display());
        found.push(files[0].clone());
    }
    let (csv_path, json_path, md_path, svg_path) = (&found[0], &found[1], &found[2], &found[3]);

    let mut reader = csv::Reader::from_path(csv_path).unwrap();
    let headers = reader.headers().unwrap().clone();
    let (variant, mode, status) = (
        column(&headers, "variant"),
        column(&headers, "mode"),
        column(&headers, "status"),
    );
    column(&headers, "median_ms");
    column(&headers, "rel_l2_err");
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 12, "2 modes x 2 lengths x 3 variants");
    for r in &rows {
        assert_eq!(r.len(), headers.len());
        let want = match (&r[mode], r[variant].starts_with("paged")) {
            ("decode", _) | ("prefill", false) => "ok",
            ("prefill", true) => "unsupported",
            (m, _) => panic!("unexpected mode {m}"),
        };
        assert_eq!(&r[status], want, "{r:?}");
    }
    assert_eq!(rows.iter().filter(|r| &r[mode] == "decode").count(), 6);

    let prov: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(json_path).unwrap()).unwrap();
    assert_eq!(prov["status"], "finished", "{prov}");
    assert!(prov["git_sha"].is_string(), "{prov}");
    assert!(prov["roofline"].is_object(), "{prov}");
    assert_eq!(prov["rows"], 12, "{prov}");
    assert!(fs::metadata(svg_path).unwrap().len() > 0);

    // render rewrites the .md (and .svg) from the CSV and JSON.
    fs::remove_file(md_path).unwrap();
    let out = s.run(&["render", csv_path.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "render failed:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let md = fs::read_to_string(md_path).expect("render rewrote the .md");
    assert!(!md.trim().is_empty());

    // --format json prints the rows as one JSON array on stdout.
    let out = s.run(&["exp", "tiny", "--threads", "1", "--format", "json"]);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "exp --format json failed:\n{stderr}"
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", text(&out.stdout)));
    assert_eq!(rows.as_array().map(Vec::len), Some(12), "{rows}");
}

// C. An interrupted run keeps its finished rows.

#[test]
fn killed_run_keeps_finished_rows() {
    let s = Setup::new("killed_run");
    let lens: Vec<usize> = (1..=30).map(|i| 512 * i).collect();
    let spec = decode_spec("long", &lens, (32, 128), 3);
    fs::write(s.exps.join("long.toml"), spec).unwrap();
    let stderr_path = s._tmp.join("stderr.txt");
    let child = Command::new(BIN)
        .args([
            "exp",
            "long",
            "--threads",
            "1",
            "--experiments-dir",
            s.exps.to_str().unwrap(),
            "--results-dir",
            s.results.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("the harness binary starts");
    let mut child = KillOnDrop(child);

    let dir = s.results.join("long");
    let started = Instant::now();
    let csv_path = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!(
                "exp long ended ({status}) before it could be interrupted:\n{}",
                fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        if let Some(p) = files_with_ext(&dir, "csv").pop() {
            let complete_lines = fs::read_to_string(&p)
                .unwrap_or_default()
                .matches('\n')
                .count();
            if complete_lines > 3 {
                break p; // header + at least 3 rows
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no 3 rows within 60 s:\n{}",
            fs::read_to_string(&stderr_path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    child.0.kill().unwrap();
    child.0.wait().unwrap();

    let body = fs::read_to_string(&csv_path).unwrap();
    assert!(body.ends_with('\n'), "a partial row was left:\n{body}");
    let mut reader = csv::Reader::from_path(&csv_path).unwrap();
    let width = reader.headers().unwrap().len();
    let rows: Vec<csv::StringRecord> = reader
        .records()
        .map(|r| r.unwrap_or_else(|e| panic!("CSV does not parse after kill: {e}\n{body}")))
        .collect();
    assert!(rows.len() >= 3, "{body}");
    assert!(rows.len() < 60, "the run was not interrupted");
    assert!(rows.iter().all(|r| r.len() == width), "{body}");

    let prov: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(csv_path.with_extension("json")).unwrap())
            .unwrap();
    assert!(
        prov["status"]
            .as_str()
            .is_some_and(|s| s.starts_with("running")),
        "{prov}"
    );
}

// D. check and list.

#[test]
fn check_writes_passing_rows() {
    let tmp = TempDir::new("cli", "check");
    let results = tmp.join("results");
    let out = harness(&[
        "check",
        "--cases",
        "2",
        "--threads",
        "1",
        "--results-dir",
        results.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "check failed:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let files = files_with_ext(&results.join("check"), "csv");
    assert_eq!(files.len(), 1, "want one CSV under check/");
    let mut reader = csv::Reader::from_path(&files[0]).unwrap();
    let status = column(&reader.headers().unwrap().clone(), "status");
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    assert!(!rows.is_empty());
    for r in &rows {
        assert!(
            matches!(&r[status], "pass" | "unsupported"),
            "check row not passing: {r:?}"
        );
    }
}

#[test]
fn check_passes_at_every_narrower_isa() {
    // The default run above covers the widest tier; every narrower one the CPU has runs every
    // family's check under --isa (a tier it lacks is named, never silently skipped).
    for isa in ["avx2", "portable"] {
        let t = kernel_cpu::Isa::parse(isa).unwrap();
        if !t.supported() || t >= kernel_cpu::Isa::detected() {
            eprintln!("skipped: isa {isa} (not narrower than this CPU's widest, or absent)");
            continue;
        }
        let tmp = TempDir::new("cli", &format!("check-{isa}"));
        let results = tmp.join("results");
        let out = harness(&[
            "--isa",
            isa,
            "check",
            "--cases",
            "2",
            "--dtype",
            "f32",
            "--results-dir",
            results.to_str().unwrap(),
        ]);
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "check at {isa} failed:\n{stderr}"
        );
        let files = files_with_ext(&results.join("check"), "csv");
        let mut reader = csv::Reader::from_path(&files[0]).unwrap();
        let status = column(&reader.headers().unwrap().clone(), "status");
        let variant = column(&reader.headers().unwrap().clone(), "variant");
        let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
        assert!(rows
            .iter()
            .all(|r| matches!(&r[status], "pass" | "unsupported")));
        // The quant family checks the capped tier and below, never above it.
        assert!(rows
            .iter()
            .any(|r| r[variant] == *format!("packed:isa={isa}")));
        assert!(!rows.iter().any(|r| r[variant].contains("isa=avx512")));
    }
}

#[test]
fn list_names_variants_and_experiments() {
    let out = harness(&["list"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "list failed:\n{}",
        text(&out.stderr)
    );
    for name in [
        "flash2",
        "paged",
        "flash_vs_paged",
        "fused",
        "quant_tradeoff",
        "format",
    ] {
        assert!(
            stdout.contains(name),
            "list does not mention {name}:\n{stdout}"
        );
    }
}

#[test]
fn list_shows_every_family_and_each_variants_device() {
    let out = harness(&["list"]);
    let stdout = text(&out.stdout);
    for family in [
        "attention",
        "paged",
        "quant",
        "moe",
        "speculative",
        "kv",
        "kv_alloc",
        "serving",
        "decode",
    ] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(family)),
            "list does not show family {family}:\n{stdout}"
        );
    }
    // The moe and spec CUDA kernels are variants like the others, with their device.
    for (family, name) in [
        ("moe", "cuda_router"),
        ("speculative", "cuda_tree"),
        ("attention", "cuda_flash2"),
    ] {
        assert!(
            stdout.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 3 && w[0] == family && w[1] == name && w[2] == "cuda"
            }),
            "list does not show {family} {name} on cuda:\n{stdout}"
        );
    }
}

/// Runs the harness binary from `dir` with `WORKBENCH_ROOT` set or removed.
fn harness_in(dir: &Path, root: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).current_dir(dir);
    match root {
        Some(r) => cmd.env("WORKBENCH_ROOT", r),
        None => cmd.env_remove("WORKBENCH_ROOT"),
    };
    cmd.output().expect("the harness binary runs")
}

#[test]
fn default_folders_come_from_where_the_user_stands() {
    // Outside any checkout: one line saying how to name one, exit 2.
    let outside = TempDir::new("cli", "outside");
    let out = harness_in(&outside.0, None, &["exp", "naive_vs_flash2", "--quick"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("WORKBENCH_ROOT"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // Another checkout (a folder with a [workspace] Cargo.toml and experiments/): its specs
    // are the ones listed, from the folder itself and from below it.
    let other = TempDir::new("cli", "other-checkout");
    fs::write(other.join("Cargo.toml"), "[workspace]\nmembers = []\n").unwrap();
    fs::create_dir_all(other.join("experiments")).unwrap();
    fs::create_dir_all(other.join("deep/er")).unwrap();
    let spec = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../experiments/naive_vs_flash2.toml"
    ))
    .unwrap()
    .replace("name = \"naive_vs_flash2\"", "name = \"only_in_the_other\"");
    fs::write(other.join("experiments/only_in_the_other.toml"), spec).unwrap();
    for dir in [other.0.clone(), other.join("deep/er")] {
        let out = harness_in(&dir, None, &["list"]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(stdout.contains("only_in_the_other"), "{stdout}");
        assert!(!stdout.contains("flash_vs_paged"), "{stdout}");
    }
    // WORKBENCH_ROOT wins over the current directory.
    let out = harness_in(&outside.0, Some(&other.0), &["list"]);
    assert!(text(&out.stdout).contains("only_in_the_other"));
}

/// `generate --model X --prompt-ids 1`: a model file the loader refuses is exit 2 and one
/// line naming the tensor and its ggml type, or the architecture and the key.
#[test]
fn bad_model_files_are_one_line() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/data");
    let tmp = TempDir::new("cli", "bad-model-files");
    let generate = |model: &Path| {
        harness(&[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt-ids",
            "1",
            "--max-new-tokens",
            "1",
        ])
    };
    let refused = |out: &Output, needle: &str| {
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(needle),
            "want '{needle}' in {stderr}"
        );
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    };
    refused(
        &generate(&data.join("tiny_llama_iq2_xxs.gguf")),
        "tiny_llama_iq2_xxs.gguf: tensor 'blk.0.attn_q.weight' has type IQ2_XXS (16), which this workbench does not read",
    );
    refused(
        &generate(&data.join("tiny_llama_no_heads.gguf")),
        "tiny_llama_no_heads.gguf: llama: the metadata lacks llama.attention.head_count, which it needs",
    );
    // Checkpoint directories: an architecture outside the table, a RoPE type it does not run.
    let copy = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| -> PathBuf {
        let dir = tmp.join(name);
        fs::create_dir_all(&dir).unwrap();
        for e in fs::read_dir(data.join("hf_llama3")).unwrap().flatten() {
            fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        let p = dir.join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&p).unwrap()).unwrap();
        edit(&mut v);
        fs::write(&p, v.to_string()).unwrap();
        dir
    };
    refused(
        &generate(&copy("bloom", &|v| {
            v["architectures"][0] = "BloomForCausalLM".into()
        })),
        "config.json: architecture 'BloomForCausalLM' is not one this workbench runs",
    );
    refused(
        &generate(&copy("dynamic", &|v| {
            v["rope_parameters"]["rope_type"] = "dynamic".into()
        })),
        "config.json: LlamaForCausalLM: 'rope_parameters.rope_type' 'dynamic' is not supported",
    );
}

#[test]
fn check_invariance_reports_every_variant_and_the_deterministic_ones_hold() {
    let tmp = TempDir::new("cli", "invariance");
    let results = tmp.join("results");
    let out = harness(&[
        "check",
        "--invariance",
        "--steps",
        "3",
        "--threads",
        "2",
        "--results-dir",
        results.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 15, "5 attentions x 3 products");
    for r in rows {
        // The default paged split (by the context length) and a fixed one are deterministic.
        let deterministic = r["attention"] == "paged" || r["attention"] == "paged:split=64";
        if deterministic && r["matmul"] == "packed" {
            assert_eq!(r["batch_identical"], true, "{r}");
            assert_eq!(r["threads_identical"], true, "{r}");
        }
    }
    let csv = fs::read_dir(results.join("check"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with("-invariance.csv"))
        .expect("the invariance csv");
    assert_eq!(fs::read_to_string(csv.path()).unwrap().lines().count(), 16);
    // --model without --invariance is a usage error.
    let bad = harness(&["check", "--model", "tiny-gqa"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
}

#[test]
fn serving_with_speculation_on_a_real_text_records_the_text_and_acceptance() {
    // Prompts cut from a text (here a small repetitive file, so prompt lookup finds drafts),
    // speculation inside the engine beside the same engine without it.
    let s = Setup::new("serving_text");
    s.copy_spec("serving_spec");
    let corpus = s.exps.join("corpus.txt");
    fs::write(&corpus, "for i in 0..n { total += x[i]; }\n".repeat(40)).unwrap();
    let set = format!("text={}", corpus.display());
    let out = s.run(&["exp", "serving_spec", "--quick", "--set", &set]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dir = s.results.join("serving_spec");
    let rows = common::csv_rows(&dir);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(r["status"], "ok");
        assert_eq!(r["text"], corpus.display().to_string());
        assert_eq!(r["matmul"], "fused");
    }
    let spec = rows
        .iter()
        .find(|r| r["spec"] != "off")
        .expect("a speculative row");
    let accepted: f64 = spec["spec_acceptance"].parse().unwrap();
    assert!(
        accepted > 0.0,
        "prompt lookup on a repetitive text accepts drafts: {spec:?}"
    );
    let md = fs::read_to_string(files_with_ext(&dir, "md")[0].clone()).unwrap();
    assert!(md.contains("Speculation inside the engine against"), "{md}");
}

/// `exp decode_roofline --quick` without peers, one thread and rep, f32 weights, and each of
/// `sets` as a `--set`.
fn quick_decode_f32<'a>(sets: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "exp",
        "decode_roofline",
        "--quick",
        "--no-peers",
        "--threads",
        "1",
        "--reps",
        "1",
        "--set",
        "weights=f32",
    ];
    for &kv in sets {
        args.extend(["--set", kv]);
    }
    args
}

/// The rows of one `quick_decode_f32(sets)` run in `s`, its results dir emptied first; the
/// run must exit 0.
fn quick_decode_rows(s: &Setup, sets: &[&str]) -> Vec<std::collections::HashMap<String, String>> {
    let dir = s.results.join("decode_roofline");
    let _ = std::fs::remove_dir_all(&dir);
    let out = s.run(&quick_decode_f32(sets));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    common::csv_rows(&dir)
}

#[test]
fn decode_roofline_runs_an_f16_kv_cache_and_counts_its_bytes() {
    // llama.cpp stores K and V in f16 by default: `kv_cache=f16` runs ours the same way, and
    // the roofline's KV bytes are half the f32 cache's at the same point.
    let s = Setup::new("decode_kv16");
    s.copy_spec("decode_roofline");
    let kv_mb = |kv: &str| -> f64 {
        let set = format!("kv_cache={kv}");
        let rows = quick_decode_rows(&s, &["batch=4", set.as_str()]);
        let r = rows
            .iter()
            .find(|r| r["phase"] == "decode" && r["status"] == "ok")
            .unwrap_or_else(|| panic!("a decode row at {kv}: {rows:?}"));
        r["kv_mb"].parse().unwrap()
    };
    let (f32_mb, f16_mb) = (kv_mb("f32"), kv_mb("f16"));
    assert!(f32_mb > 0.0);
    assert!(
        (f16_mb / f32_mb - 0.5).abs() < 1e-9,
        "f16 {f16_mb} MB against f32 {f32_mb} MB"
    );
}

#[test]
fn decode_roofline_gathers_each_batchs_samples_from_every_pass() {
    // `rounds=3`: three passes over the batch list, each timing `steps` steps of every batch,
    // so each decode row holds 3 × steps samples (1 × steps without the key and no peer); a
    // second value or 0 is a usage error.
    let s = Setup::new("decode_rounds");
    s.copy_spec("decode_roofline");
    let reps = |extra: &[&str]| -> Vec<(String, String)> {
        let mut sets = vec!["batch=1,3", "steps=2"];
        sets.extend(extra);
        quick_decode_rows(&s, &sets)
            .iter()
            .filter(|r| r["phase"] == "decode")
            .map(|r| (r["batch"].clone(), r["reps"].clone()))
            .collect()
    };
    let pairs = |n: &str| vec![("1".into(), n.into()), ("3".into(), n.into())];
    assert_eq!(reps(&[]), pairs("2"));
    assert_eq!(reps(&["rounds=3"]), pairs("6"));
    let fresh = Setup::new("decode_rounds_usage");
    fresh.copy_spec("decode_roofline");
    fresh.expect_usage_error(&quick_decode_f32(&["rounds=0"]), "rounds '0'");
    fresh.expect_usage_error(&quick_decode_f32(&["rounds=2,3"]), "rounds takes one value");
}

#[test]
fn a_product_that_takes_none_of_the_models_formats_writes_skipped_rows_saying_why() {
    // `packed` takes no f32 weights: its points were dropped without a row (a Q5_K_M file
    // judged by one layer's format wrote an empty run); now each is a skipped row with the
    // reason, and the product that does apply runs beside it.
    let s = Setup::new("decode_none");
    s.copy_spec("decode_roofline");
    let rows = quick_decode_rows(&s, &["matmul=packed,fused", "batch=1"]);
    let packed: Vec<_> = rows.iter().filter(|r| r["matmul"] == "packed").collect();
    assert_eq!(packed.len(), 2, "decode batch 1 and the prefill: {rows:?}");
    for r in packed {
        assert_eq!(r["status"], "skipped");
        assert!(
            r["note"].contains("takes none") && r["note"].contains("f32"),
            "{}",
            r["note"]
        );
    }
    assert!(rows
        .iter()
        .any(|r| r["matmul"] == "fused" && r["status"] == "ok"));
}
