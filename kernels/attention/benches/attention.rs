//! Criterion benches of the CPU attention variants (`naive`, `flash2`): causal GQA prefill
//! (b1, 32/8 heads, d128, seq 512 and 2048; f32, plus f16 flash2 at 512) and decode
//! (q_len 1, b8, 32/8 heads, kv 4096); and flash2 at a 4096 context with a sliding window of
//! 512 or a logit soft-cap of 50 against neither (decode as above; prefill b1, 8/2 heads).
//! Only `prepared.run` is timed.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use kernel_attention::{AttentionInputs, AttentionKernel, AttentionShape};
use kernel_common::{Buffer, DType, VariantSpec};

const SEED: u64 = 0xA77E;

fn kernel(spec: &str) -> Box<dyn AttentionKernel> {
    kernel_attention::kernel_from_spec(&VariantSpec::parse(spec).unwrap())
        .unwrap()
        .unwrap_or_else(|| panic!("{spec} is not an kernel-attention variant"))
}

/// Causal prefill: batch 1, 32 query heads over 8 KV heads, head_dim 128.
fn prefill(seq: usize) -> AttentionShape {
    AttentionShape::new(1, 32, 8, seq, seq, 128, true)
}

/// Decode: one new token for each of 8 sequences with 4096 cached positions.
fn decode() -> AttentionShape {
    AttentionShape::new(8, 32, 8, 1, 4096, 128, true)
}

/// Prepares `kernel` on seeded inputs outside the timed loop and times `run`.
fn bench_case(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    kernel: &dyn AttentionKernel,
    id: &str,
    shape: &AttentionShape,
    dtype: DType,
    throughput: Throughput,
) {
    let inputs = AttentionInputs::random(shape, dtype, SEED);
    let mut prepared = kernel.prepare(shape, &inputs).unwrap();
    let mut out = Buffer::poisoned(dtype, shape.q_elems());
    group.throughput(throughput);
    group.bench_function(id, |b| b.iter(|| prepared.run(&mut out).unwrap()));
}

fn configure<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    group
}

fn bench_kernel(c: &mut Criterion, spec: &str) {
    let kernel = kernel(spec);
    let mut group = configure(c, spec);
    for seq in [512, 2048] {
        let shape = prefill(seq);
        // Prefill is compute-bound: the "elements" criterion reports per second are useful
        // FLOPs (`AttentionShape::flops`), so its elem/s figure reads as FLOP/s.
        bench_case(
            &mut group,
            kernel.as_ref(),
            &format!("prefill_f32/{seq}"),
            &shape,
            DType::F32,
            Throughput::Elements(shape.flops()),
        );
    }
    if spec == "flash2" {
        let shape = prefill(512);
        // Elements are FLOPs here too.
        bench_case(
            &mut group,
            kernel.as_ref(),
            "prefill_f16/512",
            &shape,
            DType::F16,
            Throughput::Elements(shape.flops()),
        );
    }
    let shape = decode();
    // Decode is memory-bound: throughput is the variant's compulsory traffic in bytes.
    bench_case(
        &mut group,
        kernel.as_ref(),
        "decode_f32/b8_kv4096",
        &shape,
        DType::F32,
        Throughput::Bytes(kernel.cost(&shape, DType::F32).bytes),
    );
    group.finish();
}

fn naive(c: &mut Criterion) {
    bench_kernel(c, "naive");
}

fn flash2(c: &mut Criterion) {
    bench_kernel(c, "flash2");
}

/// flash2 at a 4096-token context: no options, a 512-token sliding window, a soft-cap of 50.
fn flash2_options(c: &mut Criterion) {
    let kernel = kernel("flash2");
    let mut group = configure(c, "flash2_options");
    let prefill = AttentionShape::new(1, 8, 2, 4096, 4096, 128, true);
    for (base, what) in [
        (decode(), "decode_f32/b8_kv4096"),
        (prefill, "prefill_f32/h8_4096"),
    ] {
        for (shape, name) in [
            (base, "none"),
            (base.with_window(Some(512)), "window512"),
            (base.with_softcap(Some(50.0)), "softcap50"),
        ] {
            // Decode: the bytes of the K/V rows some query sees; prefill: the useful FLOPs
            // (as elements), both of which fall with the window.
            let throughput = if shape.q_len == 1 {
                Throughput::Bytes(kernel.cost(&shape, DType::F32).bytes)
            } else {
                Throughput::Elements(shape.flops())
            };
            bench_case(
                &mut group,
                kernel.as_ref(),
                &format!("{what}/{name}"),
                &shape,
                DType::F32,
                throughput,
            );
        }
    }
    group.finish();
}

criterion_group!(benches, naive, flash2, flash2_options);
criterion_main!(benches);
