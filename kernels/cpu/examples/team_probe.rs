//! How much a parallel region costs: rayon fork-join vs the spinning team (`team`), for
//! regions of 64 tasks of ~`work` ns each with `gap` µs of serial work between them; and how
//! long a worker takes to join a region after an idle gap (spinning below `SPIN_BUDGET`,
//! asleep above it): what `team::SPIN_BUDGET` is chosen from.
//! `cargo run --release -p kernel-cpu --example team_probe`.
use kernel_cpu::team;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

thread_local! {
    static IS_LEADER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Median and 90th percentile of the time from publishing a region to a worker's first task
/// in it, after `gap` of idleness (regions the leader finished alone are counted as the
/// whole region time, a lower bound).
fn join_latency(gap: Duration) -> (f64, f64) {
    let mut lat = Vec::new();
    team::with_team(|| {
        IS_LEADER.with(|l| l.set(true));
        for _ in 0..200 {
            let t = Instant::now();
            while t.elapsed() < gap {
                std::hint::spin_loop();
            }
            let first = AtomicU64::new(u64::MAX);
            let start = Instant::now();
            team::parallel_for(64, |_| {
                if !IS_LEADER.with(|l| l.get()) {
                    first.fetch_min(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                }
                spin_ns(5000);
            });
            let whole = start.elapsed().as_nanos() as u64;
            lat.push(first.load(Ordering::Relaxed).min(whole) as f64 / 1e3);
        }
        IS_LEADER.with(|l| l.set(false));
    });
    lat.sort_by(f64::total_cmp);
    (lat[lat.len() / 2], lat[lat.len() * 9 / 10])
}

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
        println!(
            "a worker joins a region (median, p90 us) after an idle gap (spin budget {} us):",
            team::SPIN_BUDGET.as_micros()
        );
        for gap_us in [5u64, 50, 150, 400, 2000] {
            let (med, p90) = join_latency(Duration::from_micros(gap_us));
            println!("  gap {gap_us:>5} us: {med:.1}, {p90:.1}");
        }
        let st = team::stats();
        println!(
            "team: {} regions, {} solo, {} stalls, {} parks",
            st.regions, st.solo_regions, st.stalls, st.parks
        );
    });
}
