//! Property tests: every attention variant equals the f64 reference on random shapes, tile
//! sizes and dtypes, with sliding windows smaller than, equal to and larger than the tiles
//! and the context, soft-capping on and off, outputs poisoned first; GQA equals MHA on K/V
//! heads repeated per group, bit for bit; a batch row's result does not depend on its
//! neighbours; keys outside every window are never read (NaN there does not leak) and
//! flash2's key tiles fall with the window. Every check runs at each ISA tier this machine
//! has (avx512, avx2, portable).

use kernel_attention::reference::attention;
use kernel_attention::{kernel_from_spec, AttentionInputs, AttentionKernel, AttentionShape};
use kernel_common::{tolerance, Buffer, DType, ErrorStats, VariantSpec};
use proptest::prelude::*;

fn kernel(spec: &str) -> Box<dyn AttentionKernel> {
    kernel_from_spec(&VariantSpec::parse(spec).unwrap())
        .unwrap()
        .unwrap()
}

fn run(kernel: &dyn AttentionKernel, shape: &AttentionShape, inputs: &AttentionInputs) -> Vec<f32> {
    let mut out = Buffer::poisoned(inputs.dtype(), shape.q_elems());
    kernel
        .prepare(shape, inputs)
        .unwrap()
        .run(&mut out)
        .unwrap();
    out.to_f32()
}

/// The variant against the f64 reference at every ISA tier this machine runs (the others are
/// named on stderr by `isa::runnable`).
fn check(spec: &str, shape: &AttentionShape, dtype: DType, seed: u64) -> Result<(), TestCaseError> {
    let inputs = AttentionInputs::random(shape, dtype, seed);
    let want = attention(shape, &inputs);
    for isa in kernel_cpu::isa::runnable() {
        let got = kernel_cpu::isa::with_isa(isa, || run(kernel(spec).as_ref(), shape, &inputs))
            .expect("a runnable tier");
        let stats = ErrorStats::compare(&got, &want);
        prop_assert!(
            stats.passes(&tolerance(dtype)),
            "{spec} {dtype} isa {isa} {}: {stats:?}",
            shape.label()
        );
    }
    Ok(())
}

fn shapes() -> impl Strategy<Value = AttentionShape> {
    (
        1usize..3,
        0usize..3,
        1usize..4,
        1usize..80,
        0usize..80,
        1usize..70,
        any::<bool>(),
    )
        .prop_map(
            |(batch, kv_heads_log, group, q_len, extra, head_dim, causal)| {
                let kv_heads = 1 << kv_heads_log;
                AttentionShape::new(
                    batch,
                    kv_heads * group,
                    kv_heads,
                    q_len,
                    q_len + extra,
                    head_dim,
                    causal,
                )
            },
        )
}

/// A window for `shape` (causal only; `tile` is the variant's key tile): none, 1, 2, tile − 1,
/// tile, kv_len − 1, kv_len or kv_len + 5, by `pick`.
fn window(shape: &AttentionShape, tile: usize, pick: usize) -> Option<usize> {
    if !shape.causal {
        return None;
    }
    let lk = shape.kv_len;
    [
        None,
        Some(1),
        Some(2),
        Some(tile.max(2) - 1),
        Some(tile),
        Some(lk.max(2) - 1),
        Some(lk),
        Some(lk + 5),
    ][pick % 8]
}

/// No cap, or one from tight (most scores saturate) to Gemma-2's 50.
fn softcaps() -> impl Strategy<Value = Option<f32>> {
    prop_oneof![
        Just(None),
        Just(Some(50.0f32)),
        (0.3f32..8.0).prop_map(Some)
    ]
}

/// Keys and values NaN at every position no query row sees (before the first row's window).
fn poison_outside_windows(shape: &AttentionShape, inputs: &mut AttentionInputs) {
    let first = shape.visible_keys(0).start;
    let d = shape.head_dim;
    for buf in [&mut inputs.k, &mut inputs.v] {
        let mut x = buf.to_f32();
        for head in x.chunks_mut(shape.kv_len * d) {
            head[..first * d].fill(f32::NAN);
        }
        *buf = Buffer::from_f32(buf.dtype(), &x);
    }
}

