//! The narrow and progressive KV cache: the E4M3 codec byte for byte (every byte's round trip,
//! ml_dtypes' conversions, the nearest-value rule, saturation), the int8 codec's bounds, the
//! scale edge cases (an all-zero block, NaN, a block whose scale grows), paged decode over a
//! cache in every format — uniform and progressive (mixed blocks) — against the f64 reference
//! of the cache as stored at every ISA tier this machine has, with the edge cases of the
//! float pool's tests (block size 1, kv_len 1, lengths off the block size, poisoned spare
//! blocks), and the measured storage error of each format against the f32 values.

use kernel_common::{tolerance, DType, ErrorStats};
use kernel_paged::codec::{e4m3_from_f32, e4m3_to_f32, Code, E4M3_VALUES};
use kernel_paged::{
    paged_decode_cache, BlockFormat, CacheCase, CacheCaseSpec, KvCache, KvCacheFormat, PagedBatch,
    PoolLayout, SplitKv,
};
use proptest::prelude::*;

const UNIFORM: [&str; 7] = [
    "f32",
    "f16",
    "bf16",
    "fp8",
    "int8",
    "fp8:per_head",
    "int8:per_head",
];

fn fmt(text: &str) -> KvCacheFormat {
    KvCacheFormat::parse(text).unwrap()
}

#[allow(clippy::too_many_arguments)]
fn case(
    lens: &[usize],
    bs: usize,
    kv_heads: usize,
    group: usize,
    head_dim: usize,
    q_len: usize,
    format: KvCacheFormat,
    spare: usize,
    seed: u64,
) -> CacheCase {
    CacheCaseSpec {
        context_lens: lens.to_vec(),
        block_size: bs,
        kv_heads,
        group,
        head_dim,
        q_len,
        format,
        spare_blocks: spare,
        outlier: 8.0,
        seed,
    }
    .build()
    .unwrap()
}

/// Decode against the reference of the cache as stored, at every runnable tier; the output
/// must be finite (poisoned spare blocks and unwritten slots never leak).
fn assert_matches_reference(c: &CacheCase, split: SplitKv) -> Result<(), TestCaseError> {
    let want = c.reference().unwrap();
    let tol = tolerance(DType::F32).scaled_to(&want);
    for isa in kernel_cpu::isa::runnable() {
        let got = kernel_cpu::isa::with_isa(isa, || c.decode(split).unwrap()).unwrap();
        let stats = ErrorStats::compare(&got, &want);
        prop_assert!(
            stats.passes(&tol) && got.iter().all(|x| x.is_finite()),
            "{} {split:?} isa {isa}: {stats:?}",
            c.label()
        );
    }
    Ok(())
}

#[test]
fn every_e4m3_byte_round_trips() {
    for b in 0..=255u8 {
        let x = e4m3_to_f32(b);
        if b & 0x7F == 0x7F {
            assert!(x.is_nan(), "{b:#04x}");
            assert_eq!(e4m3_from_f32(x), b, "NaN keeps its sign");
        } else {
            assert_eq!(e4m3_from_f32(x), b, "{b:#04x} = {x}");
            assert_eq!(x.to_bits() >> 31, (b >> 7) as u32, "sign of {b:#04x}");
        }
    }
}

#[test]
fn e4m3_matches_ml_dtypes() {
    // kernels/paged/tests/data/make_e4m3.py: ml_dtypes' float8_e4m3fn of clip(x, ±448).
    let text = include_str!("data/e4m3_ml_dtypes.txt");
    let mut n = 0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (x, b) = line.split_once(' ').unwrap();
        let x = f32::from_bits(u32::from_str_radix(x, 16).unwrap());
        let b = u8::from_str_radix(b, 16).unwrap();
        assert_eq!(e4m3_from_f32(x), b, "{x:e} ({:08x})", x.to_bits());
        n += 1;
    }
    assert!(n > 1900, "{n} vectors");
}

