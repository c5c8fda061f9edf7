//! The paged CUDA kernels (decode, split-KV reduction, append), run by the CPU emulator
//! (`kernel_test_support::emu`: g++, CUDA threads as coroutines, warp shuffles),
//! against the same f64 references the CPU variants answer to, with launch shapes from the
//! host-side plans and NaN-poisoned outputs; planted bugs it must catch, and each test once
//! more with the kernels built with ASan and UBSan. No GPU is involved: this checks what the
//! kernels compute before a GPU is lent, not their speed. Skips (with the reason) where g++ is
//! missing.

use kernel_attention::cuda::device_options;
use kernel_common::inputs::{normal_buffer, rng};
use kernel_common::{tolerance, Buffer, DType};
use kernel_cuda::buffer::{buffer_bytes, buffer_from_bytes, f32_bytes, i32_bytes};
use kernel_cuda::Launch;
use kernel_paged::cuda::{flat_tables, plan_decode, slots, KeyLoop, NOMINAL_RESIDENT_BLOCKS};
use kernel_paged::{append, KvPool, PagedCaseSpec, PoolLayout, SplitKv};
use kernel_test_support::emu::{Arg, EmuModule};
use kernel_test_support::emulated::{assert_close, module, nan_bytes};
use kernel_test_support::mutations;
use rand::seq::SliceRandom;

