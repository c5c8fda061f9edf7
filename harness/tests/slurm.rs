//! A sweep on a real Slurm: a single-node cluster (Debian's slurmctld, slurmd and munge,
//! started by `scripts/slurm/local-cluster.sh` in a folder of its own, on ports of its own),
//! `exp flash_vs_paged --quick` submitted through `scripts/slurm/submit.sh` as a 4-task array
//! plus its merge job, and the merged CSV compared with an unsharded `--quick` run: the same
//! points, variants and correctness statuses. The daemons are stopped by PID at the end.
//! Without root or the packages (`local-cluster.sh install`, which CI runs) it skips, saying
//! why.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::TempDir;
#[path = "common/sweeps.rs"]
mod sweeps;
use sweeps::{plain_csv, points_of};

const BIN: &str = env!("CARGO_BIN_EXE_harness");
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
const PATH_WITH_SBIN: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Why this machine cannot run the test, if it cannot.
fn cannot_run() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if text(&uid.stdout).trim() != "0" {
        return Some("not root (the local Slurm runs its daemons as root)".into());
    }
    let missing: Vec<&str> = ["slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "munged"]
        .into_iter()
        .filter(|tool| {
            !PATH_WITH_SBIN
                .split(':')
                .any(|dir| Path::new(dir).join(tool).is_file())
        })
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "Slurm is not installed (no {}): scripts/slurm/local-cluster.sh install",
            missing.join(", ")
        )
    })
}

/// The local cluster; cancels what is still queued and stops its daemons when dropped.
struct Cluster {
    dir: PathBuf,
    jobs: Vec<String>,
}

impl Cluster {
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("PATH", PATH_WITH_SBIN)
            .env("SLURM_CONF", self.dir.join("slurm.conf"))
            .current_dir(REPO);
        cmd
    }

    fn script(&self, args: &[&str]) -> Output {
        let mut cmd = self.command("bash");
        cmd.arg(Path::new(REPO).join("scripts/slurm/local-cluster.sh"))
            .args(args);
        cmd.output().unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.jobs.is_empty() {
            let _ = self.command("scancel").args(&self.jobs).output();
            std::thread::sleep(Duration::from_secs(2));
        }
        let out = self.script(&["stop", self.dir.to_str().unwrap()]);
        if !out.status.success() {
            eprintln!("stopping the local Slurm: {}", text(&out.stderr));
        }
    }
}

#[test]
fn a_sweep_submitted_to_slurm_merges_to_the_unsharded_points() {
    if let Some(why) = cannot_run() {
        println!("SKIPPED: {why}");
        return;
    }
    let tmp = TempDir::new("slurm", "sweep");
    let results = tmp.join("results");
    let logs = tmp.join("logs");
    let mut cluster = Cluster {
        dir: tmp.join("cluster"),
        jobs: vec![],
    };
    let t0 = Instant::now();
    let out = cluster.script(&["start", cluster.dir.to_str().unwrap()]);
    assert!(out.status.success(), "local Slurm: {}", text(&out.stderr));
    let up = t0.elapsed().as_secs_f64();

    // The unsharded run, on one thread as each task.
    let t1 = Instant::now();
    let out = Command::new(BIN)
        .args([
            "exp",
            "flash_vs_paged",
            "--quick",
            "--threads",
            "1",
            "--results-dir",
        ])
        .arg(&results)
        .current_dir(REPO)
        .output()
        .unwrap();
    assert!(
        out.status.code() == Some(0),
        "unsharded: {}",
        text(&out.stderr)
    );
    let whole = t1.elapsed().as_secs_f64();
    let want = points_of(&plain_csv(&results.join("flash_vs_paged")));

    let t2 = Instant::now();
    let out = cluster
        .command("bash")
        .arg(Path::new(REPO).join("scripts/slurm/submit.sh"))
        .args(["flash_vs_paged", "4", "--quick", "--results-dir"])
        .arg(&results)
        .env("WORKBENCH_HARNESS", BIN)
        .env("WORKBENCH_SLURM_LOGS", &logs)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "submit.sh: {}{stdout}",
        text(&out.stderr)
    );
    // "sweep ID: array job A (4 shards), merge job M"
    let last = stdout.lines().last().unwrap_or("").to_string();
    let words: Vec<&str> = last.split_whitespace().collect();
    assert!(
        words.len() == 10 && words[0] == "sweep",
        "submit.sh said: {stdout}"
    );
    let (id, array, merge) = (
        words[1].trim_end_matches(':').to_string(),
        words[4].to_string(),
        words[9].to_string(),
    );
    cluster.jobs = vec![array.clone(), merge.clone()];
    loop {
        let q = cluster
            .command("squeue")
            .args(["-h", "-j", &format!("{array},{merge}")])
            .output()
            .unwrap();
        if text(&q.stdout).trim().is_empty() {
            break;
        }
        assert!(
            t2.elapsed() < Duration::from_secs(900),
            "the sweep did not finish in 15 minutes:\n{}",
            text(&q.stdout)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let sweep = t2.elapsed().as_secs_f64();
    cluster.jobs.clear();
    let merged = results.join("flash_vs_paged").join(format!("{id}.csv"));
    let merge_log = std::fs::read_to_string(logs.join(format!("workbench-merge-{merge}.out")))
        .unwrap_or_default();
    assert!(
        merged.exists(),
        "no merged CSV; the merge job said:\n{merge_log}"
    );
    let got = points_of(&merged);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the merged points differ from the unsharded run's"
    );
    assert_eq!(got, want, "variants or correctness statuses differ");
    let prov: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(merged.with_extension("json")).unwrap())
            .unwrap();
    let shards = prov["merged"]["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 4);
    let points: Vec<u64> = shards
        .iter()
        .map(|s| s["points"].as_u64().unwrap())
        .collect();
    println!(
        "Slurm: cluster up in {up:.1} s; unsharded --quick {whole:.1} s ({} points, {} rows); 4-task array + merge {sweep:.1} s from submit to merged ({points:?} points per shard)",
        want.len(),
        want.values().map(Vec::len).sum::<usize>()
    );
}