#[test]
fn e4m3_saturates() {
    for (x, b) in [
        (448.0f32, 0x7E),
        (449.0, 0x7E),
        (464.0, 0x7E),
        (465.0, 0x7E),
        (1e30, 0x7E),
        (f32::INFINITY, 0x7E),
        (-500.0, 0xFE),
        (f32::NEG_INFINITY, 0xFE),
        (f32::MIN_POSITIVE, 0x00),
        (2f32.powi(-10), 0x00), // half the smallest subnormal: a tie, to even (zero)
        (3.0 * 2f32.powi(-10), 0x02), // 1.5 subnormal steps: a tie, to even (2)
    ] {
        assert_eq!(e4m3_from_f32(x), b, "{x:e}");
    }
    assert!(e4m3_to_f32(e4m3_from_f32(f32::NAN)).is_nan());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn e4m3_is_the_nearest_value_ties_to_even(x in -470.0f32..470.0) {
        // Every finite value, searched: the nearest to clamp(x), ties to the even code.
        let t = x.clamp(-448.0, 448.0) as f64;
        let best = (0..=255u8)
            .filter(|b| b & 0x7F != 0x7F)
            .min_by(|&a, &b| {
                let (da, db) = ((E4M3_VALUES[a as usize] as f64 - t).abs(), (E4M3_VALUES[b as usize] as f64 - t).abs());
                da.total_cmp(&db).then((a & 1).cmp(&(b & 1)))
            })
            .unwrap();
        let got = e4m3_from_f32(x);
        prop_assert_eq!(e4m3_to_f32(got), E4M3_VALUES[best as usize], "{} -> {:#04x}, nearest {:#04x}", x, got, best);
    }

    #[test]
    fn int8_codes_are_within_half_a_step(x in -1000.0f32..1000.0, absmax in 0.01f32..2000.0) {
        let s = Code::Int8.scale_for(absmax);
        let y = Code::Int8.decode(Code::Int8.encode(x, s), s);
        if x.abs() <= absmax {
            prop_assert!((x - y).abs() <= 0.5 * s * (1.0 + 1e-5), "{x} -> {y} (scale {s})");
        } else {
            prop_assert_eq!(y, x.signum() * 127.0 * s);
        }
    }
}

fn formats() -> impl Strategy<Value = KvCacheFormat> {
    let uniform = prop::sample::select(UNIFORM.to_vec()).prop_map(fmt);
    let progressive = (
        1usize..200,
        prop::sample::select(vec!["int8", "fp8", "int8:per_head", "fp8:per_head", "bf16"]),
        prop::sample::select(vec!["f16", "f32", "bf16"]),
    )
        .prop_map(|(w, old, recent)| {
            fmt(&format!("progressive:window={w},old={old},recent={recent}"))
        });
    prop_oneof![uniform, progressive]
}

