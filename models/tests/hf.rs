//! Hugging Face checkpoints against transformers: a tiny random Llama (one safetensors file)
//! and a tiny random Mixtral (top-2 of 4 experts, three shards with an index), both written by
//! `tests/data/make_hf_fixtures.py` with the logits transformers computed for every prompt
//! position and its greedy continuation. Our f32 logits must be within 1e-4 relative error
//! (max |Δ| / max |logit|) for every attention variant, the greedy ids equal; the
//! transformers-4 config style loads the same model; broken directories are one clear error.

use models::{load, LoadOptions, Session};
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

struct Expected {
    prompt: Vec<u32>,
    logits: Vec<Vec<f32>>,
    greedy: Vec<u32>,
}

fn expected(name: &str) -> Expected {
    let text = std::fs::read_to_string(data(&format!("{name}_expected.json"))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    Expected {
        prompt: ids(&v["prompt_ids"]),
        logits: v["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect()
            })
            .collect(),
        greedy: ids(&v["greedy_ids"]),
    }
}

fn opts(attention: &str) -> LoadOptions {
    LoadOptions {
        attention: attention.into(),
        ..LoadOptions::default()
    }
}

fn check_against_transformers(dir: &Path, name: &str) {
    let want = expected(name);
    for (attention, block) in [("naive", 16), ("flash2", 3), ("paged", 4), ("paged", 1)] {
        let m = load(dir.to_str().unwrap(), &opts(attention)).unwrap().model;
        let mut s = Session::new(&m, 64, block).unwrap();
        let got = s.forward_all(&want.prompt).unwrap();
        let vocab = m.cfg.vocab;
        // Row by row, so paged decode (one token at a time) is checked too.
        let mut s2 = Session::new(&m, 64, block).unwrap();
        for (pos, row) in want.logits.iter().enumerate() {
            let one = s2.forward(&want.prompt[pos..pos + 1]).unwrap();
            for (label, ours) in [
                ("prompt pass", &got[pos * vocab..(pos + 1) * vocab]),
                ("token by token", &one[..]),
            ] {
                let scale = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let err = ours
                    .iter()
                    .zip(row)
                    .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    err / scale <= 1e-4,
                    "{name} {attention} bs={block} {label} position {pos}: max |Δ| {err} vs scale {scale}"
                );
            }
        }
        let greedy = m
            .greedy_with_blocks(&want.prompt, want.greedy.len(), None, block)
            .unwrap();
        assert_eq!(greedy, want.greedy, "{name} {attention} bs={block} greedy");
    }
}

#[test]
fn llama_matches_transformers() {
    check_against_transformers(&data("hf_llama"), "hf_llama");
}

#[test]
fn sharded_mixtral_matches_transformers() {
    check_against_transformers(&data("hf_mixtral"), "hf_mixtral");
}

/// A scratch copy of a fixture directory that a test may break.
fn scratch_copy(name: &str, tag: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("models-hf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(data(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

#[test]
fn transformers_4_config_style_loads_the_same_model() {
    let dir = scratch_copy("hf_llama", "v4");
    edit_config(&dir, |v| {
        let o = v.as_object_mut().unwrap();
        let theta = o.remove("rope_parameters").unwrap()["rope_theta"].clone();
        o.insert("rope_theta".into(), theta);
    });
    let want = expected("hf_llama");
    let m = load(dir.to_str().unwrap(), &opts("flash2")).unwrap().model;
    assert_eq!(m.greedy(&want.prompt, 12, None).unwrap(), want.greedy);
    std::fs::remove_dir_all(dir).unwrap();
}

fn load_err(dir: &Path) -> String {
    match load(dir.to_str().unwrap(), &opts("flash2")) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn broken_checkpoints_are_one_clear_error() {
    let dir = scratch_copy("hf_llama", "broken");
    let st = dir.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();

    std::fs::write(&st, &bytes[..bytes.len() - 100]).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains("model.safetensors") && e.contains("not a valid safetensors"),
        "{e}"
    );

    std::fs::write(&st, b"garbage").unwrap();
    assert!(load_err(&dir).contains("not a valid safetensors"));
    std::fs::write(&st, &bytes).unwrap();

    edit_config(&dir, |v| v["intermediate_size"] = 96.into());
    let e = load_err(&dir);
    assert!(
        e.contains("mlp.gate_proj") && e.contains("expected 96×32"),
        "{e}"
    );

    edit_config(&dir, |v| {
        v["intermediate_size"] = 64.into();
        v["num_hidden_layers"] = 3.into();
    });
    let e = load_err(&dir);
    assert!(
        e.contains("model.layers.2.") && e.contains("missing"),
        "{e}"
    );

    edit_config(&dir, |v| v["architectures"][0] = "GPT2LMHeadModel".into());
    assert!(load_err(&dir).contains("'GPT2LMHeadModel' is not LlamaForCausalLM"));

    std::fs::write(dir.join("config.json"), b"{ not json").unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains("config.json") && e.contains("malformed JSON"),
        "{e}"
    );

    std::fs::remove_file(dir.join("config.json")).unwrap();
    assert!(load_err(&dir).contains("no config.json"));
    std::fs::remove_dir_all(dir).unwrap();

    let e = load_err(Path::new("no-such-model"));
    assert!(
        e.contains("not a .gguf file, a checkpoint directory or a preset"),
        "{e}"
    );
    let e = match load("llama-2-70b", &opts("flash2")) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a shape-only preset loaded"),
    };
    assert!(e.contains("shape-only"), "{e}");
}
