//! A k-token verification step over the 1-token decode step, timed alternately in one loop
//! (not a benchmark of record: the `verify_cost` experiment is) — a quick probe to profile
//! (`perf record`) or to compare two builds without the experiment's roofline and checks:
//! `cargo run --release -p models --example step_rate -- MODEL [k,k,..] [rounds]`, env
//! WORKBENCH_ISA caps the tier, THREADS sets the pool (default 2), CONTEXT the prompt
//! (default 64). Paged attention and the packed product, as `harness generate` runs them.
//! Prints the median of each step and its cost in 1-token steps timed in the same rounds.

use models::speculative::cost::ScratchStep;
use models::{load, LoadOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(model) = args.get(1) else {
        eprintln!("usage: step_rate MODEL [k,k,..] [rounds]");
        std::process::exit(2);
    };
    let number = |s: &str, what: &str| -> usize {
        s.parse().unwrap_or_else(|_| {
            eprintln!("{what} '{s}' is not a whole number");
            std::process::exit(2)
        })
    };
    let ks: Vec<usize> = args
        .get(2)
        .map_or("8", |s| s)
        .split(',')
        .map(|k| number(k, "k"))
        .collect();
    let rounds = args.get(3).map_or(40, |s| number(s, "rounds"));
    let env =
        |name: &str, default: usize| std::env::var(name).map_or(default, |v| number(&v, name));
    let (threads, context) = (env("THREADS", 2), env("CONTEXT", 64));
    if let Err(e) = kernel_cpu::isa::cap_from_env() {
        eprintln!("{e}");
        std::process::exit(2);
    }
    let opts = LoadOptions {
        attention: "paged".into(),
        matmul: kernel_quant::MatVecVariant::Packed(None),
        ..Default::default()
    };
    let m = match load(model, &opts) {
        Ok(l) => l.model,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    let kmax = ks.iter().copied().max().unwrap_or(1);
    let ids: Vec<u32> = (0..context + kmax)
        .map(|i| ((i * 7919) % 1000 + 10) as u32)
        .collect();
    let result = pool.install(|| {
        kernel_cpu::team::with_team(|| -> Result<Vec<Vec<f64>>, kernel_common::KernelError> {
            let mut s = ScratchStep::new(&m, ids, context)?;
            let mut times: Vec<Vec<f64>> = vec![vec![]; ks.len() + 1];
            for _ in 0..rounds {
                times[0].push(s.step(1)?.0);
                for (i, &k) in ks.iter().enumerate() {
                    times[i + 1].push(s.step(k)?.0);
                }
            }
            Ok(times)
        })
    });
    let mut times = match result {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut median = |i: usize| {
        let v = &mut times[i];
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let one = median(0);
    println!("context {context}, {threads} threads, {rounds} rounds");
    println!("k=1 {:.3} ms", one * 1e3);
    for (i, &k) in ks.iter().enumerate() {
        let t = median(i + 1);
        println!("k={k} {:.3} ms = {:.2} steps", t * 1e3, t / one);
    }
}
