//! `--device cuda` end to end without a GPU: the harness binary runs against a stand-in CUDA
//! driver (`tests/fake_cuda/libcuda.c`: host memory for device memory, kernels launched on the
//! CPU emulator) with the real NVRTC. This exercises everything a GPU run does on the host —
//! probing, NVRTC compilation and module loading, uploads, every launcher's argument packing,
//! downloads, event timing (cold and hot), the CSV rows — and checks that every CUDA variant
//! passes against the CPU references. Times from it mean nothing. Skips without gcc/g++ or
//! NVRTC, unless WORKBENCH_REQUIRE_NVRTC is set (CI).

use std::path::Path;
use std::process::{Command, Output};

#[path = "common/fake_cuda.rs"]
mod fake_cuda;
use fake_cuda::fake_driver;

const BIN: &str = env!("CARGO_BIN_EXE_harness");

fn run(dir: &Path, libs: &str, results: &Path, args: &[&str]) -> Output {
    let ld = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    Command::new(BIN)
        .arg("--results-dir")
        .arg(results)
        .args(args)
        .env("LD_LIBRARY_PATH", format!("{}:{ld}", dir.display()))
        .env("WORKBENCH_EMU_LIBS", libs)
        .env("WORKBENCH_CUDA_ROOFLINE", "16,128")
        .output()
        .expect("harness runs")
}

fn ok(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The header, then every row, of the CSVs in `dir`.
fn csv_rows(dir: &Path) -> Vec<csv::StringRecord> {
    let mut rows = vec![];
    let mut headers = None;
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "csv") {
            let mut r = csv::Reader::from_path(&p).unwrap();
            headers = Some(r.headers().unwrap().clone());
            rows.extend(r.records().map(Result::unwrap));
        }
    }
    if let Some(h) = headers {
        rows.insert(0, h);
    }
    rows
}

fn column(rows: &[csv::StringRecord], name: &str) -> Vec<String> {
    let at = rows[0].iter().position(|h| h == name).expect("column");
    rows[1..].iter().map(|r| r[at].to_string()).collect()
}

