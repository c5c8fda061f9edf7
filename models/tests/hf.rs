//! Hugging Face checkpoints against transformers, one tiny random checkpoint per architecture
//! of the table (written by `tests/data/make_hf_fixtures.py` with transformers 5.24, with the
//! logits transformers computed and its greedy continuations): for prompts of 1, 10 and 40
//! tokens, our f32 logits at the last position within 1e-4 relative L2 of transformers', the
//! 10-token prompt's logits at every position (by prompt pass and token by token) within 1e-4
//! of the largest, and 24 greedy tokens equal, for every attention variant and block size;
//! the transformers-4 config style loads the same model; broken directories and unsupported
//! configs are one clear error naming the file, the architecture and the key.

use models::{load, LoadOptions, Session};
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

struct Prompt {
    ids: Vec<u32>,
    last: Vec<f32>,
    greedy: Vec<u32>,
    /// Every position's logits (the 10-token prompt).
    all: Option<Vec<Vec<f32>>>,
}

fn expected(name: &str) -> Vec<Prompt> {
    let text = std::fs::read_to_string(data(&format!("{name}_expected.json"))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    let floats = |x: &serde_json::Value| -> Vec<f32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Prompt {
            ids: ids(&p["ids"]),
            last: floats(&p["last_logits"]),
            greedy: ids(&p["greedy"]),
            all: p["all_logits"]
                .as_array()
                .map(|rows| rows.iter().map(floats).collect()),
        })
        .collect()
}

fn opts(attention: &str) -> LoadOptions {
    LoadOptions {
        attention: attention.into(),
        ..LoadOptions::default()
    }
}

/// ‖a − b‖ / ‖b‖.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        num += ((x - y) as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den).sqrt()
}

