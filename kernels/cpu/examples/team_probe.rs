//! How much a parallel region costs: rayon fork-join vs the spinning team (`team`), for
//! regions of 64 tasks of ~`work` ns each with `gap` µs of serial work between them.
//! `cargo run --release -p kernel-cpu --example team_probe`.
use kernel_cpu::team;
use std::time::Instant;

/// About `ns` nanoseconds of dependent arithmetic (no clock reads inside tasks).
fn spin_ns(ns: u64) {
    let mut x = 1u64;
    for _ in 0..ns * 3 / 4 {
        x = std::hint::black_box(x.wrapping_mul(3).wrapping_add(1));
    }
    std::hint::black_box(x);
}

fn main() {
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build_global()
        .expect("pool");
    rayon::scope(|_| {
        for (work, gap) in [(0u64, 0u64), (200, 0), (200, 5)] {
            let n = 3000;
            let body = || {
                let t = Instant::now();
                for _ in 0..n {
                    team::parallel_for(64, |_| spin_ns(work));
                    let t = Instant::now();
                    while t.elapsed().as_nanos() < (gap * 1000) as u128 {}
                }
                t.elapsed().as_secs_f64() / n as f64 * 1e6
            };
            let t = Instant::now();
            for _ in 0..n {
                for _ in 0..64 {
                    spin_ns(work);
                }
            }
            let serial = t.elapsed().as_secs_f64() / n as f64 * 1e6;
            let ideal = serial / 2.0 + gap as f64;
            let plain = body();
            let teamed = team::with_team(body);
            println!(
                "tasks 64 x {work} ns, gap {gap} us: ideal {ideal:.2} us/region; rayon {plain:.2}, team {teamed:.2}"
            );
        }
    });
}
