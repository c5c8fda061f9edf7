//! `harness generate` end to end: greedy text from SmolLM2-135M-Instruct (skipped with a message
//! when scripts/fetch-models.sh has not run) equals transformers' continuation; the Mixtral
//! checkpoint fixture gives transformers' greedy ids through the CLI; presets generate in other
//! weight formats; bad input (a missing or non-GGUF file, a shape-only preset, ids outside the
//! vocabulary, bad sampling parameters, no prompt, no tokenizer, a prompt that is not UTF-8,
//! SmolLM2 with a few header bytes changed, a bad --kv-cache) is one line and exit 2; sampling
//! with a seed repeats itself; speculative runs report an acceptance rate that agrees with
//! their drafter; presets generate over narrow KV caches, and `eval perplexity --kv-cache int8`
//! scores SmolLM2 against its f32 cache's saved logits (KL, top-1).

mod common;
#[path = "common/exits.rs"]
mod exits;
use exits::{json_ok, one_line_exit_2};

use common::TempDir;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_harness");

fn model() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/cache/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (run scripts/fetch-models.sh)",
            p.display()
        );
        None
    }
}

fn generate<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(BIN)
        .arg("generate")
        .args(args)
        .output()
        .expect("the harness binary runs")
}

/// The JSON a successful run printed (exit 0 asserted, stderr shown otherwise).

#[test]
fn greedy_json_matches_transformers() {
    let Some(m) = model() else { return };
    // f32 activations: transformers' float32 arithmetic (the default, packed, quantises
    // activations to int8 as llama.cpp does, and continues differently after 4 tokens).
    let out = generate(&[
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        "The capital of France is",
        "--max-new-tokens",
        "24",
        "--format",
        "json",
        "--threads",
        "2",
        "--matmul",
        "fused",
    ]);
    let v = json_ok(&out);
    let fixture: serde_json::Value = serde_json::from_str(include_str!(
        "../../models/tests/data/smollm2_transformers_greedy.json"
    ))
    .unwrap();
    let want = &fixture["cases"][0];
    assert_eq!(v["prompt_ids"], want["prompt_ids"]);
    assert_eq!(v["generated_ids"], want["greedy_ids"]);
    assert_eq!(v["text"], want["text"]);
    assert!(v["ttft_ms"].as_f64().unwrap() > 0.0 && v["tokens_per_s"].as_f64().unwrap() > 0.0);
    // --ignore-eos generates exactly N tokens even through the chat template's end token.
    let out = generate(&[
        "--model",
        m.to_str().unwrap(),
        "--prompt-ids",
        "1,4093,198,1780,314,216,34,27,34,47,2,198,1,520,9531,198",
        "--max-new-tokens",
        "10",
        "--ignore-eos",
        "--format",
        "json",
    ]);
    let v = json_ok(&out);
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 10);
}

/// Greedy ids of SmolLM2 for `extra` flags.
fn greedy_ids(m: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        "The capital of France is",
        "--max-new-tokens",
        "16",
        "--ignore-eos",
        "--format",
        "json",
    ];
    args.extend(extra);
    let v = json_ok(&generate(&args));
    v["generated_ids"].clone()
}

