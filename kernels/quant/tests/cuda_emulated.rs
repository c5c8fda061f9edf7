//! The quant CUDA kernels (fused dequant GEMV per format), run by the CPU emulator
//! (`kernel_test_support::emu`: g++, CUDA threads as coroutines, warp shuffles),
//! against the same f64 references the CPU variants answer to, with launch shapes from the
//! host-side plans and NaN-poisoned outputs. No GPU is involved: this checks what the kernels
//! compute before a GPU is lent, not their speed. Skips (with the reason) where g++ is missing.

use kernel_common::inputs::{derive_seed, normal_f32, rng};
use kernel_common::{tolerance, DType};
use kernel_cuda::buffer::{f32_bytes, f32_from_bytes};
use kernel_test_support::emu::Arg;
use kernel_test_support::emulated::{assert_close, module};

#[test]
fn quant_gemv_matches_the_dequantised_reference() {
    let Some(m) = module(&kernel_quant::cuda::SOURCE) else {
        return;
    };
    use kernel_quant::cuda::{gemv_entry, plan_gemv};
    use kernel_quant::{reference, QuantMatrix, WeightFormat};
    for (fi, fmt) in ["f16", "sym4g32", "q4_0", "q8_0"].into_iter().enumerate() {
        let format = WeightFormat::parse(fmt).unwrap();
        for (rows, cols, batch) in [(37, 96, 1), (9, 1024, 3), (130, 64, 8)] {
            let seed = derive_seed(fi as u64, rows as u64);
            let w = normal_f32(&mut rng(seed), rows * cols, 1.0);
            let q = QuantMatrix::quantize(format, rows, cols, &w).unwrap();
            let x = normal_f32(&mut rng(seed ^ 1), batch * cols, 1.0);
            let want = reference::matmul(&q, &x, batch);
            let mut y = f32_bytes(&vec![f32::NAN; batch * rows]);
            let xb = f32_bytes(&x);
            m.launch(
                gemv_entry(format).unwrap(),
                plan_gemv(format, rows, cols, batch).unwrap(),
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
                &format!("{fmt} {rows}x{cols} b{batch}"),
                &f32_from_bytes(&y),
                &want,
                tolerance(DType::F32).scaled_to(&want),
            );
        }
    }
}
