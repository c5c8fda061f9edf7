//! Criterion benches of the MoE layer (router + experts) at 1024 tokens, d_model 512,
//! d_ff 1024, 8 experts, top-2, capacity factor 1.25: grouped vs naive. The harness's
//! `moe_capacity` experiment is the measured record; these are for quick iteration
//! (`cargo bench -p kernel-moe`).

use criterion::{criterion_group, criterion_main, Criterion};
use kernel_common::inputs::{normal_f32, rng};
use kernel_moe::{
    moe_forward, Capacity, ExpertVariant, MoeConfig, MoeWeights, Priority, WeightNorm,
};

fn bench(c: &mut Criterion) {
    let cfg = MoeConfig::token_choice(
        1024,
        512,
        1024,
        8,
        2,
        Priority::Score,
        WeightNorm::Renormalize,
        Capacity::Factor(1.25),
    );
    let w = MoeWeights::random(&cfg, 0.5, 1);
    let x = normal_f32(&mut rng(2), cfg.tokens * cfg.d_model, 1.0);
    let mut out = vec![0.0f32; x.len()];
    let mut group = c.benchmark_group("moe_t1024_d512_ff1024_e8_k2");
    group.sample_size(10);
    for (name, v) in [
        ("grouped", ExpertVariant::Grouped),
        ("naive", ExpertVariant::Naive),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| moe_forward(&cfg, &w, &x, v, &mut out).expect("valid shapes"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
