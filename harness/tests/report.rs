//! `harness compare` and `harness paper` through the binary: a run against itself and
//! against a slowed copy, refusals of runs that cannot be compared; the paper regenerated
//! twice (identical); planted changes in a copy of results/ that change exactly the verdicts
//! they should (and no other claim's); a dirty or unfinished run, and a missing one, marked
//! or untested with the reason; `--check` against a stale paper/.

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

/// Every claim's summary row of claims.md, by id.
fn claim_rows(out: &Path) -> std::collections::BTreeMap<String, String> {
    fs::read_to_string(out.join("claims.md"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let id = l.strip_prefix("| [")?.split(']').next()?;
            Some((id.to_string(), l.to_string()))
        })
        .collect()
}

/// Copies every file of results/ into `to`, keeping the layout.
fn copy_results(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_results(&p, &to.join(e.file_name()));
        } else {
            fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

/// Sets `column` to `value` in the one row of the CSV whose columns match `at`.
fn plant(csv: &Path, at: &[(&str, &str)], column: &str, value: &str) {
    let text = fs::read_to_string(csv).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let header: Vec<String> = lines[0].split(',').map(String::from).collect();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let hits: Vec<usize> = (1..lines.len())
        .filter(|&i| {
            let cells: Vec<&str> = lines[i].split(',').collect();
            at.iter().all(|(k, v)| cells[col(k)] == *v)
        })
        .collect();
    assert_eq!(hits.len(), 1, "{at:?} in {}", csv.display());
    let mut cells: Vec<String> = lines[hits[0]].split(',').map(String::from).collect();
    assert_ne!(
        cells[col(column)],
        value,
        "the planted value is the old one"
    );
    cells[col(column)] = value.to_string();
    lines[hits[0]] = cells.join(",");
    fs::write(csv, lines.join("\n") + "\n").unwrap();
}

/// The claims whose summary rows differ.
fn changed(
    a: &std::collections::BTreeMap<String, String>,
    b: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    a.iter()
        .filter(|(id, row)| b.get(*id) != Some(row))
        .map(|(id, _)| id.clone())
        .collect()
}

#[test]
fn a_planted_change_in_a_cited_csv_changes_exactly_the_verdicts_it_should() {
    let dir = TempDir::new("report", "planted-all");
    let results = dir.join("results");
    copy_results(&PathBuf::from(format!("{REPO}/results")), &results);
    let out = dir.join("paper");
    assert_eq!(paper(&results, &out, false).status.code(), Some(0));
    let before = claim_rows(&out);
    assert_eq!(before.len(), 27);
    assert!(before["C3"].contains("| **holds** |"), "{}", before["C3"]);

    // Llama-2-7B's KV at 4096 tokens planted at 3.2 GB instead of 2.15: C3 alone is refuted
    // (C2, C6, C7 and C12 read other rows of the same run).
    let kv = results.join("kv_calc/20261130T011829Z.csv");
    let row = [
        ("model", "llama-2-7b"),
        ("attention", "model"),
        ("dtype", "f16"),
        ("seq_len", "4096"),
        ("sessions", "1"),
    ];
    plant(&kv, &row, "total_bytes", "3200000000.0");
    assert_eq!(paper(&results, &out, false).status.code(), Some(0));
    let after = claim_rows(&out);
    assert_eq!(changed(&before, &after), ["C3"]);
    assert!(after["C3"].contains("| **refuted** |"), "{}", after["C3"]);
    plant(&kv, &row, "total_bytes", "2147483648.0");

    // Paged blocks of 16 planted at 12% fragmentation: C4's paged parts fail; C5 reads the
    // shared-prompt rows of the same run and does not change.
    // The newest run, which the checks cite.
    let alloc = fs::read_dir(results.join("kv_alloc"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .max()
        .unwrap();
    plant(
        &alloc,
        &[
            ("allocator", "paged"),
            ("block_size", "16"),
            ("system_prompt", "0"),
            ("max_new", "1024"),
        ],
        "fragmentation_pct",
        "12.0",
    );
    assert_eq!(paper(&results, &out, false).status.code(), Some(0));
    let after = claim_rows(&out);
    assert_eq!(changed(&before, &after), ["C4"]);
    assert!(
        after["C4"].contains("fragmentation -> 5% (paged): refuted"),
        "{}",
        after["C4"]
    );
}

#[test]
fn a_dirty_unfinished_or_missing_run_is_marked_or_untested() {
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
    assert!(
        claim_row(&out, "C8")
            .contains("**untested** (no run of naive_vs_flash2 on cpu in results/ yet"),
        "{}",
        claim_row(&out, "C8")
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

/// The relative targets of the markdown links in `text` (anchors and web links left out).
fn link_targets(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|l| l.split('#').next().unwrap_or("").to_string())
        .filter(|l| !l.is_empty() && !l.starts_with("http"))
        .collect()
}

#[test]
fn the_documents_cite_only_files_that_exist() {
    let dir = TempDir::new("report", "links");
    let out = dir.join("paper");
    let results = PathBuf::from(format!("{REPO}/results"));
    assert_eq!(paper(&results, &out, false).status.code(), Some(0));
    let paper_dir = PathBuf::from(format!("{REPO}/paper"));
    let mut missing = vec![];
    // The generated pages as they will sit in paper/ (their own files from `out`).
    for e in fs::read_dir(&out).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".md") {
            continue;
        }
        for l in link_targets(&fs::read_to_string(e.path()).unwrap()) {
            if !out.join(&l).exists() && !paper_dir.join(&l).exists() {
                missing.push(format!("paper/{name}: {l}"));
            }
        }
    }
    for doc in ["README.md", "paper/README.md", "ARCHITECTURE.md"] {
        let path = PathBuf::from(format!("{REPO}/{doc}"));
        let base = path.parent().unwrap().to_path_buf();
        let text = fs::read_to_string(&path).unwrap();
        for l in link_targets(&text) {
            if !base.join(&l).exists() {
                missing.push(format!("{doc}: {l}"));
            }
        }
        // Run files named in the text, in code or not.
        for word in text.split(|c: char| c.is_whitespace() || "`()[]|,;".contains(c)) {
            let Some(at) = word.find("results/") else {
                continue;
            };
            let path = word[at..].trim_end_matches(['.', ':']);
            let is_run = path.split('/').nth(2).is_some_and(|f| {
                f.len() >= 16
                    && f.as_bytes()[8] == b'T'
                    && f[..8].bytes().all(|b| b.is_ascii_digit())
            });
            if is_run && !PathBuf::from(format!("{REPO}/{path}")).exists() {
                missing.push(format!("{doc}: {path}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "links to files that do not exist: {missing:#?}"
    );
}

#[test]
fn a_newer_gpu_run_does_not_replace_a_claims_cpu_evidence() {
    // The claims cite the newest CPU run of an experiment; a GPU run of the same experiment
    // (here the committed H200 decode run, copied under a later id) changes no verdict.
    let dir = TempDir::new("report", "gpu-newer");
    let results = PathBuf::from(format!("{REPO}/results"));
    let copy = dir.join("results");
    copy_results(&results, &copy);
    let gpu = "flash_vs_paged/20261204T130855Z";
    let prov = fs::read_to_string(results.join(format!("{gpu}.json"))).unwrap();
    assert!(prov.contains("\"device\": \"cuda:0\""), "{prov}");
    for ext in ["csv", "json"] {
        fs::copy(
            results.join(format!("{gpu}.{ext}")),
            copy.join(format!("flash_vs_paged/20991231T000000Z.{ext}")),
        )
        .unwrap();
    }
    let (a, b) = (dir.join("a"), dir.join("b"));
    assert_eq!(paper(&results, &a, false).status.code(), Some(0));
    assert_eq!(paper(&copy, &b, false).status.code(), Some(0));
    assert_eq!(claim_rows(&a), claim_rows(&b));
}
