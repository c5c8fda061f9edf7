//! GGUF files against transformers. The two real files of scripts/fetch-models.sh
//! (Qwen2.5-Coder-0.5B-Instruct: `qwen2`, a per-tensor Q5_0 / Q8_0 / Q4_K / Q6_K / F32 mix, Q/K
//! biases; Gemma-3-270M: `gemma3`, Q4_K_M, sliding windows of 512 on 5 of every 6 layers,
//! norms stored as 1 + w) with the fused product (f32 activations on the dequantised weights,
//! transformers' arithmetic): greedy continuations of 3 prompts × 24 tokens equal those of
//! `AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32)`
//! (`tests/data/make_gguf_expected.py`); skipped with a printed SKIPPED when the files are
//! absent. Tiny GGUFs written by `tests/data/make_gguf_fixtures.py` (llama with llama.cpp's Q/K
//! permutation, qwen2 with biases; each tensor in its own type, so Q and K stack while V is a
//! product of its own) give transformers' logits and greedy ids; broken ones are one line
//! naming the tensor and its type, or the architecture and the missing key.

use models::{load_gguf, Gguf, LoadOptions, Session};
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn ids(x: &serde_json::Value) -> Vec<u32> {
    x.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

fn json(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(data(name)).unwrap()).unwrap()
}

/// The fused product (f32 activations), paged attention.
fn opts() -> LoadOptions {
    LoadOptions {
        attention: "paged".into(),
        ..LoadOptions::default()
    }
}

fn real_file_matches_transformers(path: PathBuf) {
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    if !path.exists() {
        println!(
            "SKIPPED: {} is absent (run scripts/fetch-models.sh)",
            path.display()
        );
        return;
    }
    let want = &json("gguf_expected.json")["files"][&name];
    let g = Gguf::open(&path).unwrap();
    let m = load_gguf(&g, &opts()).unwrap().model;
    for p in want["prompts"].as_array().unwrap() {
        let (prompt, greedy) = (ids(&p["ids"]), ids(&p["greedy"]));
        let got = m.greedy(&prompt, greedy.len(), None).unwrap();
        assert_eq!(got, greedy, "{name}: greedy after {:?}", p["text"]);
    }
}

#[test]
fn qwen25_gguf_matches_transformers() {
    real_file_matches_transformers(models::qwen25_path());
}

#[test]
fn gemma3_gguf_matches_transformers() {
    real_file_matches_transformers(models::gemma3_path());
}

struct Tiny {
    ids: Vec<u32>,
    last: Vec<f32>,
    greedy: Vec<u32>,
}

fn tiny_expected(file: &str) -> Vec<Tiny> {
    json("tiny_gguf_expected.json")["files"][file]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Tiny {
            ids: ids(&p["ids"]),
            last: p["last_logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect(),
            greedy: ids(&p["greedy"]),
        })
        .collect()
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        num += ((x - y) as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den).sqrt()
}

fn tiny_matches_transformers(file: &str) {
    let g = Gguf::open(&data(file)).unwrap();
    for (attention, block) in [("naive", 16), ("flash2", 3), ("paged", 4)] {
        let m = load_gguf(
            &g,
            &LoadOptions {
                attention: attention.into(),
                ..LoadOptions::default()
            },
        )
        .unwrap()
        .model;
        // Q and K (q5_0) share a product, V (q8_0) is its own; biases follow the products.
        let formats: Vec<String> = m.layers[0]
            .wqkv
            .parts
            .iter()
            .map(|p| format!("{}×{} {}", p.rows(), p.cols(), p.format()))
            .collect();
        assert_eq!(formats, ["48×32 q5_0", "16×32 q8_0"], "{file}");
        for p in tiny_expected(file) {
            let got = Session::new(&m, 64, block)
                .unwrap()
                .forward(&p.ids)
                .unwrap();
            let err = rel_l2(&got, &p.last);
            assert!(
                err <= 1e-4,
                "{file} {attention} {}-token prompt: rel L2 {err:e}",
                p.ids.len()
            );
            let greedy = m
                .greedy_with_blocks(&p.ids, p.greedy.len(), None, block)
                .unwrap();
            assert_eq!(greedy, p.greedy, "{file} {attention} after {:?}", p.ids);
        }
    }
}

#[test]
fn tiny_mixed_llama_gguf_matches_transformers() {
    tiny_matches_transformers("tiny_llama.gguf");
}

#[test]
fn tiny_mixed_qwen2_gguf_matches_transformers() {
    tiny_matches_transformers("tiny_qwen2.gguf");
}

fn load_err(path: &Path) -> String {
    match Gguf::open(path).and_then(|g| load_gguf(&g, &opts())) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn broken_ggufs_name_the_tensor_type_or_the_missing_key() {
    let e = load_err(&data("tiny_llama_iq2_xxs.gguf"));
    assert!(
        e.ends_with(
            "tiny_llama_iq2_xxs.gguf: tensor 'blk.0.attn_q.weight' has type IQ2_XXS (16), which this workbench does not read"
        ),
        "{e}"
    );
    let e = load_err(&data("tiny_llama_no_heads.gguf"));
    assert!(
        e.ends_with(
            "tiny_llama_no_heads.gguf: llama: the metadata lacks llama.attention.head_count, which it needs"
        ),
        "{e}"
    );
    // general.architecture "llama" rewritten as "bloom".
    let mut bytes = std::fs::read(data("tiny_llama.gguf")).unwrap();
    let key = b"general.architecture";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4 + 8;
    assert_eq!(&bytes[at..at + 5], b"llama");
    bytes[at..at + 5].copy_from_slice(b"bloom");
    let g = Gguf::parse(Path::new("renamed.gguf"), bytes).unwrap();
    let e = load_gguf(&g, &opts()).err().unwrap().to_string();
    assert!(
        e.starts_with("renamed.gguf: general.architecture 'bloom' is not one this workbench runs (llama, qwen2, "),
        "{e}"
    );
}