fn splits() -> impl Strategy<Value = SplitKv> {
    prop_oneof![
        Just(SplitKv::Off),
        Just(SplitKv::Auto),
        Just(SplitKv::Context),
        (1usize..300).prop_map(SplitKv::Tokens)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn cache_decode_equals_reference(lens in prop::collection::vec(1usize..600, 1..4),
                                     bs in prop_oneof![Just(1usize), Just(16), 1usize..=64],
                                     kv_log in 0usize..3, group in 1usize..5,
                                     head_dim in prop_oneof![Just(64usize), Just(128), 1usize..100],
                                     q_len in 1usize..4, format in formats(), split in splits(),
                                     spare in 0usize..4, seed in any::<u64>()) {
        let q_len = q_len.min(*lens.iter().min().unwrap());
        let c = case(&lens, bs, 1 << kv_log, group, head_dim, q_len, format, spare, seed);
        assert_matches_reference(&c, split)?;
    }

    #[test]
    fn windowed_cache_decode_equals_reference(lens in prop::collection::vec(1usize..600, 1..4),
                                              bs in prop_oneof![Just(1usize), Just(16), 1usize..=64],
                                              kv_log in 0usize..3, group in 1usize..5, q_len in 1usize..=16,
                                              w in prop_oneof![Just(1usize), Just(2), 1usize..700],
                                              cap in prop::option::of(0.3f32..60.0), format in formats(),
                                              split in splits(), seed in any::<u64>()) {
        // Sliding windows and soft-capping over every format, uniform and progressive.
        let q_len = q_len.min(*lens.iter().min().unwrap());
        let mut c = case(&lens, bs, 1 << kv_log, group, 64, q_len, format, 2, seed);
        c.shape = c.shape.with_window(Some(w)).with_softcap(cap);
        assert_matches_reference(&c, split)?;
    }

    #[test]
    fn cache_batch_invariance(lens in prop::collection::vec(1usize..400, 2..4), format in formats(),
                              split in splits(), seed in any::<u64>()) {
        let c = case(&lens, 16, 2, 2, 64, 1, format, 0, seed);
        let alone = CacheCase {
            batch: PagedBatch { context_lens: vec![lens[0]], block_tables: vec![c.batch.block_tables[0].clone()] },
            q: c.q[..c.shape.q_elems(1)].to_vec(),
            ..c.clone()
        };
        let batched = c.decode(split).unwrap();
        let single = alone.decode(split).unwrap();
        prop_assert_eq!(&single[..], &batched[..single.len()]);
    }
}

#[test]
fn cache_edge_cases_match_reference() {
    // Block size 1, kv_len 1, odd lengths, kv_heads 1 and = q_heads, every split, every
    // format, poisoned spare blocks.
    let mut formats: Vec<KvCacheFormat> = UNIFORM.iter().map(|t| fmt(t)).collect();
    formats.push(fmt("progressive:window=40,old=int8"));
    formats.push(fmt("progressive:window=1,old=fp8,recent=bf16"));
    for (i, (lens, bs, kv_heads, group)) in [
        (vec![54, 97, 577], 1, 1, 8),
        (vec![54, 97, 577], 16, 4, 1),
        (vec![1, 2, 3], 256, 2, 2),
        (vec![1], 1, 1, 1),
        (vec![577], 7, 2, 4),
    ]
    .into_iter()
    .enumerate()
    {
        for &format in &formats {
            for split in [SplitKv::Off, SplitKv::Auto, SplitKv::Tokens(50)] {
                let q_len = (1 + i % 3).min(lens[0]);
                let c = case(&lens, bs, kv_heads, group, 128, q_len, format, 3, i as u64);
                assert_matches_reference(&c, split).unwrap();
            }
        }
    }
}

#[test]
fn progressive_blocks_age_past_the_window() {
    let (bs, window) = (16, 100);
    let c = case(
        &[500, 90],
        bs,
        2,
        2,
        64,
        1,
        fmt(&format!("progressive:window={window},old=int8")),
        2,
        3,
    );
    let int8 = BlockFormat::parse("int8").unwrap();
    let f16 = BlockFormat::parse("f16").unwrap();
    for (&len, table) in c.batch.context_lens.iter().zip(&c.batch.block_tables) {
        let aged = len.saturating_sub(window) / bs;
        for (i, &b) in table.iter().enumerate() {
            let want = if i < aged { int8 } else { f16 };
            assert_eq!(
                c.cache.block_format(b),
                Some(want),
                "block {i} of a {len}-token sequence"
            );
        }
    }
    // The memory held: 25 int8 blocks (500 - 100 = 400 tokens), and as many f16 slots as
    // were in use at once — the first write's 16 blocks (250 tokens, aged only after the
    // write); the slots ageing freed were reused by later blocks and by sequence 1.
    let l = c.cache.layout();
    let elems = l.block_elems();
    let old = 25 * (2 * elems + 2 * 4 * l.kv_heads);
    assert_eq!(c.cache.bytes(), old + 16 * 2 * elems * 2);
    assert_eq!(
        c.cache.bytes_read(&c.batch.block_tables[0], 500),
        2 * l.kv_heads * (400 * 64 + 25 * 4 + 100 * 64 * 2)
    );
}

#[test]
fn storage_error_of_each_format() {
    // Measured against the f32 values written (no outliers: one Gaussian scale), with the
    // bound each format's rounding allows: f16 2^-11 and bf16 2^-8 relative per element, E4M3
    // 2^-4 (3 mantissa bits) but coarser near zero under a per-block scale, int8 half a step
    // of absmax/127.
    for (text, bound) in [
        ("f32", 0.0),
        ("f16", 3e-4),
        ("bf16", 3e-3),
        ("fp8", 0.04),
        ("fp8:per_head", 0.04),
        ("int8", 0.015),
        ("int8:per_head", 0.015),
        ("progressive:window=64,old=int8", 0.015),
    ] {
        let c = CacheCaseSpec {
            outlier: 1.0,
            ..spec(&[300, 200], fmt(text))
        }
        .build()
        .unwrap();
        let e = c.storage_error().unwrap();
        assert!(e.non_finite == 0 && e.rel_l2 <= bound, "{text}: {e:?}");
        if text != "f32" {
            assert!(
                e.rel_l2 > bound / 20.0,
                "{text}: an error this small is not a {text} cache: {e:?}"
            );
        }
    }
}

fn spec(lens: &[usize], format: KvCacheFormat) -> CacheCaseSpec {
    CacheCaseSpec {
        context_lens: lens.to_vec(),
        block_size: 16,
        kv_heads: 2,
        group: 4,
        head_dim: 64,
        q_len: 1,
        format,
        spare_blocks: 1,
        outlier: 8.0,
        seed: 11,
    }
}

#[test]
fn an_all_zero_block_and_a_growing_scale() {
    for text in ["fp8", "int8", "fp8:per_head", "int8:per_head"] {
        let layout = PoolLayout {
            num_blocks: 3,
            block_size: 4,
            kv_heads: 1,
            head_dim: 8,
        };
        let mut c = KvCache::new(layout, fmt(text)).unwrap();
        let table = [2, 0];
        let zeros = vec![0.0f32; 8];
        c.write(&table, &[0], &zeros, &zeros).unwrap();
        let (k, v) = c.gather(&table, 1).unwrap();
        assert!(k.iter().chain(&v).all(|&x| x == 0.0), "{text}: {k:?}");
        // A small token, then ones 100x larger in the same block: a per-block scale grows and
        // the first token is re-rounded, staying within a step of the new scale (absmax
        // 3.5); a per-head scale was set by the small token and saturates the large ones.
        let small: Vec<f32> = (0..8).map(|i| 0.01 * (i as f32 - 3.5)).collect();
        let big: Vec<f32> = small.iter().map(|x| 100.0 * x).collect();
        c.write(&table, &[1], &small, &small).unwrap();
        c.write(
            &table,
            &[2, 3, 4],
            &[big.clone(), big.clone(), big.clone()].concat(),
            &[big.clone(), big.clone(), big].concat(),
        )
        .unwrap();
        let (k, _) = c.gather(&table, 5).unwrap();
        let step = 3.5
            / if text.starts_with("int8") {
                127.0
            } else {
                448.0
            };
        for (i, &x) in small.iter().enumerate() {
            assert!((k[8 + i] - x).abs() <= step, "{text}: {} vs {x}", k[8 + i]);
        }
        assert!(k.iter().all(|x| x.is_finite()));
        let top = k[16..40].iter().fold(0.0f32, |m, x| m.max(x.abs()));
        if text.ends_with("per_head") {
            assert!(
                (top - 0.035).abs() < 1e-6,
                "{text}: saturates at the first scale, {top}"
            );
        } else {
            assert!((top - 3.5).abs() < 1e-5, "{text}: {top}");
        }
        // A NaN written poisons what shares its scale, never silently.
        c.write(&table, &[4], &[f32::NAN; 8], &zeros).unwrap();
        let (k, _) = c.gather(&table, 5).unwrap();
        assert!(k[32..].iter().all(|x| x.is_nan()), "{text}");
    }
}

#[test]
fn copy_block_keeps_the_stored_values() {
    for text in UNIFORM
        .iter()
        .copied()
        .chain(["progressive:window=8,old=fp8"])
    {
        let c = case(&[40], 8, 2, 1, 16, 1, fmt(text), 2, 9);
        let mut cache = c.cache.clone();
        let table = c.batch.block_tables[0].clone();
        let spare: Vec<u32> = (0..cache.layout().num_blocks as u32)
            .filter(|b| !table.contains(b))
            .collect();
        // Copy the first (aged) and the last (recent) block to the spares.
        let copied = vec![spare[0], table[1], table[2], table[3], spare[1]];
        cache.copy_block(table[0], spare[0]).unwrap();
        cache.copy_block(table[4], spare[1]).unwrap();
        assert_eq!(
            cache.gather(&copied, 40).unwrap(),
            c.cache.gather(&table, 40).unwrap(),
            "{text}"
        );
        assert_eq!(cache.block_format(spare[0]), c.cache.block_format(table[0]));
    }
}

#[test]
fn bad_cache_input_is_an_error_not_a_panic() {
    let c = case(
        &[10],
        4,
        2,
        2,
        16,
        1,
        fmt("progressive:window=4,old=int8"),
        3,
        1,
    );
    let mut out = vec![f32::NAN; c.q.len()];
    let unwritten: Vec<u32> = (0..c.cache.layout().num_blocks as u32)
        .filter(|b| !c.batch.block_tables[0].contains(b))
        .take(3)
        .collect();
    let bad = PagedBatch {
        context_lens: vec![10],
        block_tables: vec![unwritten],
    };
    let err =
        paged_decode_cache(&c.shape, &bad, &c.cache, &c.q, &mut out, SplitKv::Off).unwrap_err();
    assert!(err.to_string().contains("never written"), "{err}");
    let mut short = vec![0.0; 3];
    assert!(
        paged_decode_cache(&c.shape, &c.batch, &c.cache, &c.q, &mut short, SplitKv::Off).is_err()
    );
    let mut cache = c.cache.clone();
    assert!(cache
        .write(&c.batch.block_tables[0], &[3], &[0.0; 5], &[0.0; 5])
        .is_err());
    assert!(cache
        .write(&c.batch.block_tables[0], &[40], &[0.0; 32], &[0.0; 32])
        .is_err());
    assert!(cache.copy_block(99, 0).is_err());
}
