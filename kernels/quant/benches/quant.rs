//! Criterion benches of the fused GEMV (batch 1) and dequant-GEMM (batch 16) on a 4096×4096
//! weight matrix, per format, beside the f32 and f16 baselines. The harness's `quant_tradeoff`
//! experiment is the measured record; these are for quick iteration (`cargo bench -p
//! kernel-quant`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kernel_common::inputs::{normal_f32, rng};
use kernel_quant::{matmul, MatVecVariant, QuantMatrix, WeightDist, WeightFormat};

fn bench(c: &mut Criterion) {
    let (rows, cols) = (4096, 4096);
    let w = WeightDist::Gaussian.sample(rows, cols, 1);
    let mut group = c.benchmark_group("quant_matmul_4096x4096");
    group.sample_size(20);
    for batch in [1usize, 16] {
        let x = normal_f32(&mut rng(2), batch * cols, 1.0);
        let mut y = vec![0.0f32; batch * rows];
        for name in [
            "f32",
            "f16",
            "q8_0",
            "q4_0",
            "q4_1",
            "sym4g32",
            "asym4g128",
            "sym3g64",
        ] {
            let f = WeightFormat::parse(name).expect("known format");
            let m = QuantMatrix::quantize(f, rows, cols, &w).expect("finite weights");
            group.throughput(Throughput::Bytes(m.bytes().len() as u64));
            group.bench_function(BenchmarkId::new(name, format!("b{batch}")), |b| {
                b.iter(|| {
                    matmul(&m, &x, batch, &mut y, MatVecVariant::FUSED).expect("valid shapes")
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
