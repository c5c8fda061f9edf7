//! Property tests for the paged family: paged decode equals the f64 reference and the
//! contiguous flash2 kernel for any block size and any permutation of physical blocks, with
//! sequences of different lengths in one batch; split-KV equals unsplit; a sequence's output
//! does not depend on its batch neighbours; NaN in unused pool slots never leaks. With sliding
//! windows (1, 2, block size − 1, block size, context − 1, context, context + 5) and logit
//! soft-capping on and off, under every split policy, for decode and multi-token queries,
//! with NaN in every pool slot before the window (those blocks are skipped, never read).
//! Checks against the reference run at each ISA tier this machine has.

use kernel_attention::{kernel_from_spec as attention_kernel, AttentionInputs, AttentionShape};
use kernel_common::{tolerance, Buffer, DType, ErrorStats, VariantSpec};
use kernel_paged::{
    append, paged_decode, KvPool, PagedBatch, PagedCase, PagedCaseSpec, PagedDecodeShape,
    PoolLayout, SplitKv,
};
use proptest::prelude::*;

#[allow(clippy::too_many_arguments)]
fn case(
    lens: &[usize],
    block_size: usize,
    kv_heads: usize,
    group: usize,
    head_dim: usize,
    q_len: usize,
    dtype: DType,
    spare: usize,
    seed: u64,
) -> PagedCase {
    PagedCaseSpec {
        context_lens: lens.to_vec(),
        block_size,
        kv_heads,
        group,
        head_dim,
        q_len,
        dtype,
        spare_blocks: spare,
        seed,
    }
    .build()
    .unwrap()
}

fn decode(c: &PagedCase, split: SplitKv) -> Vec<f32> {
    c.decode(split).unwrap()
}

/// Paged decode against the f64 reference at every ISA tier this machine runs (the others are
/// named on stderr by `isa::runnable`).
fn assert_matches_reference(c: &PagedCase, split: SplitKv) -> Result<(), TestCaseError> {
    let want = c.reference().unwrap();
    for isa in kernel_cpu::isa::runnable() {
        let got = kernel_cpu::isa::with_isa(isa, || decode(c, split)).expect("a runnable tier");
        let stats = ErrorStats::compare(&got, &want);
        prop_assert!(
            stats.passes(&tolerance(c.pool.dtype())),
            "{split:?} isa {isa} {:?}: {stats:?}",
            c.batch.context_lens
        );
    }
    Ok(())
}

/// A window for a case whose first sequence has `ctx` tokens: 1, 2, block size − 1, block
/// size, ctx − 1, ctx or ctx + 5, by `pick`.
fn window(ctx: usize, bs: usize, pick: usize) -> usize {
    [1, 2, bs.max(2) - 1, bs, ctx.max(2) - 1, ctx, ctx + 5][pick % 7]
}

fn softcaps() -> impl Strategy<Value = Option<f32>> {
    prop_oneof![
        Just(None),
        Just(Some(50.0f32)),
        (0.3f32..8.0).prop_map(Some)
    ]
}

/// NaN in K and V at every position of every sequence that no query row sees (before the
/// first row's window): the kernel must never read them.
fn poison_before_windows(c: &mut PagedCase) {
    let l = c.pool.layout;
    let (mut k, mut v) = (c.pool.k.to_f32(), c.pool.v.to_f32());
    for (&ctx, table) in c.batch.context_lens.iter().zip(&c.batch.block_tables) {
        for pos in 0..c.shape.visible_range(ctx).start {
            for h in 0..l.kv_heads {
                let at = l.position_offset(table, h, pos);
                k[at..at + l.head_dim].fill(f32::NAN);
                v[at..at + l.head_dim].fill(f32::NAN);
            }
        }
    }
    let dt = c.pool.dtype();
    c.pool.k = Buffer::from_f32(dt, &k);
    c.pool.v = Buffer::from_f32(dt, &v);
}

fn block_sizes() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(16), Just(32), 1usize..=256]
}

