//! Property tests: every attention variant equals the f64 reference on random shapes, tile
//! sizes and dtypes, with outputs poisoned first; GQA equals MHA on K/V heads repeated per
//! group, bit for bit;
//! a batch row's result does not depend on its neighbours. Every check runs at each ISA tier
//! this machine has (avx512, avx2, portable).

use attention_kernels::reference::attention;
use attention_kernels::{kernel_from_spec, AttentionInputs, AttentionKernel, AttentionShape};
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

fn dtypes() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn flash2_equals_reference(shape in shapes(), br in 1usize..40, bc in 1usize..40, faer in any::<bool>(), dtype in dtypes(), seed in any::<u64>()) {
        let gemm = if faer { "faer" } else { "mm" };
        check(&format!("flash2:br={br},bc={bc},gemm={gemm}"), &shape, dtype, seed)?;
    }

    #[test]
    fn naive_equals_reference(shape in shapes(), dtype in dtypes(), seed in any::<u64>()) {
        check("naive", &shape, dtype, seed)?;
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
        let shape = AttentionShape { batch: 3, ..shape };
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
    let cases = [
        AttentionShape::new(1, 1, 1, 1, 1, 1, true),
        AttentionShape::new(2, 4, 1, 1, 577, 64, true),
        AttentionShape::new(1, 6, 2, 54, 97, 128, true),
        AttentionShape::new(1, 2, 2, 97, 97, 64, true),
        AttentionShape::new(1, 3, 3, 577, 577, 128, false),
        AttentionShape::new(1, 4, 2, 33, 200, 80, false),
    ];
    for (i, shape) in cases.iter().enumerate() {
        for dtype in DType::ALL {
            for spec in ["naive", "flash2", "flash2:br=16,bc=16", "reference"] {
                check(spec, shape, dtype, i as u64).unwrap();
            }
        }
    }
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
