//! `harness compare` and `harness paper` through the binary: a run against itself and
//! against a slowed copy, refusals of runs that cannot be compared; the paper regenerated
//! twice (identical), from a copied run whose planted change flips the verdict it should, and
//! `--check` against a stale paper/.

mod common;
use common::TempDir;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_harness");
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn harness(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A timed run: two variants at three lengths, p10–p90 within ±2% of the median.
fn timed_run(path: &Path, experiment: &str, scale: f64) {
    let mut text = String::from(
        "run_id,experiment,variant,kv_len,status,reps,median_ms,p10_ms,p90_ms,rel_l2_err\n",
    );
    for variant in ["naive", "flash2:br=64"] {
        for (i, kv_len) in [128, 1024, 4096].iter().enumerate() {
            let median = (1.0 + i as f64) * scale;
            text += &format!(
                "r,{experiment},\"{variant}\",{kv_len},ok,5,{median},{},{},1.5e-7\n",
                median * 0.98,
                median * 1.02
            );
        }
    }
    fs::write(path, text).unwrap();
}

#[test]
fn a_run_against_itself_flags_nothing_and_a_slowed_copy_flags_every_row() {
    let dir = TempDir::new("report", "compare");
    let a = dir.join("a.csv");
    let slow = dir.join("slow.csv");
    timed_run(&a, "e", 1.0);
    timed_run(&slow, "e", 1.2);
    let same = harness(&["compare", a.to_str().unwrap(), a.to_str().unwrap()]);
    assert_eq!(same.status.code(), Some(0), "{}", stderr(&same));
    assert!(
        stdout(&same).contains("6 rows compared, 0 slower"),
        "{}",
        stdout(&same)
    );
    let o = harness(&[
        "compare",
        a.to_str().unwrap(),
        slow.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    assert!(rows.iter().all(|r| r["verdict"] == "slower"), "{v}");
    assert!(rows[0]["point"].as_str().unwrap().contains("variant=naive"));
    // Above the threshold it is not a regression; the other way round it is faster.
    let o = harness(&[
        "compare",
        a.to_str().unwrap(),
        slow.to_str().unwrap(),
        "--threshold",
        "25",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let o = harness(&[
        "compare",
        slow.to_str().unwrap(),
        a.to_str().unwrap(),
        "--format",
        "csv",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let csv = stdout(&o);
    assert!(
        csv.starts_with("point,before_ms,after_ms,speedup,"),
        "{csv}"
    );
    assert_eq!(csv.matches(",faster,").count(), 6, "{csv}");
}

#[test]
fn a_committed_run_compared_with_itself_by_run_id_flags_nothing() {
    let results = format!("{REPO}/results");
    let o = harness(&[
        "--results-dir",
        &results,
        "compare",
        "20261201T063430Z",
        "20261201T063430Z",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains(" 0 slower"), "{}", stdout(&o));
}

#[test]
fn runs_that_cannot_be_compared_are_one_line_and_exit_2() {
    let dir = TempDir::new("report", "refusals");
    let a = dir.join("a.csv");
    let other = dir.join("other.csv");
    let untimed = dir.join("untimed.csv");
    timed_run(&a, "e", 1.0);
    timed_run(&other, "f", 1.0);
    fs::write(
        &untimed,
        "run_id,experiment,variant,kv_len,median_ms\nr,e,naive,1,2.0\n",
    )
    .unwrap();
    for (b, says) in [
        (other.to_str().unwrap(), "compare runs of one experiment"),
        (untimed.to_str().unwrap(), "no column p10_ms, p90_ms"),
        ("no-such-run", "not a CSV, a folder, or a run id"),
    ] {
        let o = harness(&["compare", a.to_str().unwrap(), b]);
        assert_eq!(o.status.code(), Some(2), "{b}: {}", stdout(&o));
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
    }
    let o = harness(&[
        "compare",
        a.to_str().unwrap(),
        a.to_str().unwrap(),
        "--threshold",
        "-1",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

/// `harness paper` from `results` into `out`, with the repository's declarations.
fn paper(results: &Path, out: &Path, check: bool) -> Output {
    let mut args = vec![
        "--experiments-dir".to_string(),
        format!("{REPO}/experiments"),
        "--results-dir".to_string(),
        results.display().to_string(),
        "paper".to_string(),
        "--out".to_string(),
        out.display().to_string(),
    ];
    if check {
        args.push("--check".into());
    }
    Command::new(BIN).args(&args).output().unwrap()
}

/// The summary row of claim `id` in claims.md.
fn claim_row(out: &Path, id: &str) -> String {
    let text = fs::read_to_string(out.join("claims.md")).unwrap();
    text.lines()
        .find(|l| l.starts_with(&format!("| [{id}](")))
        .unwrap_or_else(|| panic!("no row for {id} in\n{text}"))
        .to_string()
}

#[test]
fn the_paper_is_the_same_twice_and_check_finds_a_stale_file() {
    let dir = TempDir::new("report", "twice");
    let results = PathBuf::from(format!("{REPO}/results"));
    let (one, two) = (dir.join("one"), dir.join("two"));
    for out in [&one, &two] {
        let o = paper(&results, out, false);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    for name in [
        "claims.md",
        "claims.svg",
        "findings.md",
        "method.md",
        "machines.md",
    ] {
        let a = fs::read_to_string(one.join(name)).unwrap();
        assert_eq!(a, fs::read_to_string(two.join(name)).unwrap(), "{name}");
        assert!(!a.is_empty());
    }
    let claims = fs::read_to_string(one.join("claims.md")).unwrap();
    for n in 1..=27 {
        assert!(claims.contains(&format!("| [C{n}](#c{n})")), "C{n} missing");
    }
    // The committed results the paper cites come from clean commits (the guide's rule); a
    // dirty one is marked (planted in a copy below).
    assert!(
        !claims.contains("**dirty tree**"),
        "a cited run of results/ records git_dirty: true"
    );
    assert!(fs::read_to_string(one.join("claims.svg"))
        .unwrap()
        .contains("Measured ÷ claimed"));
    assert_eq!(paper(&results, &one, true).status.code(), Some(0));
    fs::write(one.join("findings.md"), "edited by hand\n").unwrap();
    let o = paper(&results, &one, true);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("findings.md"), "{}", stderr(&o));
}

#[test]
fn a_planted_change_in_a_cited_csv_flips_its_verdict() {
    let dir = TempDir::new("report", "planted");
    let results = dir.join("results");
    let run = "20261130T011829Z";
    let from = PathBuf::from(format!("{REPO}/results/kv_calc"));
    fs::create_dir_all(results.join("kv_calc")).unwrap();
    for ext in ["csv", "json"] {
        fs::copy(
            from.join(format!("{run}.{ext}")),
            results.join(format!("kv_calc/{run}.{ext}")),
        )
        .unwrap();
    }
    let out = dir.join("paper");
    assert_eq!(paper(&results, &out, false).status.code(), Some(0));
    assert!(
        claim_row(&out, "C3").contains("**holds**"),
        "{}",
        claim_row(&out, "C3")
    );
    // A run that is not there: untested, with the reason.
    assert!(claim_row(&out, "C8").contains("**untested**: no run of naive_vs_flash2"));

    // Llama-2-7B at 4096 tokens now holds 3 GiB instead of 2: C3 is refuted.
    let csv_path = results.join(format!("kv_calc/{run}.csv"));
    let text = fs::read_to_string(&csv_path).unwrap();
    let planted: Vec<String> = text
        .lines()
        .map(|l| {
            if l.contains(",llama-2-7b,model,") && l.contains(",4096,1,") && l.contains(",f16,") {
                l.replace(",2.0,0.0,ok,", ",3.0,0.0,ok,")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert_ne!(
        planted.join("\n") + "\n",
        text,
        "the planted row was not found"
    );
    fs::write(&csv_path, planted.join("\n") + "\n").unwrap();
    assert_eq!(paper(&results, &out, false).status.code(), Some(0));
    assert!(
        claim_row(&out, "C3").contains("**refuted**"),
        "{}",
        claim_row(&out, "C3")
    );

    // A run made from a dirty tree is marked where it is cited.
    let json_path = results.join(format!("kv_calc/{run}.json"));
    let json = fs::read_to_string(&json_path).unwrap();
    assert!(json.contains("\"git_dirty\": false"), "{json}");
    fs::write(
        &json_path,
        json.replace("\"git_dirty\": false", "\"git_dirty\": true"),
    )
    .unwrap();
    assert_eq!(paper(&results, &out, false).status.code(), Some(0));
    let claims = fs::read_to_string(out.join("claims.md")).unwrap();
    assert!(
        claims.contains(&format!("kv_calc/{run}.md)) — **dirty tree**")),
        "{claims}"
    );

    // An unfinished run is not evidence.
    let json = fs::read_to_string(&json_path).unwrap();
    fs::write(&json_path, json.replace("\"finished\"", "\"running\"")).unwrap();
    assert_eq!(paper(&results, &out, false).status.code(), Some(0));
    assert!(
        claim_row(&out, "C3").contains("did not finish"),
        "{}",
        claim_row(&out, "C3")
    );
}