#[test]
fn every_cuda_path_runs_end_to_end_on_the_fake_driver() {
    let Some((dir, libs)) = fake_driver("e2e") else {
        return;
    };
    let results = dir.join("results");
    let exps = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments");
    let exps = exps.to_str().unwrap();

    let out = run(&dir, &libs, &results, &["roofline", "--device", "cuda"]);
    let text = ok(&out, "roofline");
    assert!(text.contains("fake libcuda"), "{text}");

    let out = run(
        &dir,
        &libs,
        &results,
        &[
            "check", "--device", "cuda", "--cases", "1", "--dtype", "f32", "--dtype", "bf16",
        ],
    );
    let text = ok(&out, "check --device cuda");
    let rows = csv_rows(&results.join("check"));
    let variants = column(&rows, "variant");
    let status = column(&rows, "status");
    for want in [
        "cuda_naive",
        "cuda_flash2",
        "cuda_flash2:pipe=1",
        "cuda_paged:bs=16",
        "cuda_paged_decode",
        "cuda_paged_decode:split=auto",
        "cuda_append_roundtrip",
        "cuda_gemv",
        "cuda_grouped",
        "cuda_router",
        "cuda_topk",
        "cuda_capacity",
        "cuda_dispatch",
        "cuda_combine",
        "cuda_tree",
    ] {
        let passed = variants
            .iter()
            .zip(&status)
            .filter(|(v, s)| v.as_str() == want && s.as_str() == "pass")
            .count();
        assert!(passed > 0, "no passing {want} row:\n{text}");
    }
    assert!(!status.iter().any(|s| s == "fail"), "{text}");
    assert!(
        variants.iter().all(|v| v.starts_with("cuda")),
        "a CPU variant ran under --device cuda"
    );

    for (exp, sets) in [
        (
            "flash_vs_paged",
            &[
                "--quick",
                "--set",
                "kv_len=128",
                "--set",
                "batch=1",
                "--set",
                "dtype=bf16",
            ][..],
        ),
        (
            "quant_tradeoff",
            &[
                "--quick",
                "--set",
                "shape=64x256",
                "--set",
                "batch=1,8",
                "--set",
                "format=f16,q8_0,q4_0,sym4g32",
            ][..],
        ),
        (
            "moe_capacity",
            &[
                "--quick",
                "--set",
                "tokens=40",
                "--set",
                "d_model=32",
                "--set",
                "d_ff=40",
                "--set",
                "capacity=1.0",
                "--set",
                "skew=1.0",
                "--set",
                "top_k=2",
                "--set",
                "policy=gshard,reroute",
                "--set",
                "norm=renormalize,renormalize_kept",
                "--set",
                "routing=token_choice,expert_choice",
            ][..],
        ),
    ] {
        let mut args = vec![
            "--experiments-dir",
            exps,
            "exp",
            exp,
            "--device",
            "cuda",
            "--reps",
            "2",
            "--no-peers",
        ];
        args.extend_from_slice(sets);
        let out = run(&dir, &libs, &results, &args);
        ok(&out, exp);
        let rows = csv_rows(&results.join(exp));
        let status = column(&rows, "status");
        assert!(!status.is_empty(), "{exp}: no rows");
        // Paged decode refuses prefill (q_len > 16): those rows are `unsupported`.
        let variant = column(&rows, "variant");
        assert!(
            status
                .iter()
                .zip(&variant)
                .all(|(s, v)| s == "ok" || (s == "unsupported" && v.starts_with("cuda_paged"))),
            "{exp}: statuses {status:?} of {variant:?}"
        );
        assert!(status.iter().filter(|s| *s == "ok").count() >= 4);
        assert!(column(&rows, "device").iter().all(|d| d == "cuda:0"));
        // The provenance names the GPU the run measured (the fake driver's device).
        for json in std::fs::read_dir(results.join(exp)).unwrap() {
            let path = json.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let prov: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                let gpu = prov["gpu"].as_str().unwrap_or_default();
                assert!(
                    gpu.contains("fake libcuda") && gpu.contains("SMs"),
                    "{exp}: gpu {gpu:?}"
                );
            }
        }
        // Every timed row has its cold median and, beside it, the hot one.
        let (cold, hot) = (column(&rows, "median_ms"), column(&rows, "hot_median_ms"));
        for (i, s) in status.iter().enumerate() {
            if s == "ok" {
                let ms = |v: &str| v.parse::<f64>().ok().filter(|m| *m > 0.0);
                assert!(
                    ms(&cold[i]).is_some() && ms(&hot[i]).is_some(),
                    "{exp}: {} cold '{}' hot '{}'",
                    variant[i],
                    cold[i],
                    hot[i]
                );
            }
        }
    }

    peers_beside_cuda_variants(&dir, &libs);

    // A device that fails (here: no kernel behind the entry points) fails the check: exit 1,
    // FAIL rows naming the device error, not rows quietly marked unsupported.
    let broken = dir.join("broken");
    let out = run(
        &dir,
        "",
        &broken,
        &[
            "check",
            "--device",
            "cuda",
            "--family",
            "speculative",
            "--cases",
            "1",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("FAIL") && text.contains("device error"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A peer whose manifest names cuda runs beside the CUDA variants, told the device (the test
/// peer computes on the CPU whatever it is told); one that runs on the CPU only is left out
/// of a spec's peers and refused by --peer, one line, exit 2.
fn peers_beside_cuda_variants(dir: &Path, libs: &str) {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED the CUDA peer run: python3 is not on PATH");
        return;
    }
    let root = dir.join("peer_run");
    let peers = root.join("peers");
    let exps = root.join("experiments");
    let peer = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/pyattn.py");
    let log = root.join("pyattn.log");
    for (name, devices) in [("both", "[\"cpu\", \"cuda\"]"), ("cpu_only", "[\"cpu\"]")] {
        std::fs::create_dir_all(peers.join(name)).unwrap();
        std::fs::write(
            peers.join(name).join("peer.toml"),
            format!(
                "name = \"{name}\"\nabout = \"test\"\nfamilies = [\"attention\"]\ndevices = {devices}\ncommand = [\"python3\", {:?}, \"--log\", {:?}]\ninstall = \"x\"\n",
                peer.display().to_string(),
                log.display().to_string()
            ),
        )
        .unwrap();
    }
    std::fs::create_dir_all(&exps).unwrap();
    std::fs::write(
        exps.join("tiny_cuda_peers.toml"),
        r#"name = "tiny_cuda_peers"
question = "Do peers run beside the CUDA variants?"
claims = ["C8"]
family = "attention"
variants = ["flash2"]
cuda_variants = ["cuda_naive", "cuda_flash2"]
peers = ["both", "cpu_only"]
reps = 2

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
"#,
    )
    .unwrap();
    let results = root.join("results");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "--experiments-dir".to_string(),
            exps.display().to_string(),
            "exp".into(),
            "tiny_cuda_peers".into(),
            "--device".into(),
            "cuda".into(),
            "--peers-dir".into(),
            peers.display().to_string(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let a = args(&[]);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    ok(&run(dir, libs, &results, &a), "exp with a cuda peer");
    let rows = csv_rows(&results.join("tiny_cuda_peers"));
    let variant = column(&rows, "variant");
    let status = column(&rows, "status");
    assert_eq!(
        variant.iter().filter(|v| *v == "both").count(),
        2,
        "{variant:?}"
    );
    assert!(!variant.iter().any(|v| v == "cpu_only"), "{variant:?}");
    // cuda_flash2 takes head_dim 8 at no point (its tiles need more): unsupported.
    assert!(
        variant
            .iter()
            .zip(&status)
            .all(|(v, s)| s == "ok" || (s == "unsupported" && v == "cuda_flash2")),
        "{status:?} of {variant:?}"
    );
    // On the device the peer is also asked for hot times, and its row takes them.
    let hot = column(&rows, "hot_median_ms");
    for (i, v) in variant.iter().enumerate() {
        if status[i] == "ok" {
            assert!(hot[i].parse::<f64>().is_ok(), "{v}: hot '{}'", hot[i]);
        }
    }
    let case = std::fs::read_to_string(&log).unwrap();
    assert!(case.lines().any(|l| l.ends_with(" time")), "{case}");
    assert!(case.lines().any(|l| l.ends_with(" time hot")), "{case}");
    assert!(
        case.lines().any(|l| l.ends_with(" device cuda:0")),
        "{case}"
    );
    let a = args(&["--peer", "cpu_only"]);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let out = run(dir, libs, &root.join("refused"), &a);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("runs on cpu only, not on cuda:0"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