#[test]
fn greedy_tokens_are_the_same_on_every_isa_and_layout() {
    let Some(m) = model() else { return };
    // int8 activations: packed tiles (the default) and row-major, at every tier.
    let want = greedy_ids(&m, &[]);
    for isa in ["avx512", "avx2", "portable"] {
        let t = kernel_cpu::Isa::parse(isa).unwrap();
        if !t.supported() {
            eprintln!(
                "skipped: isa {isa} (this CPU lacks {})",
                t.missing().join(", ")
            );
            continue;
        }
        // The FMA tiers (avx2, avx512) give the same 16 tokens (their tiles and attention are
        // bit-identical). The portable tier has no FMA: its attention rounds a multiply and an
        // add separately, so a near-tie can part a long greedy run — this prompt's 15th token
        // is one ("5 4 3" against "5 3 3") — and there the first 12 tokens must agree. The two
        // int8-activation layouts have the same integer products but add the per-block scaled
        // terms in different orders (a row's blocks one after another in a tile lane, or
        // across a vector's lanes), so they are close, not bit-identical, and that 15th token
        // parts them too (it flips with the attention's summation order: naive attention gives
        // "5 3 3" on the packed tiles): they must agree on the 14 tokens before it.
        let agree = |got: &serde_json::Value, want: &serde_json::Value, what: &str| {
            if isa == "portable" {
                let (g, w) = (got.as_array().unwrap(), want.as_array().unwrap());
                assert_eq!(g.len(), w.len(), "{what}");
                assert_eq!(g[..12], w[..12], "{what}");
            } else {
                assert_eq!(got, want, "{what}");
            }
        };
        let packed = greedy_ids(&m, &["--matmul", "packed", "--isa", isa][..]);
        let rows = greedy_ids(&m, &["--matmul", "fused:act=q8", "--isa", isa][..]);
        let (p, r) = (packed.as_array().unwrap(), rows.as_array().unwrap());
        assert_eq!(
            p[..14],
            r[..14],
            "packed and row-major int8 products at {isa}"
        );
        agree(&packed, &want, &format!("packed at {isa}"));
        // f32 activations: transformers' tokens at every tier.
        let fused = greedy_ids(&m, &["--matmul", "fused", "--isa", isa][..]);
        agree(
            &fused,
            &greedy_ids(&m, &["--matmul", "fused"]),
            &format!("fused at {isa}"),
        );
    }
}

