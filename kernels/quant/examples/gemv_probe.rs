//! Quick A/B probe of the batch-1 products on one shape (not a benchmark of record: the
//! `quant_tradeoff` experiment is). Variants are timed round-robin, best of 9 rounds each, so
//! host noise hits all alike. `cargo run --release -p quant-kernels --example gemv_probe --
//! q4_1 3072 576 [copies]` (copies > 1: that many distinct matrices, to stream from memory);
//! env T = threads (default 2), ISA = one tier only, B = activations per call (default 1: a
//! GEMV; B = 512 times a prefill-sized product, reported per activation).

use kernel_common::inputs::{normal_f32, rng};
use quant_kernels::{Isa, MatVecVariant, Prepared, QuantMatrix, WeightDist, WeightFormat};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let threads = std::env::var("T").map_or(2, |t| t.parse().expect("T: a thread count"));
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .expect("one pool");
    let args: Vec<String> = std::env::args().collect();
    let fmt = WeightFormat::parse(args.get(1).map_or("q4_1", |s| s)).expect("a format");
    let rows: usize = args.get(2).map_or(3072, |s| s.parse().expect("rows"));
    let cols: usize = args.get(3).map_or(576, |s| s.parse().expect("cols"));
    let copies: usize = args.get(4).map_or(1, |s| s.parse().expect("copies"));
    let w = WeightDist::Gaussian.sample(rows, cols, 1);
    let ms: Vec<Arc<QuantMatrix>> = (0..copies)
        .map(|_| Arc::new(QuantMatrix::quantize(fmt, rows, cols, &w).expect("finite")))
        .collect();
    let batch: usize = std::env::var("B").map_or(1, |b| b.parse().expect("B: a batch"));
    let x = normal_f32(&mut rng(2), batch * cols, 1.0);
    let bytes = ms[0].bytes().len();
    let only = std::env::var("ISA").ok();
    let mut variants = vec![];
    for isa in Isa::available() {
        if only.as_deref().is_some_and(|o| o != isa.name()) {
            continue;
        }
        for v in [
            MatVecVariant::Fused(Some(isa)),
            MatVecVariant::FusedQ8(Some(isa)),
            MatVecVariant::Packed(Some(isa)),
        ] {
            if quant_kernels::supports(v, fmt).is_ok() {
                variants.push(v);
            }
        }
    }
    let n = (100_000_000 / (bytes * copies * batch)).max(2);
    let prepared: Vec<Vec<Prepared>> = variants
        .iter()
        .map(|&v| {
            ms.iter()
                .map(|m| Prepared::new(m.clone(), v).expect("prepares"))
                .collect()
        })
        .collect();
    rayon::scope(|_| {
        let mut y = vec![0.0f32; batch * rows];
        let mut best = vec![f64::INFINITY; variants.len()];
        for _ in 0..9 {
            for (i, &v) in variants.iter().enumerate() {
                let t = Instant::now();
                for _ in 0..n {
                    for p in &prepared[i] {
                        p.matmul(&x, batch, &mut y, v).expect("valid");
                    }
                }
                best[i] = best[i].min(t.elapsed().as_secs_f64() / (n * copies * batch) as f64);
            }
        }
        for (v, dt) in variants.iter().zip(best) {
            println!(
                "{fmt} {rows}x{cols} x{copies} B={batch} T={threads} {v:?}: {:.1} us, {:.2} GB/s, {:.2} ns/row-block, {:.1} GMAC/s",
                dt * 1e6,
                bytes as f64 / dt / 1e9,
                dt * 1e9 / (rows * cols / 32) as f64,
                (rows * cols) as f64 / dt / 1e9
            );
        }
    });
}
