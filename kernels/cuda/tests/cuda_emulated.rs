//! The roofline's bf16 MMA GEMM (`roofline.cu`), run by the CPU emulator
//! (`kernel_test_support::emu`: g++, CUDA threads as coroutines, the m16n8k16 MMA from its
//! fragment layout),
//! against the same f64 references the CPU variants answer to, with launch shapes from the
//! host-side plans and NaN-poisoned outputs, and once more with the kernel built with ASan and
//! UBSan (`kernel_test_support::sanitized`). No GPU is involved: this checks what the kernels
//! compute before a GPU is lent, not their speed. Skips (with the reason) where g++ is missing.

use kernel_common::inputs::{normal_f32, rng};
use kernel_common::{tolerance, Buffer, DType};
use kernel_cuda::buffer::{buffer_bytes, f32_bytes, f32_from_bytes};
use kernel_test_support::emu::Arg;
use kernel_test_support::emulated::{assert_close, module};

#[test]
fn roofline_gemm_matches_an_f64_product() {
    let Some(m) = module(&kernel_cuda::roofline::SOURCE) else {
        return;
    };
    use half::bf16;
    let (mm, nn, kk) = (128, 256, 64);
    let a: Vec<bf16> = normal_f32(&mut rng(1), mm * kk, 1.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let b: Vec<bf16> = normal_f32(&mut rng(2), nn * kk, 1.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let mut c = f32_bytes(&vec![f32::NAN; mm * nn]);
    m.launch(
        "gemm_bf16",
        kernel_cuda::roofline::plan_gemm(mm, nn, kk).unwrap(),
        &mut [
            Arg::In(&buffer_bytes(&Buffer::BF16(a.clone()))),
            Arg::In(&buffer_bytes(&Buffer::BF16(b.clone()))),
            Arg::Out(&mut c),
            Arg::I32(mm as i32),
            Arg::I32(nn as i32),
            Arg::I32(kk as i32),
        ],
    )
    .unwrap();
    let want: Vec<f64> = (0..mm * nn)
        .map(|ij| {
            let (i, j) = (ij / nn, ij % nn);
            (0..kk)
                .map(|t| a[i * kk + t].to_f64() * b[j * kk + t].to_f64())
                .sum()
        })
        .collect();
    assert_close("gemm", &f32_from_bytes(&c), &want, tolerance(DType::F32));
}

#[test]
fn gemm_passes_with_asan_and_ubsan() {
    // roofline_gemm_matches_an_f64_product once more, in a child process with the kernel
    // built with AddressSanitizer and UndefinedBehaviorSanitizer.
    kernel_test_support::sanitized::assert_passes("roofline_gemm_matches_an_f64_product");
}
