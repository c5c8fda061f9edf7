//! The quant CUDA kernels (fused dequant GEMV per format), run by the CPU emulator
//! (`kernel_test_support::emu`: g++, CUDA threads as coroutines, warp shuffles),
//! on `kernel_quant::cases::device()` beside every CPU row of the quant table at every ISA
//! tier (`Backends::for_each`), against the same f64 references, with launch shapes from the
//! host-side plans and NaN-poisoned outputs; a planted bug it must catch, and the test once
//! more with the kernels built with ASan and UBSan (`kernel_test_support::mutations`). No GPU
//! is involved: this checks what the kernels compute before a GPU is lent, not their speed.
//! Skips (with the reason) where g++ is missing.

use kernel_common::inputs::{derive_seed, normal_f32, rng};
use kernel_common::{case_free_check_specs, tolerance, DType, Runs, VariantSpec};
use kernel_cuda::buffer::{f32_bytes, f32_from_bytes};
use kernel_quant::cases::{device, Case};
use kernel_quant::cuda::{gemv_entry, plan_gemv};
use kernel_quant::{reference, QuantMatrix};
use kernel_test_support::backends::{Backend, Backends};
use kernel_test_support::emu::{Arg, EmuModule};
use kernel_test_support::emulated::assert_close;
use kernel_test_support::mutations;

#[test]
fn quant_gemv_matches_the_dequantised_reference() {
    // The family's device cases on every backend: each CPU row of the quant table (its
    // check specs: the fused and packed products at every tier) at every ISA tier, then the
    // CUDA GEMV on the emulator.
    let backends = Backends::with_emulator(&kernel_quant::cuda::SOURCE);
    let specs = case_free_check_specs(&[kernel_quant::VARIANTS], Runs::Cpu);
    for (i, case) in device().iter().enumerate() {
        let seed = derive_seed(i as u64, case.rows as u64);
        let q =
            QuantMatrix::quantize(case.format, case.rows, case.cols, &case.weights(seed)).unwrap();
        let x = normal_f32(&mut rng(seed ^ 1), case.batch * case.cols, 1.0);
        let label = format!(
            "{} {}x{} b{}",
            case.format, case.rows, case.cols, case.batch
        );
        backends.for_each(|backend| match backend {
            Backend::Cpu(isa) => {
                for spec in &specs {
                    let v = kernel_quant::variant_from_spec(&VariantSpec::parse(spec).unwrap())
                        .unwrap()
                        .unwrap();
                    if kernel_quant::supports(v, case.format).is_err() {
                        continue;
                    }
                    let seen = kernel_quant::activation_as_seen(v, case.format, &x, case.cols);
                    let want = reference::matmul(&q, &seen, case.batch);
                    let mut y = vec![f32::NAN; case.batch * case.rows];
                    kernel_quant::matmul(&q, &x, case.batch, &mut y, v).unwrap();
                    let tol = tolerance(DType::F32).scaled_to(&want);
                    assert_close(&format!("{spec} {isa} {label}"), &y, &want, tol);
                }
            }
            Backend::Emulator(m) => emulated(m, case, &q, &x, &label),
        });
    }
}

/// The CUDA GEMV launched on the emulator as the host plans it, into a NaN-poisoned output.
fn emulated(m: &EmuModule, case: &Case, q: &QuantMatrix, x: &[f32], label: &str) {
    let (rows, cols, batch) = (case.rows, case.cols, case.batch);
    let want = reference::matmul(q, x, batch);
    let mut y = f32_bytes(&vec![f32::NAN; batch * rows]);
    let xb = f32_bytes(x);
    m.launch(
        gemv_entry(case.format).unwrap(),
        plan_gemv(case.format, rows, cols, batch).unwrap(),
        &mut [
            Arg::In(q.bytes()),
            Arg::In(&xb),
            Arg::Out(&mut y),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
            Arg::I32(batch as i32),
        ],
    )
    .unwrap();
    assert_close(
        label,
        &f32_from_bytes(&y),
        &want,
        tolerance(DType::F32).scaled_to(&want),
    );
}

#[test]
fn planted_bugs_fail_the_emulated_check() {
    // Planted in quant.cu and run in a child process: the lanes without a block of the row
    // returning before the warp sum (a shuffle whose mask names exited lanes: on a GPU
    // undefined, a hang or garbage). Beside it the test runs once with the kernels built with
    // ASan and UBSan. (The test passing unmutated is the test.)
    if kernel_test_support::emu::unavailable().is_some() || mutations::switched_on() {
        return;
    }
    let caught =
        mutations::assert_each_caught("quant.cu", "quant_gemv_matches_the_dequantised_reference");
    assert_eq!(caught.len(), 1);
}
