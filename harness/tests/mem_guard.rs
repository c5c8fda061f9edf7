//! The memory guard end to end: `exp moe_capacity --set tokens=50000000 --set experts=8` (which
//! used to die with a failed 100 GB allocation, SIGABRT) finishes with `skipped` rows that say
//! why and a finished provenance; a tight `--mem-budget` skips attention, quant and decode
//! points the same way while a generous one runs them; `generate` with a K/V cache over the
//! budget is one line and exit 2; a bad `--mem-budget` is one line and exit 2.

mod common;

use common::TempDir;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_harness");

fn harness(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("the harness binary runs")
}

/// The statuses and notes of the one CSV an `exp` wrote under `results/<exp>/`.
fn rows_of(results: &Path, exp: &str) -> Vec<(String, String)> {
    let dir = results.join(exp);
    let csvs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "csv"))
        .collect();
    assert_eq!(csvs.len(), 1, "{csvs:?}");
    let json = csvs[0].with_extension("json");
    let prov: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    assert!(prov["inputs"]["mem_budget"].is_string(), "{prov}");
    let mut reader = csv::Reader::from_path(&csvs[0]).unwrap();
    let header = reader.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let (status, note) = (col("status"), col("note"));
    reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            (r[status].to_string(), r[note].to_string())
        })
        .collect()
}

fn ok_exit(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn one_line_exit_2(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(needle), "want '{needle}' in {stderr}");
}

#[test]
fn a_moe_layer_of_fifty_million_tokens_is_skipped_not_aborted() {
    let dir = TempDir::new("mem_guard", "moe");
    let results = dir.join("results");
    let out = harness(&[
        "exp",
        "moe_capacity",
        "--quick",
        "--set",
        "tokens=50000000",
        "--set",
        "experts=8",
        "--results-dir",
        results.to_str().unwrap(),
        "--format",
        "json",
    ]);
    ok_exit(&out);
    let rows = rows_of(&results, "moe_capacity");
    assert!(!rows.is_empty());
    for (status, note) in &rows {
        assert_eq!(status, "skipped", "{note}");
        assert!(note.contains("over the memory budget"), "{note}");
        assert!(
            note.contains("TiB"),
            "50M tokens × 512 need terabytes: {note}"
        );
    }
}

#[test]
fn a_tight_budget_skips_points_a_generous_one_runs() {
    for (exp, extra) in [
        (
            // Without its peers: a clone without scripts/fetch-peers.sh has them `unavailable`.
            "flash_vs_paged",
            &["--no-peers", "--set", "mode=decode", "--set", "kv_len=128"][..],
        ),
        (
            "quant_tradeoff",
            &["--no-peers", "--set", "shape=256x512"][..],
        ),
        ("decode_roofline", &["--no-peers"][..]),
    ] {
        for (budget, want) in [("64K", "skipped"), ("90%", "ok")] {
            let dir = TempDir::new("mem_guard", &format!("{exp}-{budget}"));
            let results = dir.join("results");
            let mut args = vec![
                "exp",
                exp,
                "--quick",
                "--reps",
                "1",
                "--mem-budget",
                budget,
                "--results-dir",
                results.to_str().unwrap(),
                "--format",
                "json",
            ];
            args.extend_from_slice(extra);
            let out = harness(&args);
            ok_exit(&out);
            let rows = rows_of(&results, exp);
            assert!(!rows.is_empty(), "{exp}");
            for (status, note) in &rows {
                if want == "skipped" {
                    assert_eq!(status, "skipped", "{exp} under {budget}: {note}");
                    assert!(note.contains("--mem-budget 64K"), "{exp}: {note}");
                } else {
                    assert!(
                        !note.contains("memory budget"),
                        "{exp} under {budget}: {note}"
                    );
                }
            }
        }
    }
}

#[test]
fn generate_over_the_budget_and_bad_budgets_are_one_line() {
    one_line_exit_2(
        &harness(&[
            "generate",
            "--model",
            "tiny-gqa",
            "--prompt-ids",
            "1,2,3",
            "--max-new-tokens",
            "40",
            "--mem-budget",
            "1K",
        ]),
        "K/V cache",
    );
    one_line_exit_2(
        &harness(&["exp", "moe_capacity", "--quick", "--mem-budget", "lots"]),
        "--mem-budget 'lots'",
    );
    one_line_exit_2(
        &harness(&[
            "generate",
            "--model",
            "tiny-gqa",
            "--prompt-ids",
            "1",
            "--mem-budget",
            "0%",
        ]),
        "--mem-budget '0%'",
    );
}
