//! `scripts/gpu-check.sh`, the one script a lent GPU runs, dry-run on the stand-in driver
//! (`GPU_CHECK_DRY_RUN=1`: every step at tiny sizes; `common/fake_cuda.rs`), so that a step
//! broken by a change fails here and not in a GPU session: every step runs and exits 0,
//! compute-sanitizer's absence is a message, the summary prints; the CUDA rows carry cold and
//! hot medians; the fake driver's trace shows the L2 flush (a memset of twice its 50 MiB L2)
//! queued right before each cold repetition and none in a hot timing. Then the sanitizer step
//! alone with a stand-in compute-sanitizer (a shell script that runs the command it is given)
//! over one family, and with no time left. Skips as the fake-driver test does.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "common/fake_cuda.rs"]
mod fake_cuda;
use fake_cuda::fake_driver;

const BIN: &str = env!("CARGO_BIN_EXE_harness");
/// The fake libcuda's L2 (50 MiB) twice: `kernel_cuda::flush_bytes`.
const FLUSH: &str = "memset 104857600";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs the script in dry-run mode against the fake driver, output under `out`.
fn script(dir: &Path, libs: &str, out: &Path, env: &[(&str, String)]) -> Output {
    let ld = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    Command::new("bash")
        .arg(root().join("scripts/gpu-check.sh"))
        .env("GPU_CHECK_DRY_RUN", "1")
        .env("HARNESS", BIN)
        .env("OUT", out)
        .env("LD_LIBRARY_PATH", format!("{}:{ld}", dir.display()))
        .env("WORKBENCH_EMU_LIBS", libs)
        .env("WORKBENCH_CUDA_ROOFLINE", "16,128")
        // Whatever this machine has: the step must find none.
        .env("COMPUTE_SANITIZER", dir.join("no-compute-sanitizer"))
        .env_remove("GPU_CHECK_STEPS")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("bash runs")
}

fn stdout_of(out: &Output, what: &str) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: exit {:?}\nstdout:\n{text}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The rows of the CSVs of one experiment as (column → value) maps.
fn rows(dir: &Path) -> Vec<std::collections::HashMap<String, String>> {
    let mut all = vec![];
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "csv") {
            let mut r = csv::Reader::from_path(&p).unwrap();
            let h = r.headers().unwrap().clone();
            for rec in r.records() {
                let rec = rec.unwrap();
                all.push(
                    h.iter()
                        .map(String::from)
                        .zip(rec.iter().map(String::from))
                        .collect(),
                );
            }
        }
    }
    all
}

