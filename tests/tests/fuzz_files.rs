//! The file parsers under arbitrary bytes (`workbench_tests::fuzz`), each seeded from the
//! committed files: safetensors case files (`tests/cases/`, `kernels/quant/tests/data/`)
//! parsed, prepared by their family as `harness replay` does, and every prepared variant run
//! once; Hugging Face checkpoints (`models/tests/data/`: `config.json`, `model.safetensors`,
//! the shard index and a shard) opened, built and run one step; experiment specs
//! (`experiments/*.toml`) parsed, checked against their family, their grid resolved (and
//! expanded into points for attention specs). Each must accept, or refuse with one line naming
//! the file, never panic, and peak within a few times the file's size.

use harness::case_file::CaseFile;
use harness::spec::ExperimentSpec;
use models::model::hf::HfCheckpoint;
use models::{LoadOptions, Session};
use std::path::{Path, PathBuf};
use workbench_tests::fuzz::{cases, exclusive, fuzz, mutated, workspace_file, Bound, Seed};

/// Parsers that keep what they read (tensors, a model) peak within 16 × the input plus
/// 16 MiB (a built model holds its weights in the product's layout, widened to f32).
const BOUND: Bound = Bound {
    factor: 16,
    slack: 16 << 20,
};

fn names<T>(path: &Path) -> impl Fn(&T, &str) -> bool + '_ {
    move |_: &T, m: &str| m.contains(&path.display().to_string())
}

/// What `harness replay` does with a file before timing: parse, prepare, run each job once.
fn replay_once(path: &Path, bytes: &[u8]) -> harness::error::Result<()> {
    let case = CaseFile::parse(path, bytes, |f| {
        harness::families::replayable(f).map(|r| r.needs)
    })?;
    let family = harness::families::replayable(&case.family).map_err(|e| case.error(e))?;
    let prepared = (family.prepare)(&case, &[])?;
    for run in &prepared.runs {
        if let Ok(job) = &run.job {
            // A variant may refuse what it is given (a row status, not exit 2); none may panic.
            if let Ok(mut started) = job.start() {
                let _ = started.run();
            }
        }
    }
    Ok(())
}

#[test]
fn mutated_case_files_replay_or_name_the_problem() {
    let _heap = exclusive();
    let seeds: Vec<Seed> = [
        "tests/cases/sdpa_gqa_causal.safetensors",
        "tests/cases/sdpa_gqa_causal_bf16.safetensors",
        "tests/cases/paged_decode_sdpa.safetensors",
        "tests/cases/moe_mixtral_top2.safetensors",
        "kernels/quant/tests/data/gguf_q4_0.safetensors",
        "kernels/quant/tests/data/gguf_q4_1.safetensors",
        "kernels/quant/tests/data/gguf_q8_0.safetensors",
    ]
    .iter()
    .flat_map(|p| workspace_file(p).map_or(vec![], |b| Seed::safetensors(p, b)))
    .collect();
    assert!(!seeds.is_empty(), "the committed case files are missing");
    let path = Path::new("fuzz/case.safetensors");
    fuzz(
        "safetensors case files (replay)",
        cases(3000),
        mutated(&seeds),
        |c| c.bytes.len(),
        BOUND,
        names(path),
        |c| replay_once(path, &c.bytes).map_err(|e| e.to_string()),
    );
}

/// A copy of a checkpoint fixture directory in the temp dir, removed when dropped.
struct Fixture(PathBuf);

impl Fixture {
    fn copy(name: &str) -> Fixture {
        let from = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../models/tests/data")
            .join(name);
        let to = std::env::temp_dir().join(format!("fuzz-hf-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&to);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(&from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
        Fixture(to)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What `harness generate --model DIR` does with a checkpoint, then one forward step.
fn open_and_step(dir: &Path) -> models::model::llama::Result<()> {
    let ckpt = HfCheckpoint::open(dir)?;
    let model = ckpt.build(&LoadOptions::default())?;
    ckpt.tokenizer()?;
    // The prompt `harness generate` would accept: ids in the vocabulary, within the context.
    let ids: Vec<u32> = [1u32, 2, 3]
        .into_iter()
        .filter(|&t| (t as usize) < model.cfg.vocab)
        .take(model.cfg.context)
        .collect();
    if !ids.is_empty() {
        Session::new(&model, ids.len(), 4)?.forward(&ids)?;
    }
    Ok(())
}

#[test]
fn mutated_hf_checkpoints_load_or_name_the_problem() {
    let _heap = exclusive();
    let llama = Fixture::copy("hf_llama");
    let mixtral = Fixture::copy("hf_mixtral");
    // (directory, file) per seed: each case rewrites one file of one checkpoint.
    let mut files: Vec<(PathBuf, String)> = vec![];
    let mut seeds = vec![];
    for (dir, file) in [
        (&llama.0, "config.json"),
        (&llama.0, "model.safetensors"),
        (&mixtral.0, "config.json"),
        (&mixtral.0, "model.safetensors.index.json"),
        (&mixtral.0, "model-00002-of-00003.safetensors"),
    ] {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let these = if file.ends_with(".safetensors") {
            Seed::safetensors(file, bytes)
        } else {
            vec![Seed::text(file, bytes)]
        };
        files.extend(these.iter().map(|_| (dir.clone(), file.to_string())));
        seeds.extend(these);
    }
    fuzz(
        "hf checkpoint (config.json, index, safetensors)",
        cases(1500),
        mutated(&seeds),
        |c| c.bytes.len() + 400_000,
        BOUND,
        |_, m| m.contains("fuzz-hf-"),
        |c| {
            let (dir, file) = &files[c.seed];
            let original = &seeds[c.seed].bytes;
            std::fs::write(dir.join(file), &c.bytes).unwrap();
            let outcome = open_and_step(dir).map_err(|e| e.to_string());
            std::fs::write(dir.join(file), original).unwrap();
            outcome
        },
    );
}

/// What `harness exp NAME` checks before it creates anything under results/.
fn resolve(path: &Path, bytes: &[u8]) -> harness::error::Result<()> {
    let spec = ExperimentSpec::parse(path, bytes)?;
    let family = harness::commands::exp::family_of(&spec)?;
    for quick in [false, true] {
        let grid = spec.resolve_grid(family.grid_keys, quick, &[])?;
        if spec.family == "attention" {
            harness::families::attention::grid::points(&grid)?;
        }
    }
    Ok(())
}

#[test]
fn mutated_experiment_specs_parse_or_name_the_problem() {
    let _heap = exclusive();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments");
    let mut seeds = vec![];
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            seeds.push(Seed::text(name, std::fs::read(&p).unwrap()));
        }
    }
    assert!(seeds.len() >= 10, "the experiment specs are missing");
    let path = Path::new("fuzz/spec.toml");
    // A refusal after parsing names the experiment or the grid key at fault.
    let grid_keys: Vec<&str> = harness::families::FAMILIES
        .iter()
        .filter_map(|f| f.exp.as_ref())
        .flat_map(|e| e.grid_keys.iter().map(|(k, _)| *k))
        .collect();
    fuzz(
        "experiment specs (TOML)",
        cases(3000),
        mutated(&seeds),
        |c| c.bytes.len(),
        // A spec's grid expands into points: bounded by the grid-size limit, not the file.
        Bound {
            factor: 64,
            slack: 16 << 20,
        },
        |_, m| {
            m.contains("fuzz/spec.toml")
                || m.starts_with("experiment '")
                || grid_keys.iter().any(|k| m.contains(k))
        },
        |c| resolve(path, &c.bytes).map_err(|e| e.to_string()),
    );
}