fn dtypes() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
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
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn paged_equals_reference(lens in prop::collection::vec(4usize..700, 1..5), bs in block_sizes(), kv_log in 0usize..3, group in 1usize..5,
                              head_dim in prop_oneof![Just(64usize), Just(128), 1usize..100], q_len in 1usize..5, dtype in dtypes(),
                              split in splits(), spare in 0usize..4, seed in any::<u64>()) {
        let c = case(&lens, bs, 1 << kv_log, group, head_dim, q_len, dtype, spare, seed);
        assert_matches_reference(&c, split)?;
    }

    #[test]
    fn windowed_paged_equals_reference(lens in prop::collection::vec(16usize..700, 1..4), bs in block_sizes(), kv_log in 0usize..3, group in 1usize..5,
                                       head_dim in prop_oneof![Just(64usize), Just(128), 1usize..100], q_len in 1usize..=16, pick in 0usize..7,
                                       cap in softcaps(), dtype in dtypes(), split in splits(), seed in any::<u64>()) {
        let mut c = case(&lens, bs, 1 << kv_log, group, head_dim, q_len, dtype, 2, seed);
        c.shape = c.shape.with_window(Some(window(lens[0], bs, pick))).with_softcap(cap);
        poison_before_windows(&mut c);
        let want = c.reference().unwrap();
        prop_assert!(want.iter().all(|x| x.is_finite()));
        assert_matches_reference(&c, split)?;
    }

    #[test]
    fn windowed_split_equals_unsplit(lens in prop::collection::vec(1usize..2000, 1..4), bs in block_sizes(), part in 1usize..700,
                                     w in 1usize..600, q_len in 1usize..=16, cap in softcaps(), seed in any::<u64>()) {
        // Partitions cover the visible positions only: none is empty, and the reduction over
        // them equals one pass.
        let q_len = q_len.min(*lens.iter().min().unwrap());
        let mut c = case(&lens, bs, 2, 4, 64, q_len, DType::F32, 1, seed);
        c.shape = c.shape.with_window(Some(w)).with_softcap(cap);
        poison_before_windows(&mut c);
        let whole = decode(&c, SplitKv::Off);
        for split in [SplitKv::Tokens(part), SplitKv::Auto, SplitKv::Context] {
            let got = decode(&c, split);
            let stats = ErrorStats::compare(&got, &whole.iter().map(|&x| x as f64).collect::<Vec<_>>());
            prop_assert!(stats.passes(&tolerance(DType::F32)), "{split:?}: {stats:?}");
        }
    }

    #[test]
    fn split_equals_unsplit(lens in prop::collection::vec(1usize..2000, 1..4), bs in block_sizes(), part in 1usize..700, seed in any::<u64>()) {
        let c = case(&lens, bs, 2, 4, 64, 1, DType::F32, 1, seed);
        let whole = decode(&c, SplitKv::Off);
        let split = decode(&c, SplitKv::Tokens(part));
        let stats = ErrorStats::compare(&split, &whole.iter().map(|&x| x as f64).collect::<Vec<_>>());
        prop_assert!(stats.passes(&tolerance(DType::F32)), "{stats:?}");
    }

    #[test]
    fn paged_equals_contiguous_for_any_block_size(kv_len in 1usize..600, batch in 1usize..4, bs in block_sizes(), w in prop::option::of(1usize..700),
                                                  cap in softcaps(), seed in any::<u64>()) {
        // Same logical problem through flash2 (contiguous K/V) and paged (shuffled blocks).
        let shape = AttentionShape::new(batch, 8, 2, 1, kv_len, 64, true).with_window(w).with_softcap(cap);
        let inputs = AttentionInputs::random(&shape, DType::F32, seed);
        let run = |spec: &str| {
            let k = attention_kernel(&VariantSpec::parse(spec).unwrap()).unwrap()
                .or_else(|| kernel_paged::kernel_from_spec(&VariantSpec::parse(spec).unwrap()).unwrap()).unwrap();
            let mut out = Buffer::poisoned(DType::F32, shape.q_elems());
            k.prepare(&shape, &inputs).unwrap().run(&mut out).unwrap();
            out.to_f32()
        };
        let contiguous: Vec<f64> = run("flash2").iter().map(|&x| x as f64).collect();
        let paged = run(&format!("paged:bs={bs}"));
        prop_assert!(ErrorStats::compare(&paged, &contiguous).passes(&tolerance(DType::F32)));
    }

    #[test]
    fn batch_invariance(lens in prop::collection::vec(1usize..900, 2..5), bs in block_sizes(), split in splits(), seed in any::<u64>()) {
        // Sequence 0 alone and sequence 0 among neighbours give bit-identical output.
        let c = case(&lens, bs, 2, 2, 64, 1, DType::F32, 0, seed);
        let alone = PagedCase {
            shape: c.shape,
            pool: c.pool.clone(),
            batch: PagedBatch { context_lens: vec![lens[0]], block_tables: vec![c.batch.block_tables[0].clone()] },
            q: c.q.slice(0, c.shape.q_elems(1)),
        };
        let batched = decode(&c, split);
        let single = decode(&alone, split);
        prop_assert_eq!(&single[..], &batched[..single.len()]);
    }
}

#[test]
fn edge_cases_match_reference() {
    // Block size 1, odd lengths, kv_heads 1 and = q_heads, every split policy, all dtypes.
    for (i, (lens, bs, kv_heads, group)) in [
        (vec![54, 97, 577], 1, 1, 8),
        (vec![54, 97, 577], 16, 4, 1),
        (vec![1, 2, 3], 256, 2, 2),
        (vec![577], 7, 2, 4),
    ]
    .into_iter()
    .enumerate()
    {
        for dtype in DType::ALL {
            for split in [SplitKv::Off, SplitKv::Auto, SplitKv::Tokens(50)] {
                let q_len = 1 + i % 3;
                let c = case(
                    &lens,
                    bs,
                    kv_heads,
                    group,
                    128,
                    q_len.min(lens[0]),
                    dtype,
                    3,
                    i as u64,
                );
                assert_matches_reference(&c, split).unwrap();
            }
        }
    }
}