#[test]
fn the_gpu_script_dry_runs_every_step_on_the_fake_driver() {
    let Some((dir, libs)) = fake_driver("dry-run") else {
        return;
    };
    let out = dir.join("out");
    let trace = dir.join("trace.txt");
    let run = script(
        &dir,
        &libs,
        &out,
        &[("WORKBENCH_FAKE_CUDA_TRACE", trace.display().to_string())],
    );
    let text = stdout_of(&run, "gpu-check.sh dry run");
    for step in [
        "roofline",
        "check",
        "decode",
        "prefill",
        "quant",
        "moe",
        "sanitizer",
        "summary",
    ] {
        assert!(
            text.contains(&format!("=== {step} (")),
            "no step {step}:\n{text}"
        );
    }
    assert!(
        text.contains(
            "compute-sanitizer not found (PATH, /usr/local/cuda/bin): sanitizer step skipped"
        ),
        "{text}"
    );
    assert!(!text.contains("failed steps"), "{text}");
    assert!(out.join("log.txt").exists() && out.join("summary.txt").exists());

    // Our CUDA rows: checked and timed cold, with the hot median beside (paged decode refuses
    // prefill); the peers' rows are whatever this machine's PyTorch makes of them.
    for exp in ["flash_vs_paged", "quant_tradeoff", "moe_capacity"] {
        let rows = rows(&out.join("results").join(exp));
        let ours: Vec<_> = rows
            .iter()
            .filter(|r| r["variant"].starts_with("cuda"))
            .collect();
        assert!(ours.len() >= 2, "{exp}: {} rows of ours", ours.len());
        for r in ours {
            let (v, s) = (&r["variant"], &r["status"]);
            if s == "unsupported" && v.starts_with("cuda_paged") {
                continue;
            }
            assert_eq!(s, "ok", "{exp} {v}: {}", r["note"]);
            for col in ["median_ms", "hot_median_ms"] {
                assert!(
                    r[col].parse::<f64>().is_ok(),
                    "{exp} {v}: {col} '{}'",
                    r[col]
                );
            }
        }
    }

    // The flush: before every cold repetition a memset of twice the L2, right before the
    // timed launch or copy; a GEMV timed cold then hot (2 repetitions each, after a warm-up)
    // reads launch, flush+launch twice, then three launches with no flush.
    let trace = std::fs::read_to_string(&trace).unwrap();
    let lines: Vec<&str> = trace.lines().collect();
    let flushes = lines.iter().filter(|l| **l == FLUSH).count();
    assert!(flushes >= 20, "{flushes} flushes");
    for (i, l) in lines.iter().enumerate() {
        if *l == FLUSH {
            let next = lines.get(i + 1).copied().unwrap_or("");
            assert!(
                next.starts_with("launch ") || next.starts_with("copy "),
                "line {i}: the flush is followed by '{next}'"
            );
        }
    }
    let gemv: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| *l == FLUSH || l.starts_with("launch gemv_q4_0"))
        .map(|l| if l == FLUSH { "F" } else { "L" })
        .collect();
    let warm_cold_hot = ["L", "F", "L", "F", "L", "L", "L", "L"];
    assert!(
        gemv.windows(warm_cold_hot.len())
            .any(|w| w == warm_cold_hot),
        "the q4_0 GEMV's launches and flushes: {gemv:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_sanitizer_step_runs_each_tool_over_a_family_within_its_time() {
    let Some((dir, libs)) = fake_driver("sanitizer") else {
        return;
    };
    // A stand-in compute-sanitizer: notes its options, then runs the command after them.
    let stub = dir.join("compute-sanitizer");
    let calls = dir.join("calls.txt");
    std::fs::write(
        &stub,
        format!(
            "#!/usr/bin/env bash\n[ \"$1\" = --version ] && {{ echo 'stand-in 1.0'; exit 0; }}\n\
             opts=()\nwhile [[ \"$1\" == --* ]]; do opts+=(\"$1\" \"$2\"); shift 2; done\n\
             echo \"${{opts[*]}}\" >>{calls:?}\n\"$@\"\nrc=$?\n\
             echo '========= ERROR SUMMARY: 0 errors'\nexit $rc\n"
        ),
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&stub).status().unwrap();
    let sanitizer = |out: &str, seconds: &str| {
        script(
            &dir,
            &libs,
            &dir.join(out),
            &[
                ("GPU_CHECK_STEPS", "sanitizer".into()),
                ("COMPUTE_SANITIZER", stub.display().to_string()),
                ("GPU_CHECK_SANITIZER_FAMILIES", "quant".into()),
                ("GPU_CHECK_SANITIZER_S", seconds.into()),
            ],
        )
    };
    let text = stdout_of(&sanitizer("out", "150"), "sanitizer step");
    assert!(!text.contains("=== roofline"), "{text}");
    for tool in ["memcheck", "racecheck", "synccheck"] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(tool))
            .unwrap_or_else(|| panic!("no {tool} line:\n{text}"));
        assert!(
            line.contains("quant") && line.contains("clean") && line.contains("0 errors"),
            "{line}"
        );
        assert!(dir.join(format!("out/sanitizer/{tool}-quant.log")).exists());
    }
    let calls = std::fs::read_to_string(&calls).unwrap();
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        [
            "--tool memcheck --error-exitcode 99",
            "--tool racecheck --error-exitcode 99",
            "--tool synccheck --error-exitcode 99"
        ],
        "{calls}"
    );
    // The families the step runs by default are the check's (`--cases 0` is refused only
    // after the family is looked up).
    let text = std::fs::read_to_string(root().join("scripts/gpu-check.sh")).unwrap();
    let (_, rest) = text
        .split_once("GPU_CHECK_SANITIZER_FAMILIES:-")
        .expect("a default family list");
    let families: Vec<&str> = rest[..rest.find('}').unwrap()].split_whitespace().collect();
    assert_eq!(families.len(), 5, "{families:?}");
    for family in families {
        let out = Command::new(BIN)
            .args(["check", "--family", family, "--cases", "0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--cases must be at least 1"),
            "{family}: {err}"
        );
    }
    // No time left: every run is skipped with a message, and that is no failure.
    let text = stdout_of(&sanitizer("out-late", "2"), "sanitizer step, no time");
    assert_eq!(text.matches("skipped: no time left").count(), 3, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
