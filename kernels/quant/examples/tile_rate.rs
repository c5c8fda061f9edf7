//! The packed tiles' compute rate by batch, from cache (not a benchmark of record: the
//! `verify_cost` and `isa_gemv` experiments are). One small matrix that stays in L2 is
//! multiplied by B = 1..=Bmax activations, best of many rounds, on one thread, so the figure is
//! int8 MACs per second of the kernel itself — what a k-token step's products can reach once
//! the weights have been read — free of this shared VM's bandwidth swings.
//! `cargo run --release -p kernel-quant --example tile_rate -- q4_0,q8_0 [rows] [cols] [Bmax]`;
//! env ISA = one tier (default: every tier this CPU has), BATCHES = a list instead of 1..=Bmax
//! (e.g. 64,512 for a prompt: Bmax then only sizes the activations).

use kernel_common::inputs::{normal_f32, rng};
use kernel_quant::packed::{matmul, PackedMatrix};
use kernel_quant::{Isa, QuantMatrix, WeightDist, WeightFormat};
use std::time::Instant;

fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("one pool");
    // On the pool's thread, inside a team, as in a forward pass (from the main thread every
    // call would pay rayon's cross-thread wake-up).
    pool.install(|| kernel_cpu::team::with_team(run));
}

fn run() {
    let args: Vec<String> = std::env::args().collect();
    let formats: Vec<WeightFormat> = args
        .get(1)
        .map_or("q4_0", |s| s)
        .split(',')
        .map(|f| WeightFormat::parse(f).expect("a format"))
        .collect();
    let arg = |i: usize, d: usize| args.get(i).map_or(d, |s| s.parse().expect("a number"));
    let (rows, cols, bmax) = (arg(2, 256), arg(3, 2048), arg(4, 16));
    let tiers: Vec<Isa> = match std::env::var("ISA") {
        Ok(t) => vec![Isa::parse(&t).expect("a tier")],
        Err(_) => kernel_cpu::isa::runnable(),
    };
    let batches: Vec<usize> = match std::env::var("BATCHES") {
        Ok(list) => list
            .split(',')
            .map(|b| b.parse().expect("a batch"))
            .collect(),
        Err(_) => (1..=bmax).collect(),
    };
    let x = normal_f32(&mut rng(7), bmax * cols, 1.0);
    println!("format tier B µs/call GMAC/s");
    for f in formats {
        let w = WeightDist::Gaussian.sample(rows, cols, 3);
        let p = PackedMatrix::pack(&QuantMatrix::quantize(f, rows, cols, &w).expect("quantise"))
            .expect("pack");
        for &isa in &tiers {
            for &b in &batches {
                let mut y = vec![0.0f32; b * rows];
                let mut best = f64::INFINITY;
                for _ in 0..(2000 / b).clamp(3, 200) {
                    let t = Instant::now();
                    for _ in 0..10 {
                        matmul(&p, &x[..b * cols], b, &mut y, isa).expect("matmul");
                    }
                    best = best.min(t.elapsed().as_secs_f64() / 10.0);
                }
                let macs = (b * rows * cols) as f64;
                println!("{f} {isa} {b} {:.2} {:.1}", best * 1e6, macs / best / 1e9);
            }
        }
    }
}