fn dtypes() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn flash2_equals_reference(shape in shapes(), br in 1usize..40, bc in 1usize..40, faer in any::<bool>(), pick in 0usize..8, cap in softcaps(), dtype in dtypes(), seed in any::<u64>()) {
        let gemm = if faer { "faer" } else { "mm" };
        let shape = shape.with_window(window(&shape, bc, pick)).with_softcap(cap);
        check(&format!("flash2:br={br},bc={bc},gemm={gemm}"), &shape, dtype, seed)?;
    }

    #[test]
    fn naive_equals_reference(shape in shapes(), pick in 0usize..8, cap in softcaps(), dtype in dtypes(), seed in any::<u64>()) {
        let shape = shape.with_window(window(&shape, 16, pick)).with_softcap(cap);
        check("naive", &shape, dtype, seed)?;
    }

    #[test]
    fn keys_outside_every_window_are_never_read(shape in shapes(), br in 1usize..40, bc in 1usize..40, w in 1usize..40, cap in softcaps(), seed in any::<u64>()) {
        // NaN in K and V before the first row's window: flash2 skips those keys (a masked
        // key in a visited tile would leak NaN through 0·NaN in P·V), and every row is
        // still the reference's.
        let shape = AttentionShape { causal: true, kv_len: shape.kv_len.max(shape.q_len), ..shape }
            .with_window(Some(w))
            .with_softcap(cap);
        let mut inputs = AttentionInputs::random(&shape, DType::F32, seed);
        let want = attention(&shape, &inputs);
        poison_outside_windows(&shape, &mut inputs);
        for isa in kernel_cpu::isa::runnable() {
            let spec = format!("flash2:br={br},bc={bc}");
            let got = kernel_cpu::isa::with_isa(isa, || run(kernel(&spec).as_ref(), &shape, &inputs))
                .expect("a runnable tier");
            let stats = ErrorStats::compare(&got, &want);
            prop_assert!(stats.passes(&tolerance(DType::F32)), "{spec} isa {isa} {}: {stats:?}", shape.label());
        }
    }

    #[test]
    fn gqa_equals_mha_on_repeated_kv_heads(shape in shapes(), group in 2usize..5, dtype in dtypes(), seed in any::<u64>()) {
        // A GQA problem (each KV head serving `group` query heads, read by index) against
        // the MHA problem whose K/V repeat each head `group` times (PyTorch's
        // repeat_interleave / enable_gqa): the same arithmetic per query head, so the two
        // code paths must agree bit for bit, and the GQA path must match the reference.
        let gqa = AttentionShape { q_heads: shape.kv_heads * group, ..shape };
        let mha = AttentionShape { kv_heads: gqa.q_heads, ..gqa };
        let inputs = AttentionInputs::random(&gqa, dtype, seed);
        let repeat = |b: &Buffer| {
            let x = b.to_f32();
            let per_head = gqa.kv_len * gqa.head_dim;
            let out: Vec<f32> = x
                .chunks(per_head)
                .flat_map(|head| std::iter::repeat_n(head, group).flatten().copied())
                .collect();
            Buffer::from_f32(dtype, &out)
        };
        let expanded = AttentionInputs { q: inputs.q.clone(), k: repeat(&inputs.k), v: repeat(&inputs.v) };
        let gqa = gqa.with_window(window(&gqa, 5, seed as usize)).with_softcap((seed % 3 == 0).then_some(2.0));
        let mha = AttentionShape { window: gqa.window, softcap: gqa.softcap, ..mha };
        let want = attention(&gqa, &inputs);
        for spec in ["naive", "flash2", "flash2:br=7,bc=5"] {
            let grouped = run(kernel(spec).as_ref(), &gqa, &inputs);
            let repeated = run(kernel(spec).as_ref(), &mha, &expanded);
            prop_assert_eq!(&grouped, &repeated, "{} {} {}", spec, dtype, gqa.label());
            prop_assert!(ErrorStats::compare(&grouped, &want).passes(&tolerance(dtype)), "{}", spec);
        }
    }

    #[test]
    fn batch_invariance(shape in shapes(), seed in any::<u64>(), other in any::<u64>()) {
        // Row 0 of a batch gives bit-identical output whatever the other rows hold.
        let shape = AttentionShape { batch: 3, ..shape }.with_window(window(&shape, 9, seed as usize));
        let one = AttentionShape { batch: 1, ..shape };
        let mut a = AttentionInputs::random(&shape, DType::F32, seed);
        let first = AttentionInputs::random(&one, DType::F32, seed ^ 1);
        let b_noise = AttentionInputs::random(&shape, DType::F32, other);
        for (dst, src, noise) in [(&mut a.q, &first.q, &b_noise.q), (&mut a.k, &first.k, &b_noise.k), (&mut a.v, &first.v, &b_noise.v)] {
            let (Buffer::F32(d), Buffer::F32(s), Buffer::F32(n)) = (dst, src, noise) else { unreachable!() };
            d[..s.len()].copy_from_slice(s);
            d[s.len()..].copy_from_slice(&n[s.len()..]);
        }
        for spec in ["naive", "flash2", "flash2:br=3,bc=9"] {
            let k = kernel(spec);
            let alone = run(k.as_ref(), &one, &first);
            let batched = run(k.as_ref(), &shape, &a);
            prop_assert_eq!(&alone[..], &batched[..alone.len()], "{}", spec);
        }
    }
}