#[test]
fn windowed_edge_cases_match_reference() {
    // Lengths 54/97/577, block sizes 1, 16 and 7, MQA and MHA, windows around the block
    // size and the context, decode and 16-token queries, every split and dtype.
    for (i, (lens, bs, kv_heads, group)) in [
        (vec![54, 97, 577], 1, 1, 8),
        (vec![54, 97, 577], 16, 4, 1),
        (vec![577, 20], 7, 2, 4),
    ]
    .into_iter()
    .enumerate()
    {
        for (j, w) in [1, 2, bs.max(2) - 1, bs, 53, 54, 59, 576, 577, 582]
            .into_iter()
            .enumerate()
        {
            let dtype = DType::ALL[(i + j) % 3];
            let q_len = [1, 16][j % 2];
            let mut c = case(
                &lens,
                bs,
                kv_heads,
                group,
                64,
                q_len,
                dtype,
                3,
                (i * 16 + j) as u64,
            );
            c.shape = c
                .shape
                .with_window(Some(w))
                .with_softcap([None, Some(50.0), Some(2.0)][j % 3]);
            poison_before_windows(&mut c);
            for split in [
                SplitKv::Off,
                SplitKv::Auto,
                SplitKv::Tokens(50),
                SplitKv::Tokens(1),
            ] {
                assert_matches_reference(&c, split).unwrap();
            }
        }
    }
}

#[test]
fn large_pool_ids_beyond_32768_and_poisoned_slots_do_not_leak() {
    // 40 000 one-token blocks: the sequence lives in blocks with ids >= 32768, every other
    // slot is NaN, and the output must still be finite and correct.
    let (bs, head_dim, kv_heads) = (1, 64, 1);
    let len = 300;
    let layout = PoolLayout {
        num_blocks: 40_000,
        block_size: bs,
        kv_heads,
        head_dim,
    };
    let mut pool = KvPool::poisoned(layout, DType::F32).unwrap();
    let table: Vec<u32> = (0..len as u32).map(|i| 39_999 - 7 * i).collect();
    assert!(table.iter().all(|&b| b >= 32_768));
    let mut rng = kernel_common::inputs::rng(5);
    let k = kernel_common::inputs::normal_buffer(&mut rng, DType::F32, len * head_dim);
    let v = kernel_common::inputs::normal_buffer(&mut rng, DType::F32, len * head_dim);
    append(&mut pool, &table, 0, &k, &v).unwrap();
    let shape = PagedDecodeShape {
        q_heads: 4,
        kv_heads,
        head_dim,
        q_len: 1,
        scale: 0.125,
        window: None,
        softcap: None,
    };
    let c = PagedCase {
        shape,
        q: kernel_common::inputs::normal_buffer(&mut rng, DType::F32, shape.q_elems(1)),
        pool,
        batch: PagedBatch {
            context_lens: vec![len],
            block_tables: vec![table],
        },
    };
    for split in [SplitKv::Off, SplitKv::Tokens(64)] {
        let out = decode(&c, split);
        assert!(out.iter().all(|x| x.is_finite()));
        assert_matches_reference(&c, split).unwrap();
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let c = case(&[10], 4, 2, 2, 16, 1, DType::F32, 0, 1);
    let mut out = Buffer::poisoned(DType::F32, c.q.len());
    let mut bad_batch = c.batch.clone();
    bad_batch.block_tables[0][1] = 99;
    let err =
        paged_decode(&c.shape, &bad_batch, &c.pool, &c.q, &mut out, SplitKv::Off).unwrap_err();
    assert!(
        err.to_string()
            .contains("block table entry 99 out of range"),
        "{err}"
    );
    let long_q = PagedDecodeShape {
        q_len: 17,
        ..c.shape
    };
    assert!(paged_decode(&long_q, &c.batch, &c.pool, &c.q, &mut out, SplitKv::Off).is_err());
    let bad_heads = PagedDecodeShape {
        kv_heads: 3,
        ..c.shape
    };
    assert!(paged_decode(&bad_heads, &c.batch, &c.pool, &c.q, &mut out, SplitKv::Off).is_err());
    for (bad, what) in [
        (c.shape.with_window(Some(0)), "sliding window must be >= 1"),
        (c.shape.with_softcap(Some(0.0)), "soft-cap"),
        (c.shape.with_softcap(Some(f32::NAN)), "soft-cap"),
    ] {
        let err = paged_decode(&bad, &c.batch, &c.pool, &c.q, &mut out, SplitKv::Off).unwrap_err();
        assert!(err.to_string().contains(what), "{err}");
    }
    let mut short_out = Buffer::poisoned(DType::F32, 3);
    assert!(paged_decode(
        &c.shape,
        &c.batch,
        &c.pool,
        &c.q,
        &mut short_out,
        SplitKv::Off
    )
    .is_err());
}
