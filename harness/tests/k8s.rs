//! The Kubernetes manifest of a sweep (`scripts/k8s/sweep-job.yaml`) without a cluster: its
//! fields (an Indexed Job whose completions are the shard count, the shard taken from
//! `JOB_COMPLETION_INDEX`, `--resume`, one shared results volume, a merge Job that agrees on
//! the sweep) are checked, and both command lines run exactly as written — every index's
//! shard, then the merge — on the kv calculator's quick grid.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use yaml_rust2::{Yaml, YamlLoader};

mod common;
use common::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_harness");
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The Job's only container and its environment.
fn container(job: &Yaml) -> (&Yaml, BTreeMap<String, String>) {
    let containers = job["spec"]["template"]["spec"]["containers"]
        .as_vec()
        .expect("containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let env = c["env"]
        .as_vec()
        .expect("env")
        .iter()
        .map(|e| {
            let v = e["value"].as_str().expect("env values are strings");
            (e["name"].as_str().unwrap().to_string(), v.to_string())
        })
        .collect();
    (c, env)
}

/// `sh -c SCRIPT`: the script.
fn script(c: &Yaml) -> String {
    let command: Vec<&str> = c["command"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(command, ["sh", "-c"]);
    c["args"][0].as_str().expect("one script").to_string()
}

/// The claim mounted, and where.
fn volume(job: &Yaml, c: &Yaml) -> (String, String) {
    let mount = &c["volumeMounts"][0];
    let vol = &job["spec"]["template"]["spec"]["volumes"][0];
    assert_eq!(mount["name"], vol["name"]);
    (
        vol["persistentVolumeClaim"]["claimName"]
            .as_str()
            .unwrap()
            .into(),
        mount["mountPath"].as_str().unwrap().into(),
    )
}

#[test]
fn the_indexed_job_and_its_merge_agree_and_their_command_lines_run() {
    let text = std::fs::read_to_string(Path::new(REPO).join("scripts/k8s/sweep-job.yaml")).unwrap();
    let docs = YamlLoader::load_from_str(&text).expect("the manifest is YAML");
    assert_eq!(docs.len(), 2, "the shards' Job and the merge Job");
    let (sweep, merge) = (&docs[0], &docs[1]);
    for job in [sweep, merge] {
        assert_eq!(job["apiVersion"].as_str(), Some("batch/v1"));
        assert_eq!(job["kind"].as_str(), Some("Job"));
    }
    let spec = &sweep["spec"];
    assert_eq!(spec["completionMode"].as_str(), Some("Indexed"));
    let (shard, env) = container(sweep);
    let shards: i64 = env["SHARDS"].parse().unwrap();
    assert_eq!(
        spec["completions"].as_i64(),
        Some(shards),
        "one completion per shard"
    );
    assert!(spec["parallelism"].as_i64().unwrap() <= shards);
    let restart = spec["template"]["spec"]["restartPolicy"].as_str().unwrap();
    assert!(["OnFailure", "Never"].contains(&restart), "{restart}");
    let shard_script = script(shard);
    for part in [
        "exp \"$EXPERIMENT\"",
        "--shard \"$JOB_COMPLETION_INDEX/$SHARDS\"",
        "--sweep-id \"$SWEEP_ID\"",
        "--resume",
        "--threads \"$THREADS\"",
        "--results-dir \"$RESULTS\"",
    ] {
        assert!(
            shard_script.contains(part),
            "the shard's command lacks {part}: {shard_script}"
        );
    }
    assert_eq!(
        shard["resources"]["requests"]["cpu"].as_str(),
        Some(env["THREADS"].as_str()),
        "threads = the CPUs requested"
    );

    let (merger, merge_env) = container(merge);
    for key in ["EXPERIMENT", "SHARDS", "SWEEP_ID", "RESULTS", "HARNESS"] {
        assert_eq!(env[key], merge_env[key], "the two Jobs disagree on {key}");
    }
    let merge_script = script(merger);
    assert!(merge_script.contains("merge \"$SWEEP_ID\" --results-dir \"$RESULTS\""));
    assert_eq!(
        merge["spec"]["template"]["spec"]["restartPolicy"].as_str(),
        Some("Never")
    );
    let (claim, path) = volume(sweep, shard);
    assert_eq!(
        volume(merge, merger),
        (claim, path.clone()),
        "one shared volume"
    );
    assert_eq!(path, env["RESULTS"]);

    // Both command lines as written, the sweep swapped for the kv calculator's quick grid
    // and the volume for a folder: each index's shard, then the merge.
    let tmp = TempDir::new("k8s", "manifest");
    let run = |script: &str, index: Option<i64>| {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).current_dir(REPO);
        for (k, v) in &env {
            cmd.env(k, v);
        }
        cmd.env("EXPERIMENT", "kv_calc")
            .env("HARNESS", BIN)
            .env("HARNESS_ARGS", "--quick")
            .env("THREADS", "1")
            .env("RESULTS", &tmp.0);
        if let Some(i) = index {
            cmd.env("JOB_COMPLETION_INDEX", i.to_string());
        }
        let out = cmd.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{script}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for i in 0..shards {
        run(&shard_script, Some(i));
    }
    run(&merge_script, None);
    let merged = tmp.join("kv_calc").join(format!("{}.csv", env["SWEEP_ID"]));
    let rows = csv::Reader::from_path(&merged)
        .unwrap_or_else(|e| panic!("no merged CSV {}: {e}", merged.display()))
        .records()
        .count();
    assert_eq!(rows, 12, "kv_calc --quick has 12 points of one row");
}
