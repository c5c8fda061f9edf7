//! The pipeline with a narrow KV cache (`LoadOptions::kv_cache`) on the random presets: every
//! attention reads the cache as stored — the prompt's contiguous attention (gathered,
//! dequantised) and paged decode agree on each format, so the narrow values reach every
//! token; a narrow cache changes the logits a little, never to NaN; a progressive cache ages
//! a session's blocks past its window; speculative decoding's position moves refuse a narrow
//! cache in one line.

use kernel_paged::{BlockFormat, KvCacheFormat};
use models::{load, LoadOptions, Session};

const FORMATS: [&str; 7] = [
    "f16",
    "bf16",
    "fp8",
    "int8",
    "int8:per_head",
    "progressive:window=16,old=int8",
    "progressive:window=8,old=fp8,recent=bf16",
];

fn model(name: &str, attention: &str, kv: &str) -> models::Llama {
    load(
        name,
        &LoadOptions {
            attention: attention.into(),
            kv_cache: KvCacheFormat::parse(kv).unwrap(),
            ..LoadOptions::default()
        },
    )
    .unwrap()
    .model
}

/// Logits of a 37-token prompt (all positions) then of 6 decode steps, blocks of 8.
fn run(m: &models::Llama) -> Vec<f32> {
    let prompt: Vec<u32> = (0..37).map(|i| (i * 53 + 7) % 500).collect();
    let mut s = Session::new(m, 64, 8).unwrap();
    let mut all = s.forward_all(&prompt).unwrap();
    for t in 0..6u32 {
        all.extend(s.forward(&[(t * 91 + 3) % 500]).unwrap());
    }
    all
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// How far (rel. L2 of the logits) a cache format may take tiny-gqa / tiny-mqa from the f32
/// cache: about 3× the largest measured on the two presets (f16 2.0e-4, bf16 1.7e-3, int8
/// and its variants 6.0–7.7e-3, fp8 and fp8-old progressive 2.4–2.8e-2), so each format's
/// bound is one the next coarser format cannot meet.
fn bound_from_f32_cache(kv: &str) -> f64 {
    match kv {
        "f16" => 6e-4,
        "bf16" => 5e-3,
        k if k.contains("fp8") => 7e-2,
        k if k.contains("int8") => 2e-2,
        other => panic!("no bound for {other}"),
    }
}

#[test]
fn every_attention_reads_the_cache_as_stored() {
    for preset in ["tiny-gqa", "tiny-mqa"] {
        let reference = run(&model(preset, "flash2", "f32"));
        for kv in FORMATS {
            let paged = run(&model(preset, "paged", kv));
            let contiguous = run(&model(preset, "flash2", kv));
            assert!(paged.iter().all(|x| x.is_finite()), "{preset} {kv}");
            let between = rel_l2(&paged, &contiguous);
            // Measured ≤ 1.7e-6 (summation order only): 6× margin.
            assert!(
                between < 1e-5,
                "{preset} {kv}: paged decode and the gathered cache differ by {between}"
            );
            let off = rel_l2(&paged, &reference);
            let bound = bound_from_f32_cache(kv);
            assert!(
                off > 0.0 && off < bound,
                "{preset} {kv}: {off} from the f32 cache (bound {bound})"
            );
        }
    }
}

#[test]
fn a_progressive_cache_ages_a_sessions_blocks() {
    let m = model("tiny-gqa", "paged", "progressive:window=16,old=int8");
    let mut s = Session::new(&m, 64, 8).unwrap();
    let prompt: Vec<u32> = (0..30).collect();
    s.forward_all(&prompt).unwrap();
    for t in 0..10 {
        s.forward(&[t]).unwrap();
    }
    // 40 tokens: the 24 before the last 16 are three aged blocks; the two after, f16.
    let (int8, f16) = (
        BlockFormat::parse("int8").unwrap(),
        BlockFormat::parse("f16").unwrap(),
    );
    for cache in &s.kv.layers {
        let formats: Vec<_> = (0..5).map(|b| cache.block_format(b)).collect();
        assert_eq!(
            formats,
            [int8, int8, int8, f16, f16].map(Some).to_vec(),
            "blocks of a 40-token session"
        );
    }
    let f32_bytes = 4.0 * 2.0 * 2.0 * 32.0 * 4.0;
    let bytes = s.kv.bytes_per_token(40);
    assert!(bytes < 0.5 * f32_bytes, "{bytes} of {f32_bytes}");
}

#[test]
fn speculative_moves_refuse_a_narrow_cache() {
    let m = model("tiny-gqa", "paged", "int8");
    let mut s = Session::new(&m, 32, 8).unwrap();
    s.forward_all(&[1, 2, 3]).unwrap();
    let err =
        s.kv.move_position(&[0, 1, 2, 3], 2, 1)
            .unwrap_err()
            .to_string();
    assert!(
        err.contains("f32 KV cache") && err.contains("int8"),
        "{err}"
    );
    assert!(!err.contains('\n'));
}