/// Runs the decode (and the reduction) of `plan_decode` on the emulator.
fn emulated_decode(
    m: &EmuModule,
    case: &kernel_paged::PagedCase,
    split: SplitKv,
    keys: KeyLoop,
) -> Vec<f32> {
    let dtype = case.pool.dtype();
    let lens = &case.batch.context_lens;
    let p = plan_decode(
        &case.shape,
        lens,
        dtype,
        split,
        keys,
        NOMINAL_RESIDENT_BLOCKS,
    )
    .unwrap();
    let (tables, width) = flat_tables(&case.batch.block_tables);
    let lens: Vec<i32> = case.batch.context_lens.iter().map(|&l| l as i32).collect();
    let (kp, vp, q) = (
        buffer_bytes(&case.pool.k),
        buffer_bytes(&case.pool.v),
        buffer_bytes(&case.q),
    );
    let (tb, lb) = (i32_bytes(&tables), i32_bytes(&lens));
    let mut out = nan_bytes(dtype, case.q.len());
    let mut part_o = f32_bytes(&vec![f32::NAN; p.partial_elems.max(1)]);
    let mut part_lse = f32_bytes(&vec![f32::NAN; p.lse_elems.max(1)]);
    let s = &case.shape;
    let i = |x: usize| Arg::I32(x as i32);
    let l = case.pool.layout;
    let max_ctx = case.batch.context_lens.iter().copied().max().unwrap();
    let (window, softcap) = device_options(s.window, s.softcap, max_ctx).unwrap();
    m.launch(
        &p.decode_entry,
        p.decode,
        &mut [
            Arg::In(&q),
            Arg::In(&kp),
            Arg::In(&vp),
            Arg::In(&tb),
            Arg::In(&lb),
            Arg::Out(&mut out),
            Arg::Out(&mut part_o),
            Arg::Out(&mut part_lse),
            i(case.batch.len()),
            i(s.q_heads),
            i(s.kv_heads),
            i(s.q_len),
            i(l.block_size),
            i(width),
            i(p.part_tokens),
            i(p.row_chunks),
            Arg::F32(s.scale),
            Arg::I32(window),
            Arg::F32(softcap),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    if let Some((entry, launch)) = &p.reduce {
        m.launch(
            entry,
            *launch,
            &mut [
                Arg::In(&part_o),
                Arg::In(&part_lse),
                Arg::In(&lb),
                Arg::Out(&mut out),
                i(case.batch.len()),
                i(s.q_heads),
                i(s.q_len),
                i(s.head_dim),
                i(p.part_tokens),
                Arg::I32(window),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    buffer_from_bytes(dtype, &out).to_f32()
}

#[test]
fn paged_decode_unsplit_and_split_match_the_reference() {
    let Some(m) = module(&kernel_paged::cuda::SOURCE) else {
        return;
    };
    let spec =
        |lens: Vec<usize>, bs, kv_heads, group, head_dim, q_len, dtype, seed| PagedCaseSpec {
            context_lens: lens,
            block_size: bs,
            kv_heads,
            group,
            head_dim,
            q_len,
            dtype,
            spare_blocks: 3,
            seed,
        };
    let cases = [
        spec(vec![54, 97, 577], 16, 2, 4, 128, 1, DType::F32, 1),
        spec(vec![300, 1], 1, 1, 8, 64, 1, DType::F16, 2),
        spec(vec![130, 77], 32, 2, 2, 128, 3, DType::BF16, 3),
        // MQA with 9 query heads × 2 new tokens = 18 rows: two row chunks.
        spec(vec![40], 4, 1, 9, 64, 2, DType::F32, 4),
    ];
    for s in &cases {
        let case = s.build().unwrap();
        let want = case.reference().unwrap();
        for (split, keys) in [
            (SplitKv::Off, KeyLoop::Plain(1)),
            (SplitKv::Tokens(37), KeyLoop::Plain(1)),
            (SplitKv::Auto, KeyLoop::Plain(1)),
            (SplitKv::Off, KeyLoop::Plain(2)),
            (SplitKv::Tokens(37), KeyLoop::Plain(2)),
            (SplitKv::Off, KeyLoop::Pipelined),
            (SplitKv::Tokens(37), KeyLoop::Pipelined),
            (SplitKv::Tokens(5), KeyLoop::Pipelined),
            (SplitKv::Auto, KeyLoop::Pipelined),
        ] {
            let got = emulated_decode(&m, &case, split, keys);
            assert_close(
                &format!("{} {split:?} {keys:?}", case.label()),
                &got,
                &want,
                tolerance(s.dtype),
            );
        }
    }
    windowed_and_capped_cases_match_the_reference(&m);
}

/// Windows inside a block, across blocks and past the context, decode and 2–3 new tokens,
/// soft-capped and not, split and not; NaN in K/V before the window must not be read.
fn windowed_and_capped_cases_match_the_reference(m: &EmuModule) {
    let spec = |lens: Vec<usize>, bs, group, head_dim, q_len, dtype, seed| PagedCaseSpec {
        context_lens: lens,
        block_size: bs,
        kv_heads: 2,
        group,
        head_dim,
        q_len,
        dtype,
        spare_blocks: 2,
        seed,
    };
    let cases = [
        (
            spec(vec![300, 40], 16, 4, 128, 1, DType::F32, 5),
            Some(7),
            None,
        ),
        (
            spec(vec![300, 97], 16, 2, 64, 3, DType::BF16, 6),
            Some(100),
            Some(2.0),
        ),
        (spec(vec![130], 32, 3, 64, 1, DType::F16, 7), Some(1), None),
        (
            spec(vec![77, 5], 4, 2, 128, 2, DType::F32, 8),
            Some(200),
            Some(50.0),
        ),
        (spec(vec![60], 8, 2, 64, 1, DType::F32, 9), None, Some(0.5)),
    ];
    for (s, window, softcap) in &cases {
        let mut case = s.build().unwrap();
        case.shape = case.shape.with_window(*window).with_softcap(*softcap);
        let l = case.pool.layout;
        let (mut k, mut v) = (case.pool.k.to_f32(), case.pool.v.to_f32());
        for (&ctx, table) in case.batch.context_lens.iter().zip(&case.batch.block_tables) {
            for pos in 0..case.shape.visible_range(ctx).start {
                for h in 0..l.kv_heads {
                    let at = l.position_offset(table, h, pos);
                    k[at..at + l.head_dim].fill(f32::NAN);
                    v[at..at + l.head_dim].fill(f32::NAN);
                }
            }
        }
        case.pool.k = Buffer::from_f32(s.dtype, &k);
        case.pool.v = Buffer::from_f32(s.dtype, &v);
        let want = case.reference().unwrap();
        for (split, keys) in [
            (SplitKv::Off, KeyLoop::Plain(1)),
            (SplitKv::Tokens(37), KeyLoop::Plain(1)),
            (SplitKv::Tokens(5), KeyLoop::Plain(2)),
            (SplitKv::Off, KeyLoop::Plain(2)),
            (SplitKv::Off, KeyLoop::Pipelined),
            (SplitKv::Tokens(6), KeyLoop::Pipelined),
        ] {
            let got = emulated_decode(m, &case, split, keys);
            assert_close(
                &format!("{} {window:?} {softcap:?} {split:?} {keys:?}", case.label()),
                &got,
                &want,
                tolerance(s.dtype),
            );
        }
    }
}

#[test]
fn paged_append_writes_exactly_the_slots() {
    let Some(m) = module(&kernel_paged::cuda::SOURCE) else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let layout = PoolLayout {
            num_blocks: 9,
            block_size: 4,
            kv_heads: 2,
            head_dim: 64,
        };
        let mut r = rng(11);
        let mut table: Vec<u32> = (0..9).collect();
        table.shuffle(&mut r);
        let (start, n) = (3, 13);
        // The CPU append takes [kv_heads, n, d]; the kernel [n, kv_heads, d].
        let k = normal_buffer(&mut r, dtype, 2 * n * 64);
        let v = normal_buffer(&mut r, dtype, 2 * n * 64);
        let mut want = KvPool::poisoned(layout, dtype).unwrap();
        append(&mut want, &table, start, &k, &v).unwrap();
        let to_tokens = |b: &Buffer| -> Vec<u8> {
            let f = b.to_f32();
            let mut t = Vec::with_capacity(f.len());
            for pos in 0..n {
                for h in 0..2 {
                    t.extend_from_slice(&f[(h * n + pos) * 64..(h * n + pos + 1) * 64]);
                }
            }
            buffer_bytes(&Buffer::from_f32(dtype, &t))
        };
        let mut sl = slots(&layout, &table, start, n).unwrap();
        sl[5] = -1; // padding: must land nowhere
        let mut kp = nan_bytes(dtype, 9 * layout.block_elems());
        let mut vp = nan_bytes(dtype, 9 * layout.block_elems());
        let (kn, vn, sb) = (to_tokens(&k), to_tokens(&v), i32_bytes(&sl));
        let entry = format!("paged_append_{}", kernel_cuda::dtype_suffix(dtype));
        m.launch(
            &entry,
            Launch::new((n, 1, 1), 128, 0).unwrap(),
            &mut [
                Arg::In(&kn),
                Arg::In(&vn),
                Arg::In(&sb),
                Arg::Out(&mut kp),
                Arg::Out(&mut vp),
                Arg::I32(2),
                Arg::I32(64),
                Arg::I32(4),
            ],
        )
        .unwrap();
        // Equal to the CPU append everywhere but token 5's slot, which stays poisoned.
        let (got_k, want_k) = (buffer_from_bytes(dtype, &kp).to_f32(), want.k.to_f32());
        let skipped = layout.position_offset(&table, 0, start + 5);
        for (i, (g, w)) in got_k.iter().zip(&want_k).enumerate() {
            let in_skipped = (0..2).any(|h| {
                let at = layout.position_offset(&table, h, start + 5);
                (at..at + 64).contains(&i)
            });
            if in_skipped {
                assert!(
                    g.is_nan(),
                    "padding token written at {i} (slot at {skipped})"
                );
            } else {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "K {i}"
                );
            }
        }
        let got_v = buffer_from_bytes(dtype, &vp).to_f32();
        assert_eq!(
            got_v.iter().filter(|x| !x.is_nan()).count(),
            (n - 1) * 2 * 64
        );
    }
}

#[test]
fn planted_bugs_fail_the_emulated_check() {
    // Planted in paged.cu and run in a child process: the causal bound off by one, the
    // decode's hq and hkv launch arguments swapped (the kernel's signature, as the launcher
    // sees it), the window bound off by one, the partitions started at position 0 instead
    // of the window (reads NaN), the soft-cap skipped, the pipelined loop's page-table reads
    // one step stale. Beside them the test runs once with
    // the kernels built with ASan and UBSan. (The test passing unmutated is the test.)
    if kernel_test_support::emu::unavailable().is_some() || mutations::switched_on() {
        return;
    }
    let caught = mutations::assert_each_caught(
        "paged.cu",
        "paged_decode_unsplit_and_split_match_the_reference",
    );
    assert_eq!(caught.len(), 6);
}

#[test]
fn append_passes_with_asan_and_ubsan() {
    // paged_append_writes_exactly_the_slots once more, in a child process with the kernels
    // built with AddressSanitizer and UndefinedBehaviorSanitizer.
    kernel_test_support::sanitized::assert_passes("paged_append_writes_exactly_the_slots");
}