fn check_against_transformers(name: &str) {
    let dir = data(name);
    let want = expected(name);
    assert_eq!(
        want.iter().map(|p| p.ids.len()).collect::<Vec<_>>(),
        [1, 10, 40]
    );
    for (attention, block) in [("naive", 16), ("flash2", 3), ("paged", 4), ("paged", 1)] {
        let m = load(dir.to_str().unwrap(), &opts(attention)).unwrap().model;
        let vocab = m.cfg.vocab;
        for p in &want {
            let mut s = Session::new(&m, 64, block).unwrap();
            let got = s.forward(&p.ids).unwrap();
            let err = rel_l2(&got, &p.last);
            assert!(
                err <= 1e-4,
                "{name} {attention} bs={block} {}-token prompt: last logits rel L2 {err:e}",
                p.ids.len()
            );
            let greedy = m
                .greedy_with_blocks(&p.ids, p.greedy.len(), None, block)
                .unwrap();
            assert_eq!(
                greedy,
                p.greedy,
                "{name} {attention} bs={block} greedy after {} tokens",
                p.ids.len()
            );
            let Some(rows) = &p.all else { continue };
            // Every position, by the prompt pass and token by token (paged decode).
            let all = Session::new(&m, 64, block)
                .unwrap()
                .forward_all(&p.ids)
                .unwrap();
            let mut one_by_one = Session::new(&m, 64, block).unwrap();
            for (pos, row) in rows.iter().enumerate() {
                let one = one_by_one.forward(&p.ids[pos..pos + 1]).unwrap();
                for (label, ours) in [
                    ("prompt pass", &all[pos * vocab..(pos + 1) * vocab]),
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
        }
    }
}

#[test]
fn llama_matches_transformers() {
    check_against_transformers("hf_llama");
}

#[test]
fn llama3_rope_and_biases_match_transformers() {
    check_against_transformers("hf_llama3");
}

#[test]
fn mistral_sliding_window_matches_transformers() {
    check_against_transformers("hf_mistral");
}

#[test]
fn qwen2_biases_yarn_and_windowed_layers_match_transformers() {
    check_against_transformers("hf_qwen2");
}

#[test]
fn gemma3_matches_transformers() {
    check_against_transformers("hf_gemma3");
}

#[test]
fn phi3_fused_projections_and_longrope_match_transformers() {
    check_against_transformers("hf_phi3");
}

#[test]
fn sharded_mixtral_matches_transformers() {
    check_against_transformers("hf_mixtral");
}

#[test]
fn olmoe_matches_transformers() {
    check_against_transformers("hf_olmoe");
}

#[test]
fn qwen2_moe_matches_transformers() {
    check_against_transformers("hf_qwen2moe");
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
    let dir = scratch_copy("hf_llama3", "v4");
    edit_config(&dir, |v| {
        let o = v.as_object_mut().unwrap();
        let mut rope = o.remove("rope_parameters").unwrap();
        let theta = rope.as_object_mut().unwrap().remove("rope_theta").unwrap();
        let kind = rope.as_object_mut().unwrap().remove("rope_type").unwrap();
        rope["type"] = kind;
        o.insert("rope_theta".into(), theta);
        o.insert("rope_scaling".into(), rope);
    });
    let want = &expected("hf_llama3")[1];
    let m = load(dir.to_str().unwrap(), &opts("flash2")).unwrap().model;
    assert_eq!(m.greedy(&want.ids, 24, None).unwrap(), want.greedy);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Gemma-3's transformers-4 config (`rope_theta`, `rope_local_base_freq`, `rope_scaling`,
/// `sliding_window_pattern`, no `layer_types`) is the same model as its transformers-5 one.
#[test]
fn gemma3_transformers_4_config_loads_the_same_model() {
    let dir = scratch_copy("hf_gemma3", "gemma3-v4");
    edit_config(&dir, |v| {
        let o = v.as_object_mut().unwrap();
        let rp = o.remove("rope_parameters").unwrap();
        o.remove("layer_types");
        o.remove("_sliding_window_pattern");
        o.insert("sliding_window_pattern".into(), 6.into());
        o.insert(
            "rope_theta".into(),
            rp["full_attention"]["rope_theta"].clone(),
        );
        o.insert(
            "rope_local_base_freq".into(),
            rp["sliding_attention"]["rope_theta"].clone(),
        );
        o.insert(
            "rope_scaling".into(),
            serde_json::json!({"rope_type": "linear", "factor": rp["full_attention"]["factor"]}),
        );
    });
    let want = &expected("hf_gemma3")[2];
    let m = load(dir.to_str().unwrap(), &opts("flash2")).unwrap().model;
    assert_eq!(m.greedy(&want.ids, 24, None).unwrap(), want.greedy);
    let windows: Vec<_> = m.layers.iter().map(|l| (l.window, l.rope)).collect();
    assert_eq!(
        windows,
        [
            (Some(8), 1),
            (Some(8), 1),
            (Some(8), 1),
            (Some(8), 1),
            (Some(8), 1),
            (None, 0)
        ]
    );
    std::fs::remove_dir_all(dir).unwrap();
}

fn load_err(dir: &Path) -> String {
    match load(dir.to_str().unwrap(), &opts("flash2")) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unsupported_configs_name_the_architecture_and_the_key() {
    let dir = scratch_copy("hf_llama3", "rope");
    edit_config(&dir, |v| {
        v["rope_parameters"]["rope_type"] = "dynamic".into()
    });
    let e = load_err(&dir);
    assert!(
        e.contains(
            "config.json: LlamaForCausalLM: 'rope_parameters.rope_type' 'dynamic' is not supported"
        ),
        "{e}"
    );
    edit_config(&dir, |v| {
        v["rope_parameters"]["rope_type"] = "llama3".into();
        v["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("low_freq_factor");
    });
    let e = load_err(&dir);
    assert!(
        e.contains("LlamaForCausalLM: rope type 'llama3' needs 'rope_parameters.low_freq_factor'"),
        "{e}"
    );
    edit_config(&dir, |v| v["hidden_act"] = "gelu".into());
    let e = load_err(&dir);
    assert!(
        e.contains("LlamaForCausalLM: 'hidden_act' is 'gelu'"),
        "{e}"
    );
    edit_config(&dir, |v| {
        v["hidden_act"] = "silu".into();
        v["architectures"][0] = "Qwen2MoeForCausalLM".into();
    });
    let e = load_err(&dir);
    assert!(
        e.contains("Qwen2MoeForCausalLM: 'num_experts' is missing"),
        "{e}"
    );
    std::fs::remove_dir_all(dir).unwrap();
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
    let e = load_err(&dir);
    assert!(
        e.contains("config.json: architecture 'GPT2LMHeadModel' is not one this workbench runs (LlamaForCausalLM, "),
        "{e}"
    );

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
