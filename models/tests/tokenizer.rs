//! The GGUF tokenizers against llama.cpp's own (`llama-tokenize`, ids in
//! tests/data/tokenizer_expected.json, written by make_tokenizer_ids.py): on each real file in
//! models/cache/ (fetched by scripts/fetch-models.sh; a test says SKIPPED and passes when its
//! file is absent) and on the two tiny vocabulary-only files beside the ids (SentencePiece with
//! llama.cpp's defaults and tied scores, byte-level BPE with the `default` pre-tokenizer) the
//! ids of every hard string and of the whole GPL-3 text, BOS as the file says, equal
//! llama.cpp's, and decoding gives the text back where the tokenizer is lossless. The choice of
//! tokenizer from the metadata and its errors are checked on crafted files.

use models::model::gguf::Value;
use models::{gemma3_path, qwen25_path, smollm2_path, Gguf, TextTokenizer};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn expected() -> serde_json::Value {
    serde_json::from_str(include_str!("data/tokenizer_expected.json")).expect("fixture is JSON")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("a list of ids")
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The GPL-3 text the fixture was written from, when this machine has the same file.
fn gpl3(want: &serde_json::Value) -> Option<String> {
    let path = want["path"].as_str().unwrap();
    let Ok(bytes) = std::fs::read(path) else {
        eprintln!("SKIPPED the GPL-3 text: {path} is absent");
        return None;
    };
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if sha != want["sha256"].as_str().unwrap() {
        eprintln!("SKIPPED the GPL-3 text: {path} is not the one the fixture was written from");
        return None;
    }
    Some(String::from_utf8(bytes).expect("the GPL-3 text is UTF-8"))
}

/// The tokenizer of `path`, timed, or None (SKIPPED) when the file is absent.
fn load(path: &Path) -> Option<TextTokenizer> {
    if !path.exists() {
        eprintln!(
            "SKIPPED: {} is absent (run scripts/fetch-models.sh)",
            path.display()
        );
        return None;
    }
    let g = Gguf::open(path).expect("the fetched model parses");
    let t = Instant::now();
    let tok = TextTokenizer::from_gguf(&g).expect("the tokenizer builds");
    eprintln!(
        "{}: tokenizer of {} tokens built in {:.1} ms",
        path.display(),
        tok.vocab_size,
        t.elapsed().as_secs_f64() * 1e3
    );
    Some(tok)
}

/// `path`'s ids equal llama.cpp's for every string and for the GPL-3 text.
fn matches_llama_cpp(path: PathBuf, add_bos: bool, lossless: bool) {
    let Some(tok) = load(&path) else { return };
    let want = expected();
    let name = path.file_name().unwrap().to_str().unwrap();
    let model = &want["models"][name];
    assert!(model.is_object(), "the fixture has no ids for {name}");
    assert_eq!(tok.add_bos, add_bos, "{name}: add_bos");
    assert_eq!(tok.lossless, lossless, "{name}: lossless");
    let mut failed = vec![];
    for s in want["strings"].as_array().unwrap() {
        let (label, text) = (s["label"].as_str().unwrap(), s["text"].as_str().unwrap());
        let got = tok.prompt_ids(text).unwrap();
        if got != ids(&model["ids"][label]) {
            failed.push(format!(
                "{label} {text:?}: ours {got:?}, llama.cpp {}",
                model["ids"][label]
            ));
        }
        if tok.lossless {
            let plain = tok.encode(text).unwrap();
            assert_eq!(tok.decode(&plain).unwrap(), text, "{name}: {label} back");
        }
    }
    assert!(failed.is_empty(), "{name}:\n{}", failed.join("\n"));
    if let Some(text) = gpl3(&want["gpl3"]) {
        let t = Instant::now();
        let got = tok.prompt_ids(&text).unwrap();
        eprintln!(
            "{name}: GPL-3 ({} bytes) in {} ids, {:.1} ms",
            text.len(),
            got.len(),
            t.elapsed().as_secs_f64() * 1e3
        );
        let llama = ids(&model["gpl3"]);
        let first = got.iter().zip(&llama).position(|(a, b)| a != b);
        assert!(
            got == llama,
            "{name}: GPL-3 ids differ from llama.cpp's ({} vs {} ids, first at {first:?})",
            got.len(),
            llama.len()
        );
        if tok.lossless {
            let plain = tok.encode(&text).unwrap();
            assert_eq!(tok.decode(&plain).unwrap(), text, "{name}: GPL-3 back");
        }
    }
}

#[test]
fn smollm2_matches_llama_cpp() {
    matches_llama_cpp(smollm2_path(), false, true);
}

#[test]
fn qwen2_matches_llama_cpp() {
    matches_llama_cpp(qwen25_path(), false, true);
}

#[test]
fn gemma3_matches_llama_cpp() {
    matches_llama_cpp(gemma3_path(), true, true);
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

#[test]
fn tiny_sentencepiece_matches_llama_cpp() {
    matches_llama_cpp(data("tiny_spm.gguf"), true, false);
}

#[test]
fn tiny_bpe_with_the_default_pre_tokenizer_matches_llama_cpp() {
    matches_llama_cpp(data("tiny_bpe.gguf"), false, true);
}

#[test]
fn gemma3_bos_specials_and_refusals() {
    let Some(tok) = load(&gemma3_path()) else {
        return;
    };
    assert_eq!((tok.bos, tok.eos), (Some(2), Some(1)));
    assert_eq!(tok.prompt_ids("").unwrap(), vec![2]);
    assert!(tok.encode("").unwrap().is_empty());
    let turn = tok.token_id("<start_of_turn>").unwrap();
    assert_eq!(tok.encode("<start_of_turn>").unwrap(), vec![turn]);
    assert_eq!(tok.decode(&[2, turn]).unwrap(), "<bos><start_of_turn>");
    // U+2581 is SentencePiece's space: it would come back as one, so it is refused.
    let e = tok.encode("a\u{2581}b").unwrap_err().to_string();
    assert!(e.contains("U+2581") && e.contains("at byte 1"), "{e}");
    let e = tok.decode(&[262_144]).unwrap_err().to_string();
    assert!(e.contains("outside the vocabulary of 262144"), "{e}");
}

/// A GGUF v3 file with no tensors and the given metadata.
fn gguf(meta: &[(&str, Value)]) -> Gguf {
    fn value(b: &mut Vec<u8>, v: &Value) {
        let s = |b: &mut Vec<u8>, t: &str| {
            b.extend((t.len() as u64).to_le_bytes());
            b.extend(t.as_bytes());
        };
        match v {
            Value::Str(t) => s(b, t),
            Value::Bool(x) => b.push(*x as u8),
            Value::UInt(x) => b.extend((*x as u32).to_le_bytes()),
            Value::Int(x) => b.extend((*x as i32).to_le_bytes()),
            Value::Float(x) => b.extend((*x as f32).to_le_bytes()),
            Value::Array(items) => {
                b.extend(type_of(&items[0]).to_le_bytes());
                b.extend((items.len() as u64).to_le_bytes());
                for x in items {
                    value(b, x);
                }
            }
        }
    }
    fn type_of(v: &Value) -> u32 {
        match v {
            Value::UInt(_) => 4,
            Value::Int(_) => 5,
            Value::Float(_) => 6,
            Value::Bool(_) => 7,
            Value::Str(_) => 8,
            Value::Array(_) => 9,
        }
    }
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        value(&mut b, &Value::Str(k.to_string()));
        b.extend(type_of(v).to_le_bytes());
        value(&mut b, v);
    }
    Gguf::parse(Path::new("crafted.gguf"), b).expect("the crafted file parses")
}

fn strs(v: &[&str]) -> Value {
    Value::Array(v.iter().map(|s| Value::Str(s.to_string())).collect())
}

#[test]
fn the_tokenizer_is_chosen_from_the_metadata() {
    let bpe = |pre: Option<&str>| {
        let mut meta = vec![
            ("tokenizer.ggml.model", Value::Str("gpt2".into())),
            ("tokenizer.ggml.tokens", strs(&["a", "b", "ab", "<|x|>"])),
            ("tokenizer.ggml.merges", strs(&["a b"])),
            (
                "tokenizer.ggml.token_type",
                Value::Array(vec![
                    Value::Int(1),
                    Value::Int(1),
                    Value::Int(1),
                    Value::Int(3),
                ]),
            ),
        ];
        if let Some(p) = pre {
            meta.push(("tokenizer.ggml.pre", Value::Str(p.into())));
        }
        TextTokenizer::from_gguf(&gguf(&meta))
    };
    for pre in [None, Some("default"), Some("smollm"), Some("qwen2")] {
        let tok = bpe(pre).unwrap();
        assert_eq!(
            tok.encode("ab<|x|>ba").unwrap(),
            vec![2, 3, 1, 0],
            "{pre:?}"
        );
        assert!(!tok.add_bos, "{pre:?}");
    }
    let e = bpe(Some("nosuch")).err().unwrap().to_string();
    assert!(
        e.contains("crafted.gguf") && e.contains("tokenizer.ggml.pre = \"nosuch\""),
        "{e}"
    );
    let e = TextTokenizer::from_gguf(&gguf(&[
        ("tokenizer.ggml.model", Value::Str("t5".into())),
        ("tokenizer.ggml.tokens", strs(&["a"])),
    ]))
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("tokenizer.ggml.model = \"t5\""), "{e}");
    let spm = |extra: Vec<(&'static str, Value)>| {
        let mut meta = vec![
            ("tokenizer.ggml.model", Value::Str("llama".into())),
            (
                "tokenizer.ggml.tokens",
                strs(&["<unk>", "<s>", "</s>", "\u{2581}a"]),
            ),
            (
                "tokenizer.ggml.scores",
                Value::Array(vec![Value::Float(0.0); 4]),
            ),
        ];
        meta.extend(extra);
        TextTokenizer::from_gguf(&gguf(&meta))
    };
    let tok = spm(vec![]).unwrap();
    // llama.cpp's SentencePiece defaults: BOS 1 first, a space before the text.
    assert_eq!((tok.add_bos, tok.bos, tok.lossless), (true, Some(1), false));
    assert_eq!(tok.prompt_ids("a").unwrap(), vec![1, 3]);
    let tok = spm(vec![("tokenizer.ggml.add_bos_token", Value::Bool(false))]).unwrap();
    assert_eq!(tok.prompt_ids("a").unwrap(), vec![3]);
    let e = spm(vec![("tokenizer.ggml.pre", Value::Str("qwen2".into()))])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("tokenizer.ggml.pre = \"qwen2\""), "{e}");
    let e = spm(vec![("tokenizer.ggml.bos_token_id", Value::UInt(9))])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("bos_token_id = 9 is outside"), "{e}");
    // No <0xXX> token for a character outside the vocabulary (the prefixed U+2581): an error.
    let e = spm(vec![]).unwrap().encode("b").unwrap_err().to_string();
    assert!(e.contains("has no <0xE2> token"), "{e}");
}
