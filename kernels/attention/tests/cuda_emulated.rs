//! The attention CUDA kernels (naive, flash2, flash2p), run by the CPU emulator
//! (`kernel_test_support::emu`: g++, CUDA threads as coroutines, warp shuffles and the
//! m16n8k16 MMA from its fragment layout),
//! against the same f64 references the CPU variants answer to, with launch shapes from the
//! host-side plans and NaN-poisoned outputs, with sliding windows and soft-capping. No GPU is involved: this checks what the kernels
//! compute before a GPU is lent, not their speed. Skips (with the reason) where g++ is missing.

use kernel_attention::cuda::{device_options, plan, CudaAlgo, FLASH2_BLOCK_ROWS};
use kernel_attention::reference::attention;
use kernel_attention::{cases, kernel_from_spec, AttentionInputs, AttentionShape, VARIANTS};
use kernel_common::inputs::{derive_seed, rng};
use kernel_common::{check_specs, tolerance, Buffer, DType, Device, Runs, VariantSpec};
use kernel_cuda::buffer::{buffer_bytes, buffer_from_bytes};
use kernel_test_support::backends::{Backend, Backends};
use kernel_test_support::emu::{Arg, EmuModule};
use kernel_test_support::emulated::{assert_close, nan_bytes};
use kernel_test_support::mutations;

#[test]
fn attention_naive_and_flash2_match_the_reference() {
    // The family's device cases on every backend: each CPU row of the attention table (its
    // check specs) at every ISA tier, then the CUDA kernels on the emulator.
    let backends = Backends::with_emulator(&kernel_attention::cuda::SOURCE);
    for (i, shape) in cases::device().iter().enumerate() {
        let specs = check_specs(&[VARIANTS], Runs::Cpu, i, &mut rng(i as u64));
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let inputs = AttentionInputs::random(shape, dtype, derive_seed(7, i as u64));
            let want = attention(shape, &inputs);
            backends.for_each(|backend| match backend {
                Backend::Cpu(isa) => {
                    for spec in &specs {
                        let kernel = kernel_from_spec(&VariantSpec::parse(spec).unwrap())
                            .unwrap()
                            .unwrap();
                        if kernel.supports(shape, dtype, Device::Cpu).is_err() {
                            continue;
                        }
                        let mut out = Buffer::poisoned(dtype, shape.q_elems());
                        kernel
                            .prepare(shape, &inputs)
                            .unwrap()
                            .run(&mut out)
                            .unwrap();
                        let what = format!("{spec} {isa} {} {dtype}", shape.label());
                        assert_close(&what, &out.to_f32(), &want, tolerance(dtype));
                    }
                }
                Backend::Emulator(m) => emulated(m, shape, dtype, &inputs, &want),
            });
        }
    }
    assert_eq!(FLASH2_BLOCK_ROWS, 64);
}

/// naive, flash2 and flash2p launched on the emulator as the host plans them, into a
/// NaN-poisoned output.
fn emulated(
    m: &EmuModule,
    shape: &AttentionShape,
    dtype: DType,
    inputs: &AttentionInputs,
    want: &[f64],
) {
    let (q, k, v) = (
        buffer_bytes(&inputs.q),
        buffer_bytes(&inputs.k),
        buffer_bytes(&inputs.v),
    );
    let ints = |x: usize| Arg::I32(x as i32);
    for algo in [CudaAlgo::Naive, CudaAlgo::Flash2, CudaAlgo::Flash2Pipelined] {
        let Ok(p) = plan(algo, shape, dtype) else {
            assert!(algo != CudaAlgo::Naive && dtype == DType::F32);
            continue;
        };
        let mut o = nan_bytes(dtype, shape.q_elems());
        let mut scores = vec![0u8; p.workspace_bytes];
        for l in &p.launches {
            let s = shape;
            let mut args: Vec<Arg> = if l.entry.starts_with("flash2") {
                vec![Arg::In(&q), Arg::In(&k), Arg::In(&v), Arg::Out(&mut o)]
            } else if l.entry.starts_with("naive_scores") {
                vec![Arg::In(&q), Arg::In(&k), Arg::Out(&mut scores)]
            } else if l.entry == "naive_softmax_f32" {
                let rows = (s.batch * s.q_heads * s.q_len) as i64;
                vec![Arg::Out(&mut scores), Arg::I64(rows), ints(s.kv_len)]
            } else {
                vec![Arg::In(&scores), Arg::In(&v), Arg::Out(&mut o)]
            };
            if l.entry.starts_with("flash2") || l.entry.starts_with("naive_scores") {
                args.extend([ints(s.q_heads), ints(s.kv_heads), ints(s.q_len)]);
                args.push(ints(s.kv_len));
                if l.entry.starts_with("naive_scores") {
                    args.push(ints(s.head_dim));
                }
                args.extend([Arg::I32(s.causal as i32), Arg::F32(s.scale)]);
                let (window, softcap) =
                    device_options(s.window, s.softcap, s.kv_len).expect("a small window");
                args.extend([Arg::I32(window), Arg::F32(softcap)]);
            } else if l.entry.starts_with("naive_pv") {
                args.extend([ints(s.q_heads), ints(s.kv_heads), ints(s.q_len)]);
                args.extend([ints(s.kv_len), ints(s.head_dim)]);
            }
            m.launch(&l.entry, l.launch, &mut args)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let got = buffer_from_bytes(dtype, &o).to_f32();
        assert_close(
            &format!("{algo:?} {} {dtype}", shape.label()),
            &got,
            want,
            tolerance(dtype),
        );
    }
}

#[test]
fn planted_bugs_fail_the_emulated_check() {
    // Each bug kernels/CUDA.md says this test catches, planted in attention.cu and run in a
    // child process: swapped V rows in flash2's P·V, each tile barrier of flash2 and flash2p
    // removed, V read by ldmatrix without .trans, the sliding-window bound off by one, the
    // key loop started one key late, the soft-cap skipped; and the failures of a GPU the
    // emulator shows: flash2p waiting for one cp.async group too few, its last wait removed,
    // a misaligned cp.async source, flash2's rows past kv_len left unwritten in shared memory
    // (poisoned). Beside them the test runs once with the kernels built with ASan and UBSan.
    // (The test passing unmutated is the test.)
    if kernel_test_support::emu::unavailable().is_some() || mutations::switched_on() {
        return;
    }
    let caught = mutations::assert_each_caught(
        "attention.cu",
        "attention_naive_and_flash2_match_the_reference",
    );
    assert_eq!(caught.len(), 13);
}
