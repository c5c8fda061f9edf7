//! Quick A/B probe of the batch-1 products on one shape (not a benchmark of record: the
//! `quant_tradeoff` experiment is). Every (format, variant) is timed round-robin with the f32
//! GEMV baseline, best of 9 rounds each, so host noise hits all alike, and reported with its
//! speed-up over f32. `cargo run --release -p kernel-quant --example gemv_probe --
//! q4_k,q6_k 4096 4096 [bytes]`: each format gets enough distinct matrices to stream `bytes`
//! (default 96 MB, beyond L3) per round; env T = threads (default 2), ISA = one tier only,
//! B = batch (default 1).

use kernel_common::inputs::{normal_f32, rng};
use kernel_quant::{Isa, MatVecVariant, Prepared, QuantMatrix, WeightDist, WeightFormat};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let env = |k: &str, d: usize| std::env::var(k).map_or(d, |t| t.parse().expect("a number"));
    let (threads, batch) = (env("T", 2), env("B", 1));
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .expect("one pool");
    let args: Vec<String> = std::env::args().collect();
    let mut formats = vec![WeightFormat::F32];
    for f in args.get(1).map_or("q4_1", |s| s).split(',') {
        let f = WeightFormat::parse(f).expect("a format");
        if f != WeightFormat::F32 {
            formats.push(f);
        }
    }
    let rows: usize = args.get(2).map_or(3072, |s| s.parse().expect("rows"));
    let cols: usize = args.get(3).map_or(576, |s| s.parse().expect("cols"));
    let stream: usize = args.get(4).map_or(96 << 20, |s| s.parse().expect("bytes"));
    let w = WeightDist::Gaussian.sample(rows, cols, 1);
    let x = normal_f32(&mut rng(2), batch * cols, 1.0);
    let only = std::env::var("ISA").ok();
    // (label, variant, prepared copies, bytes of one copy)
    let mut runs: Vec<(String, MatVecVariant, Vec<Prepared>, usize)> = vec![];
    for &fmt in &formats {
        let m = QuantMatrix::quantize(fmt, rows, cols, &w).expect("finite");
        let bytes = m.bytes().len();
        let copies = stream.div_ceil(bytes).max(1);
        let ms: Vec<Arc<QuantMatrix>> = (0..copies).map(|_| Arc::new(m.clone())).collect();
        for isa in Isa::available() {
            if only.as_deref().is_some_and(|o| o != isa.name()) {
                continue;
            }
            let mut vs = vec![MatVecVariant::Fused(Some(isa))];
            if fmt != WeightFormat::F32 {
                vs.extend([
                    MatVecVariant::FusedQ8(Some(isa)),
                    MatVecVariant::Packed(Some(isa)),
                ]);
            }
            for v in vs {
                if kernel_quant::supports(v, fmt).is_err() {
                    continue;
                }
                let p = ms
                    .iter()
                    .map(|m| Prepared::new(m.clone(), v).expect("prepares"))
                    .collect();
                runs.push((format!("{fmt} {v:?}"), v, p, bytes));
            }
        }
    }
    rayon::scope(|_| {
        let mut y = vec![0.0f32; batch * rows];
        let mut best = vec![f64::INFINITY; runs.len()];
        for _ in 0..9 {
            for (i, (_, v, ps, _)) in runs.iter().enumerate() {
                let reps = (3 * stream / ps.len().max(1) / ps[0].byte_len()).max(1);
                let t = Instant::now();
                for _ in 0..reps {
                    for p in ps {
                        p.matmul(&x, batch, &mut y, *v).expect("valid");
                    }
                }
                best[i] = best[i].min(t.elapsed().as_secs_f64() / (reps * ps.len()) as f64);
            }
        }
        let f32_best = runs
            .iter()
            .zip(&best)
            .filter(|((l, ..), _)| l.starts_with("f32 "))
            .map(|(_, &t)| t)
            .fold(f64::INFINITY, f64::min);
        for ((label, _, ps, bytes), dt) in runs.iter().zip(best) {
            println!(
                "{label} {rows}x{cols} b{batch} x{} T={threads}: {:.1} us, {:.2} GB/s, {:.2}x f32",
                ps.len(),
                dt * 1e6,
                *bytes as f64 / dt / 1e9,
                f32_best / dt
            );
        }
    });
}