#[test]
fn edge_cases_match_reference() {
    // The family's edge cases (`cases::edge`, what `harness check` and the conformance suite
    // run), and three more only this test needs: head_dim 1, a long non-causal prefill and
    // an odd head_dim.
    let cases = kernel_attention::cases::edge().into_iter().chain([
        AttentionShape::new(1, 1, 1, 1, 1, 1, true),
        AttentionShape::new(1, 3, 3, 577, 577, 128, false),
        AttentionShape::new(1, 4, 2, 33, 200, 80, false),
    ]);
    for (i, shape) in cases.enumerate() {
        let shape = &shape;
        for dtype in DType::ALL {
            for spec in ["naive", "flash2", "flash2:br=16,bc=16", "reference"] {
                check(spec, shape, dtype, i as u64).unwrap();
            }
        }
    }
}

#[test]
fn windowed_edge_cases_match_reference() {
    // Decode, append and prefill at lengths 54/97/577 with windows around the tiles (16 and
    // the default 128) and the context, capped and not, every dtype and variant.
    let bases = [
        AttentionShape::new(2, 4, 1, 1, 577, 64, true),
        AttentionShape::new(1, 6, 2, 54, 97, 128, true),
        AttentionShape::new(1, 2, 2, 97, 97, 64, true),
        AttentionShape::new(1, 3, 3, 300, 577, 32, true),
    ];
    for (i, base) in bases.iter().enumerate() {
        let lk = base.kv_len;
        for (j, w) in [1, 2, 15, 16, 127, 128, lk - 1, lk, lk + 5]
            .into_iter()
            .enumerate()
        {
            let cap = [None, Some(50.0), Some(1.5)][(i + j) % 3];
            let shape = base.with_window(Some(w)).with_softcap(cap);
            let dtype = DType::ALL[(i + j) % 3];
            for spec in ["naive", "flash2", "flash2:br=16,bc=16", "flash2:br=5,bc=7"] {
                check(spec, &shape, dtype, (i * 16 + j) as u64).unwrap();
            }
        }
    }
}

#[test]
fn flash2_key_tiles_fall_with_the_window() {
    // Prefill of 4096 in 128 × 128 tiles: without a window query tile t visits t + 1 key
    // tiles (the causal triangle, 528 in all); with a window of 512, every tile past the
    // first few visits ⌈(512 + 127) / 128⌉ = 5.
    let f = kernel_attention::cpu::flash2::Flash2::new(
        128,
        128,
        kernel_attention::cpu::flash2::DEFAULT_GEMM,
    )
    .unwrap();
    let shape = AttentionShape::new(1, 1, 1, 4096, 4096, 64, true);
    assert_eq!(f.kv_tiles_per_head(&shape), (1..=32).sum::<usize>());
    let windowed = shape.with_window(Some(512));
    let per_tile: Vec<usize> = (0..32)
        .map(|t| {
            let one = AttentionShape {
                q_len: 128,
                kv_len: 128 * (t + 1),
                ..windowed
            };
            f.kv_tiles_per_head(&one)
        })
        .collect();
    assert_eq!(&per_tile[..5], &[1, 2, 3, 4, 5]);
    assert!(per_tile[4..].iter().all(|&n| n == 5), "{per_tile:?}");
    assert_eq!(f.kv_tiles_per_head(&windowed), 1 + 2 + 3 + 4 + 28 * 5);
    // Decode: one query row, ⌈512 / 128⌉ = 4 key tiles instead of 32.
    let decode = AttentionShape::new(1, 1, 1, 1, 4096, 64, true);
    assert_eq!(f.kv_tiles_per_head(&decode), 32);
    assert_eq!(f.kv_tiles_per_head(&decode.with_window(Some(512))), 4);
    // A window of 1 in decode reads one key.
    let one_key = kernel_attention::cpu::flash2::Flash2::new(
        128,
        1,
        kernel_attention::cpu::flash2::DEFAULT_GEMM,
    )
    .unwrap();
    assert_eq!(one_key.kv_tiles_per_head(&decode.with_window(Some(1))), 1);
}

#[test]
fn bad_tiles_and_parameters_are_refused() {
    for bad in [
        "flash2:br=0",
        "flash2:bc=5000",
        "flash2:tile=3",
        "naive:x=1",
    ] {
        assert!(
            kernel_from_spec(&VariantSpec::parse(bad).unwrap()).is_err(),
            "{bad}"
        );
    }
    assert!(kernel_from_spec(&VariantSpec::parse("nosuch").unwrap())
        .unwrap()
        .is_none());
}
