//! `harness exp quant_accuracy` end to end: bad input is one line, exit 2 and nothing under
//! results/; a tiny run on SmolLM2 (when fetched) fills every column of every study, ranks
//! the scans, and builds the plan from the ranking.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_harness");

fn exp(results: &Path, sets: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.args(["exp", "quant_accuracy", "--format", "json", "--results-dir"])
        .arg(results);
    for s in sets {
        c.args(["--set", s]);
    }
    c.output().expect("the harness binary runs")
}

fn smollm2() -> bool {
    let there = models::smollm2_path().exists();
    if !there {
        eprintln!("SKIPPED: SmolLM2 is absent (run scripts/fetch-models.sh)");
    }
    there
}

/// Exit 2, one `error:` line containing `want`, nothing written.
fn refused(results: &Path, sets: &[&str], want: &str) {
    let out = exp(results, sets);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{sets:?}: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(want), "{sets:?}: {err}");
    assert!(
        !results.join("quant_accuracy").exists(),
        "{sets:?} wrote results"
    );
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = TempDir::new("accuracy", "bad");
    let r = dir.join("results");
    refused(&r, &["format=q9_0"], "q9_0");
    refused(&r, &["sens_format=sym9g32"], "sym9g32");
    refused(&r, &["study=everything"], "study 'everything'");
    refused(&r, &["model=tiny-gqa"], "no tokenizer");
    if !smollm2() {
        return;
    }
    let short = dir.join("short.txt");
    fs::write(&short, "A sentence far shorter than one window.").unwrap();
    let short = format!("text={}", short.display());
    refused(&r, &[&short], "shorter than one window");
    refused(&r, &["windows=1000"], "room for");
    refused(&r, &["sens_format=sym4g128"], "576");
    refused(&r, &["layers=30"], "layer index below 30");
    refused(&r, &["layers=0", "plan_top=2"], "plan_top 2");
    refused(&r, &["ctx=9000"], "context");
}

#[test]
fn a_tiny_run_fills_every_study() {
    if !smollm2() {
        return;
    }
    let dir = TempDir::new("accuracy", "tiny");
    let r = dir.join("results");
    let out = exp(
        &r,
        &[
            "format=f32,q4_0,sym4g128",
            "ctx=32",
            "windows=1",
            "sens_format=sym3g32",
            "sens_ctx=32",
            "sens_windows=1",
            "layers=0,29",
            "plan_top=1",
            "decode_context=8",
            "decode_steps=2",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let of = |study: &str| -> Vec<&serde_json::Value> {
        rows.iter().filter(|r| r["study"] == study).collect()
    };
    let num = |r: &serde_json::Value, k: &str| {
        r[k].as_f64().unwrap_or_else(|| panic!("{k} empty in {r}"))
    };
    // Formats: f32 against itself is exact; q4_0 is not; g128 does not divide 576.
    let formats = of("formats");
    assert_eq!(formats.len(), 3);
    let (f32, q4) = (formats[0], formats[1]);
    assert_eq!(num(f32, "kl_mean"), 0.0);
    assert_eq!(num(f32, "delta_ppl"), 0.0);
    assert_eq!(num(f32, "top1_agreement"), 1.0);
    assert_eq!(num(f32, "bits_per_weight"), 32.0);
    assert!(num(q4, "kl_mean") > 0.0);
    assert_eq!(num(q4, "bits_per_weight"), 4.5);
    for r in [f32, q4] {
        for k in [
            "ppl",
            "ppl_ci_lo",
            "ppl_ci_hi",
            "decode_tokens_per_s",
            "speedup_vs_f32",
            "weight_mb",
        ] {
            assert!(num(r, k) > 0.0, "{k} in {r}");
        }
        assert!(num(r, "ppl_ci_lo") <= num(r, "ppl") && num(r, "ppl") <= num(r, "ppl_ci_hi"));
        assert_eq!(r["scored_tokens"], 15);
    }
    assert_eq!(formats[2]["status"], "unsupported");
    assert!(formats[2]["note"].as_str().unwrap().contains("576"));
    // Scans: ranks 1..n by decreasing KL.
    for (study, n) in [("layers", 2), ("projections", 7)] {
        let mut scan = of(study);
        assert_eq!(scan.len(), n);
        scan.sort_by_key(|r| r["rank"].as_u64().unwrap());
        let ranks: Vec<u64> = scan.iter().map(|r| r["rank"].as_u64().unwrap()).collect();
        assert_eq!(ranks, (1..=n as u64).collect::<Vec<_>>());
        let kls: Vec<f64> = scan.iter().map(|r| num(r, "kl_mean")).collect();
        assert!(kls.windows(2).all(|w| w[0] >= w[1]), "{kls:?}");
        assert!(kls.iter().all(|&k| k > 0.0), "{kls:?}");
    }
    // The plan: uniform low, uniform high, the mixed one between them in bits.
    let plan = of("plan");
    assert_eq!(plan.len(), 3);
    let bits: Vec<f64> = plan.iter().map(|r| num(r, "bits_per_weight")).collect();
    assert_eq!(bits[0], 4.5);
    assert_eq!(bits[1], 8.5);
    assert!(bits[0] < bits[2] && bits[2] < bits[1], "{bits:?}");
    let kept = plan[2]["target"].as_str().unwrap();
    assert!(kept == "0" || kept == "29", "{kept}");
    let csv = fs::read_dir(r.join("quant_accuracy"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "svg"))
        .count();
    assert_eq!(csv, 2, "the two plots");
}
