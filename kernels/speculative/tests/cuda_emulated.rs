//! The speculative CUDA kernel (tree attention over a paged KV cache), run by the CPU emulator
//! (`kernel_test_support::emu`: g++, CUDA threads as coroutines, warp shuffles),
//! on `kernel_speculative::cases::device()` beside the CPU kernel at every ISA tier
//! (`Backends::for_each`), against the same f64 reference, with launch shapes from the
//! host-side plans and NaN-poisoned outputs, with sliding windows (NaN in the context before
//! every query's window) and soft-capping. No GPU is involved: this checks what the kernels
//! compute before a GPU is lent, not their speed. Skips (with the reason) where g++ is missing.

use kernel_attention::cuda::device_options;
use kernel_common::{tolerance, DType};
use kernel_cuda::buffer::{buffer_bytes, f32_bytes, f32_from_bytes, i32_bytes};
use kernel_speculative::cases::{device, Built, Case};
use kernel_speculative::cuda::{depths, mask_bytes, plan_tree_attention};
use kernel_speculative::{tree_attention, tree_attention_reference};
use kernel_test_support::backends::{Backend, Backends};
use kernel_test_support::emu::{Arg, EmuModule};
use kernel_test_support::emulated::assert_close;
use kernel_test_support::mutations;

#[test]
fn tree_attention_matches_the_reference() {
    // The family's device cases on every backend: the CPU tree attention at every ISA tier,
    // then the CUDA kernel on the emulator, the queries in reverse topological order.
    let backends = Backends::with_emulator(&kernel_speculative::cuda::SOURCE);
    for (ti, case) in device().iter().enumerate() {
        let mut built = case.build(ti as u64);
        built.nodes.reverse();
        let at = built.context(case);
        let want = tree_attention_reference(&built.shape, &at, &built.q).unwrap();
        let tol = tolerance(DType::F32).scaled_to(&want);
        backends.for_each(|backend| match backend {
            Backend::Cpu(isa) => {
                let mut out = vec![f32::NAN; built.q.len()];
                tree_attention(&built.shape, &at, &built.q, &mut out).unwrap();
                assert_close(&format!("tree {ti} {isa}"), &out, &want, tol);
            }
            Backend::Emulator(m) => {
                let got = emulated(m, case, &built);
                assert_close(&format!("tree {ti} cuda"), &got, &want, tol);
            }
        });
    }
}

/// The CUDA tree attention launched on the emulator as the host plans it, into a
/// NaN-poisoned output.
fn emulated(m: &EmuModule, case: &Case, built: &Built) -> Vec<f32> {
    let at = built.context(case);
    let (n, shape) = (case.tree.len(), &built.shape);
    let mut out = f32_bytes(&vec![f32::NAN; built.q.len()]);
    let tb = i32_bytes(&built.table.iter().map(|&b| b as i32).collect::<Vec<_>>());
    let nb = i32_bytes(&built.nodes.iter().map(|&x| x as i32).collect::<Vec<_>>());
    let db = i32_bytes(&depths(&at).unwrap());
    let (w, cap) = device_options(case.window, case.softcap, case.ctx + n).unwrap();
    let i = |v: usize| Arg::I32(v as i32);
    m.launch(
        "tree_attention_f32",
        plan_tree_attention(shape, built.nodes.len()).unwrap(),
        &mut [
            Arg::In(&f32_bytes(&built.q)),
            Arg::In(&buffer_bytes(&built.pool.k)),
            Arg::In(&buffer_bytes(&built.pool.v)),
            Arg::In(&tb),
            Arg::In(&mask_bytes(&at)),
            Arg::In(&nb),
            Arg::In(&db),
            Arg::Out(&mut out),
            i(built.nodes.len()),
            i(n),
            i(case.ctx),
            i(shape.q_heads),
            i(shape.kv_heads),
            i(shape.head_dim),
            i(case.block_size),
            Arg::F32(shape.scale),
            Arg::I32(w),
            Arg::F32(cap),
        ],
    )
    .unwrap();
    f32_from_bytes(&out)
}

#[test]
fn planted_bugs_fail_the_emulated_check() {
    // Planted in spec.cu and run in a child process: the window bound on tree nodes off by
    // one, the soft-cap skipped, and a query load one past the end of q (unused, so only
    // AddressSanitizer sees it: that run has the kernels built with ASan and UBSan). Beside
    // them the test runs once with sanitised kernels. (The test passing unmutated is the
    // test.)
    if kernel_test_support::emu::unavailable().is_some() || mutations::switched_on() {
        return;
    }
    let caught = mutations::assert_each_caught("spec.cu", "tree_attention_matches_the_reference");
    assert_eq!(caught.len(), 3);
}