#[test]
fn an_isa_the_cpu_lacks_or_an_unknown_one_is_exit_2() {
    let out = Command::new(BIN)
        .args(["--isa", "sse9", "list"])
        .output()
        .unwrap();
    one_line_exit_2(&out, "unknown ISA 'sse9'");
    for t in kernel_cpu::Isa::ALL.into_iter().filter(|t| !t.supported()) {
        let out = Command::new(BIN)
            .args(["--isa", t.name(), "list"])
            .output()
            .unwrap();
        one_line_exit_2(&out, "lacks");
    }
    let out = Command::new(BIN)
        .env("WORKBENCH_ISA", "neon")
        .arg("list")
        .output()
        .unwrap();
    one_line_exit_2(&out, "WORKBENCH_ISA");
    let out = Command::new(BIN)
        .args(["--isa", "portable", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ISA: portable in use"));
}

#[test]
fn sampling_is_seeded() {
    let Some(m) = model() else { return };
    let run = |seed: &str| {
        let out = generate(&[
            "--model",
            m.to_str().unwrap(),
            "--prompt",
            "Once upon a time,",
            "--max-new-tokens",
            "12",
            "--ignore-eos",
            "--temperature",
            "1.0",
            "--top-k",
            "40",
            "--top-p",
            "0.95",
            "--seed",
            seed,
            "--format",
            "json",
        ]);
        json_ok(&out)["generated_ids"].clone()
    };
    assert_eq!(run("1"), run("1"), "the same seed draws the same tokens");
    assert_ne!(run("1"), run("2"));
}

#[test]
fn bad_generate_input_is_one_line() {
    one_line_exit_2(
        &generate(&["--model", "/no/such.gguf", "--prompt", "hi"]),
        "cannot read",
    );
    let not_gguf = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    one_line_exit_2(
        &generate(&["--model", not_gguf.to_str().unwrap(), "--prompt", "hi"]),
        "wrong magic",
    );
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    one_line_exit_2(
        &generate(&["--model", m, "--prompt-ids", "99999"]),
        "outside the vocabulary",
    );
    one_line_exit_2(
        &generate(&["--model", m, "--prompt", "hi", "--temperature=-1"]),
        "temperature",
    );
    one_line_exit_2(
        &generate(&[
            "--model",
            m,
            "--prompt",
            "hi",
            "--temperature",
            "1",
            "--top-p",
            "0",
        ]),
        "top-p",
    );
    one_line_exit_2(&generate(&["--model", m]), "exactly one of");
    one_line_exit_2(
        &generate(&["--model", m, "--prompt", "hi", "--max-new-tokens", "9000"]),
        "exceed",
    );
}

#[test]
fn presets_and_checkpoint_directories_generate() {
    let ok = |args: &[&str]| json_ok(&generate(args));
    let args = |model: &str, extra: &[&'static str]| -> Vec<String> {
        let mut a = vec![
            "--model".to_string(),
            model.to_string(),
            "--prompt-ids".into(),
            "1,17,93,5,64,127,33,2,88,41,7".into(),
            "--max-new-tokens".into(),
            "12".into(),
            "--format".into(),
            "json".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |model: &str, extra: &[&'static str]| {
        let a = args(model, extra);
        ok(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // The Mixtral fixture through the CLI gives transformers' greedy ids (the first 12 after
    // its 10-token prompt), paged or not.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tests/data/hf_mixtral");
    let want: serde_json::Value = serde_json::from_str(include_str!(
        "../../models/tests/data/hf_mixtral_expected.json"
    ))
    .unwrap();
    let want = &want["prompts"][1];
    let ids: Vec<String> = want["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    let ids = ids.join(",");
    for extra in [&[][..], &["--attention", "paged", "--block-size", "4"][..]] {
        let mut a = args(dir.to_str().unwrap(), extra);
        a[3] = ids.clone();
        let v = ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(
            v["generated_ids"].as_array().unwrap()[..],
            want["greedy"].as_array().unwrap()[..12],
            "{extra:?}"
        );
        assert_eq!(v["text"], "", "no tokenizer, no text");
    }
    // A preset, in another weight format and with int8 activations.
    let v = run(
        "tiny-moe",
        &["--weights", "q8_0", "--matmul", "fused:act=q8"],
    );
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 12);
}

#[test]
fn bad_model_choices_are_one_line() {
    one_line_exit_2(
        &generate(&["--model", "tiny-gqa", "--prompt", "hi"]),
        "has no tokenizer",
    );
    one_line_exit_2(
        &generate(&["--model", "llama-2-70b", "--prompt-ids", "1"]),
        "shape-only",
    );
    one_line_exit_2(
        &generate(&[
            "--model",
            "tiny-gqa",
            "--prompt-ids",
            "1",
            "--weights",
            "q9_9",
        ]),
        "q9_9",
    );
    one_line_exit_2(
        &generate(&[
            "--model",
            "tiny-gqa",
            "--prompt-ids",
            "1",
            "--attention",
            "paged:bs=8",
        ]),
        "--block-size",
    );
    one_line_exit_2(
        &generate(&["--model", "tiny-gqa", "--prompt-ids", "600"]),
        "outside the vocabulary",
    );
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tests/data");
    one_line_exit_2(
        &generate(&["--model", fixtures.to_str().unwrap(), "--prompt-ids", "1"]),
        "no config.json",
    );
}

#[test]
fn speculative_generation_from_the_cli() {
    let run = |extra: &[&str]| {
        let mut a = vec![
            "--model",
            "tiny-gqa",
            "--prompt-ids",
            "5,9,5,9,5,9,5,9,5",
            "--max-new-tokens",
            "20",
            "--format",
            "json",
        ];
        a.extend_from_slice(extra);
        generate(&a)
    };
    let plain = json_ok(&run(&[]));
    let mut rates = vec![];
    for (extra, depth) in [
        (
            &["--spec-draft", "ngram", "--spec-tree", "static:3,2,1"][..],
            3,
        ),
        (
            &[
                "--spec-draft",
                "tiny-mqa",
                "--spec-tree",
                "dynamic:8",
                "--spec-adaptive",
            ][..],
            8,
        ),
        (
            &["--spec-draft", "self:q8_0", "--spec-tree", "chain:3"][..],
            3,
        ),
        // SuffixDecoding with vLLM's adaptive limits.
        (
            &[
                "--spec-draft",
                "suffix:8:factor=1:min_prob=0.1",
                "--spec-tree",
                "chain:3",
            ][..],
            3,
        ),
    ] {
        let v = json_ok(&run(extra));
        assert_eq!(v["generated_ids"], plain["generated_ids"], "{extra:?}");
        let s = &v["spec"];
        let passes = s["target_passes"].as_u64().unwrap() as f64;
        let rate = s["acceptance_rate"].as_f64().unwrap();
        // Every pass adds its accepted drafts and one token of the target's; the first of the
        // 20 tokens comes from the prompt's pass, the last pass may overshoot by its depth.
        let accepted = s["tokens_per_pass"].as_f64().unwrap() * passes - passes;
        assert!(
            (19.0..=19.0 + depth as f64).contains(&(accepted + passes)),
            "{extra:?}: {accepted} accepted over {passes} passes"
        );
        // accepted ≤ drafted ≤ passes × depth, so the rate is at least accepted / (passes ×
        // depth), at most 1, and 0 only when nothing was accepted.
        assert!(
            rate <= 1.0 && rate >= accepted / (passes * depth as f64) - 1e-9,
            "{extra:?}: rate {rate}, {accepted} accepted over {passes} passes"
        );
        assert_eq!(rate == 0.0, accepted == 0.0, "{extra:?}: rate {rate}");
        rates.push(rate);
    }
    // The target's own weights in q8_0 draft what it decodes; an unrelated random preset
    // does not.
    assert!(rates[2] > 0.8 && rates[2] > rates[1] + 0.5, "{rates:?}");
    one_line_exit_2(
        &run(&["--spec-draft", "ngram", "--spec-tree", "static:2,0"]),
        "static",
    );
    one_line_exit_2(
        &run(&["--spec-draft", "ngram", "--spec-tree", "chain:-1"]),
        "chain",
    );
    one_line_exit_2(&run(&["--spec-draft", "micro"]), "vocabulary of 8");
    one_line_exit_2(
        &run(&["--spec-draft", "ngram", "--spec-tree", "chain:4000"]),
        "exceed the context",
    );
    one_line_exit_2(
        &run(&["--spec-draft", "ngram", "--spec-tree", "static:64,64,2"]),
        "more than 4096 draft nodes",
    );
    one_line_exit_2(&run(&["--spec-draft", "self-layers:0"]), "cannot keep 0");
    // A corpus is read with the target's tokenizer, which a preset lacks.
    one_line_exit_2(
        &run(&["--spec-draft", "suffix:8:corpus=gpl3"]),
        "no tokenizer to read the corpus",
    );
    one_line_exit_2(
        &run(&["--spec-draft", "suffix:8:corpus="]),
        "one non-empty corpus=TEXT",
    );
    one_line_exit_2(
        &run(&["--spec-draft", "suffix:8:k=3"]),
        "unknown option 'k=3'",
    );
    one_line_exit_2(&run(&["--spec-draft", "suffix:1"]), "at least 2");
    // A corpus that is not a text, on a target with a tokenizer to read it with.
    if let Some(m) = model() {
        one_line_exit_2(
            &generate(&[
                "--model",
                m.to_str().unwrap(),
                "--prompt",
                "def f",
                "--spec-draft",
                "suffix:8:corpus=/no/such/corpus.txt",
            ]),
            "corpus=/no/such/corpus.txt, read as a text",
        );
    }
    one_line_exit_2(
        &run(&["--spec-draft", "suffix:8:min_prob=2"]),
        "min_prob=2 is not in [0, 1]",
    );
    one_line_exit_2(
        &run(&["--spec-draft", "suffix:factor=-1"]),
        "factor=-1 is not a number",
    );
}

#[test]
fn prompts_that_are_not_utf8_and_bad_ids_are_one_line() {
    use std::os::unix::ffi::OsStrExt;
    let bad = OsStr::from_bytes(b"caf\xe9 \xff");
    let out = generate(&[
        OsStr::new("--model"),
        OsStr::new("tiny-gqa"),
        OsStr::new("--prompt"),
        bad,
    ]);
    one_line_exit_2(&out, "invalid UTF-8");
    for ids in ["1,,2", "-1", "4294967296", "1;2", ""] {
        let out = generate(&["--model", "tiny-gqa", "--prompt-ids", ids]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--prompt-ids {ids:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "--prompt-ids {ids:?}: {stderr}");
    }
    one_line_exit_2(
        &generate(&[
            "--model",
            "tiny-gqa",
            "--prompt-ids",
            "1",
            "--max-new-tokens",
            "18446744073709551615",
        ]),
        "exceed the model's context",
    );
    // A refusal that quotes a value holding a newline or a carriage return is still one line.
    one_line_exit_2(
        &generate(&[
            "--model",
            "tiny-gqa",
            "--prompt-ids",
            "1",
            "--spec-draft",
            "ngram",
            "--spec-tree",
            "chain\n:4",
        ]),
        "tree shape 'chain\\n:4'",
    );
    one_line_exit_2(
        &generate(&["--model", "tiny-gqa", "--prompt-ids", "1\r"]),
        "invalid value '1\\r'",
    );
}

#[test]
fn smollm2_with_a_few_header_bytes_changed_is_one_line_not_a_panic() {
    // Each of these panicked (exit 101) or, for the wrapped offset, generated from the wrong
    // bytes before the reader checked its arithmetic.
    let Some(m) = model() else { return };
    let original = std::fs::read(m).unwrap();
    let dir = TempDir::new("generate", "damaged-gguf");
    let name = b"token_embd.weight";
    // token_embd.weight's info: name, dimension count (4 bytes), 2 dims, type (4), offset.
    let dims = original
        .windows(name.len())
        .position(|w| w == name)
        .unwrap()
        + name.len()
        + 4;
    let offset = dims + 16 + 4;
    for (file, needle, at, value) in [
        // The first key's length: 2^64 − 8, which wrapped the reader's bounds check.
        (
            "key-length.gguf",
            "truncated: metadata key 0",
            24,
            u64::MAX - 7,
        ),
        // token_embd.weight's first dimension near 2^64.
        ("dims.gguf", "lies beyond the file", dims, u64::MAX - 31),
        // Its offset 16 bytes short of 2^64: start + offset wrapped into the header, which
        // loaded as weights.
        ("offset.gguf", "lies beyond the file", offset, u64::MAX - 15),
        // The tensor count: 2^60.
        (
            "tensors.gguf",
            "claims 1152921504606846976 tensors",
            8,
            1 << 60,
        ),
    ] {
        let mut bytes = original.clone();
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        let p = dir.join(file);
        std::fs::write(&p, bytes).unwrap();
        let out = generate(&[
            "--model",
            p.to_str().unwrap(),
            "--prompt",
            "Hi",
            "--max-new-tokens",
            "2",
        ]);
        one_line_exit_2(&out, needle);
        one_line_exit_2(&out, file);
    }
}

#[test]
fn a_prompt_smollm2_has_no_tokens_for_is_refused_not_shortened() {
    // SmolLM2's byte-level vocabulary lacks 21 of the 256 bytes (control characters such as
    // U+0004, lead bytes of characters above U+3FFFF): such a prompt lost them silently.
    let Some(m) = model() else { return };
    for (prompt, needle) in [
        ("a\u{4}b", "U+0004) at byte 1"),
        ("x \u{40000}", "U+40000) at byte 2"),
    ] {
        let out = generate(&["--model", m.to_str().unwrap(), "--prompt", prompt]);
        one_line_exit_2(&out, needle);
    }
}

fn eval_perplexity(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["eval", "perplexity"])
        .args(args)
        .output()
        .expect("the harness binary runs")
}

#[test]
fn the_kv_cache_format_from_the_cli() {
    for kv in ["int8", "fp8:per_head", "progressive:window=8,old=int8"] {
        let v = json_ok(&generate(&[
            "--model",
            "tiny-gqa",
            "--prompt-ids",
            "1,17,93,5,64,127,33,2,88,41,7",
            "--max-new-tokens",
            "12",
            "--attention",
            "paged",
            "--block-size",
            "4",
            "--kv-cache",
            kv,
            "--format",
            "json",
        ]));
        assert_eq!(v["kv_cache"], kv);
        assert_eq!(v["generated_ids"].as_array().unwrap().len(), 12, "{kv}");
    }
    let bad = |flag: &str, value: &str, extra: &[&str]| {
        let mut a = vec!["--model", "tiny-gqa", "--prompt-ids", "1,2,3", flag, value];
        a.extend_from_slice(extra);
        generate(&a)
    };
    one_line_exit_2(&bad("--kv-cache", "int9", &[]), "int9");
    one_line_exit_2(
        &bad("--kv-cache", "progressive:window=0,old=int8", &[]),
        "window",
    );
    one_line_exit_2(&bad("--kv-cache", "progressive:window=8", &[]), "old=");
    one_line_exit_2(
        &bad("--kv-cache", "int8", &["--spec-draft", "ngram"]),
        "--spec-draft",
    );
    one_line_exit_2(
        &eval_perplexity(&["--model", "tiny-gqa", "--text", "gpl3", "--kv-cache", "fp9"]),
        "fp9",
    );
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let tmp = TempDir::new("generate", "kv_cache_eval");
    let logits = tmp.join("f32.logits");
    let eval = |kv: &str, logits_flag: &str| {
        let out = eval_perplexity(&[
            "--model",
            m,
            "--text",
            "gpl3",
            "--ctx",
            "64",
            "--chunks",
            "2",
            "--kv-cache",
            kv,
            logits_flag,
            logits.to_str().unwrap(),
            "--format",
            "json",
        ]);
        json_ok(&out)
    };
    let reference = eval("f32", "--save-logits");
    let narrow = eval("int8", "--reference-logits");
    assert_eq!(narrow["kv_cache"], "int8");
    let (p32, p8) = (
        reference["ppl"].as_f64().unwrap(),
        narrow["ppl"].as_f64().unwrap(),
    );
    assert!(p8.is_finite() && p8 != p32, "f32 {p32}, int8 {p8}");
    // Measured on SmolLM2 Q4_1 (ctx 64, 2 chunks, 62 scored tokens) against the f32 cache:
    // f16 KL 0.0068, top-1 0.97; int8 KL 0.027, top-1 0.90. Bounds at ~3× the KL and a few
    // more top-1 flips, each below the next coarser format's measured value: an int8 cache
    // fails the f16 bound.
    let kl = narrow["kl_mean"].as_f64().unwrap();
    let top1 = narrow["top1_agreement"].as_f64().unwrap();
    assert!(kl > 0.0 && kl < 0.08, "int8 KL {kl}");
    assert!((0.8..=1.0).contains(&top1), "int8 top-1 {top1}");
    let half = eval("f16", "--reference-logits");
    let kl16 = half["kl_mean"].as_f64().unwrap();
    assert!(
        kl16 > 0.0 && kl16 < 0.02 && kl16 < kl,
        "f16 KL {kl16}, int8 {kl}"
    );
    assert!(half["top1_agreement"].as_f64().unwrap() >= 0.9, "{half}");
    one_line_exit_2(
        &eval_perplexity(&["--model", m, "--text", "gpl3", "--kv-cache", "progressive"]),
        "window",
    );
}
