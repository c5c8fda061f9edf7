//! Criterion benches of the paged KV cache: paged decode (8 sequences × 4096 tokens, 8 KV
//! heads, group 4, d128, f32; block sizes 16/32/128, split-KV off and auto), the same at block
//! size 16 with a sliding window of 512 or a logit soft-cap of 50 against neither, and the
//! append kernel (16 new tokens of one sequence written into a shuffled block pool), and the
//! split policies on one SmolLM2-shaped decode step (1 sequence × 1907 tokens, 3 KV heads,
//! group 3, d64: what one layer of `harness generate` runs after a long prompt).

use std::collections::HashSet;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use kernel_common::inputs::{normal_buffer, rng};
use kernel_common::{Buffer, DType};
use kernel_paged::{append, paged_decode, PagedCase, PagedCaseSpec, SplitKv};

const SEQS: usize = 8;
const CONTEXT: usize = 4096;
const KV_HEADS: usize = 8;
const GROUP: usize = 4;
const HEAD_DIM: usize = 128;
const F32_BYTES: u64 = 4;

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

/// Bytes of K plus V for `tokens` positions of every KV head in f32.
fn kv_bytes(tokens: usize) -> u64 {
    tokens as u64 * (KV_HEADS * HEAD_DIM) as u64 * F32_BYTES * 2
}

/// One bench of `paged_decode` on `case` with `split`, output into `out`.
fn bench_decode(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    id: String,
    case: &PagedCase,
    out: &mut Buffer,
    split: SplitKv,
) {
    group.bench_function(id, |b| {
        b.iter(|| paged_decode(&case.shape, &case.batch, &case.pool, &case.q, out, split).unwrap())
    });
}

fn bench_paged_decode(c: &mut Criterion) {
    let mut group = configure(c, "paged_decode");
    for block_size in [16, 32, 128] {
        let case = PagedCaseSpec {
            context_lens: vec![CONTEXT; SEQS],
            block_size,
            kv_heads: KV_HEADS,
            group: GROUP,
            head_dim: HEAD_DIM,
            q_len: 1,
            dtype: DType::F32,
            spare_blocks: 0,
            seed: 0x9A6E + block_size as u64,
        }
        .build()
        .unwrap();
        let mut out = Buffer::poisoned(DType::F32, case.q.len());
        // Decode is memory-bound: throughput is every sequence's K and V read once.
        group.throughput(Throughput::Bytes(kv_bytes(case.batch.total_tokens())));
        for (split, name) in [(SplitKv::Off, "off"), (SplitKv::Auto, "auto")] {
            let id = format!("bs{block_size}/split_{name}");
            bench_decode(&mut group, id, &case, &mut out, split);
        }
    }
    group.finish();
}

fn bench_window_and_softcap(c: &mut Criterion) {
    let mut group = configure(c, "paged_decode_options");
    let mut case = PagedCaseSpec {
        context_lens: vec![CONTEXT; SEQS],
        block_size: 16,
        kv_heads: KV_HEADS,
        group: GROUP,
        head_dim: HEAD_DIM,
        q_len: 1,
        dtype: DType::F32,
        spare_blocks: 0,
        seed: 0x9A6E + 16,
    }
    .build()
    .unwrap();
    let plain = case.shape;
    let mut out = Buffer::poisoned(DType::F32, case.q.len());
    for (options, name) in [
        (plain, "none"),
        (plain.with_window(Some(512)), "window512"),
        (plain.with_softcap(Some(50.0)), "softcap50"),
    ] {
        case.shape = options;
        // Throughput: the K and V rows the window reaches, read once.
        let seen = options.visible_range(CONTEXT).len();
        group.throughput(Throughput::Bytes(kv_bytes(seen * SEQS)));
        for (split, split_name) in [(SplitKv::Off, "off"), (SplitKv::Auto, "auto")] {
            let id = format!("bs16/split_{split_name}/{name}");
            bench_decode(&mut group, id, &case, &mut out, split);
        }
    }
    group.finish();
}

fn bench_split_policies(c: &mut Criterion) {
    let mut group = configure(c, "paged_decode_split");
    let case = PagedCaseSpec {
        context_lens: vec![1907],
        block_size: 16,
        kv_heads: 3,
        group: 3,
        head_dim: 64,
        q_len: 1,
        dtype: DType::F32,
        spare_blocks: 0,
        seed: 0x5177,
    }
    .build()
    .unwrap();
    let mut out = Buffer::poisoned(DType::F32, case.q.len());
    for (split, name) in [
        (SplitKv::Off, "off"),
        (SplitKv::Auto, "auto"),
        (SplitKv::Context, "ctx"),
        (SplitKv::Tokens(64), "64"),
    ] {
        let id = format!("ctx1907/split_{name}");
        bench_decode(&mut group, id, &case, &mut out, split);
    }
    group.finish();
}

fn bench_append(c: &mut Criterion) {
    const NEW: usize = 16;
    // 1020 leaves 4 free slots in the last block at both block sizes below, so the 16 new
    // tokens fill the tail of a partly used block and spill into a fresh one.
    const CTX: usize = 1020;
    let mut group = configure(c, "append");
    for block_size in [16, 128] {
        let mut case = PagedCaseSpec {
            context_lens: vec![CTX],
            block_size,
            kv_heads: KV_HEADS,
            group: GROUP,
            head_dim: HEAD_DIM,
            q_len: 1,
            dtype: DType::F32,
            spare_blocks: 4,
            seed: 0xA99E + block_size as u64,
        }
        .build()
        .unwrap();
        let layout = case.pool.layout;
        // Extend the sequence's table with spare (never used) physical blocks so it covers
        // positions CTX..CTX+NEW.
        let mut table = case.batch.block_tables[0].clone();
        let used: HashSet<u32> = table.iter().copied().collect();
        let extra = layout.blocks_for(CTX + NEW) - table.len();
        table.extend(
            (0..layout.num_blocks as u32)
                .filter(|b| !used.contains(b))
                .take(extra),
        );
        assert_eq!(table.len(), layout.blocks_for(CTX + NEW));
        let mut r = rng(0xA99E);
        let k_new = normal_buffer(&mut r, DType::F32, KV_HEADS * NEW * HEAD_DIM);
        let v_new = normal_buffer(&mut r, DType::F32, KV_HEADS * NEW * HEAD_DIM);
        // Throughput: the K and V bytes written (the same slots are rewritten every iteration).
        group.throughput(Throughput::Bytes(kv_bytes(NEW)));
        group.bench_function(format!("bs{block_size}/ctx{CTX}+{NEW}"), |b| {
            b.iter(|| append(&mut case.pool, &table, CTX, &k_new, &v_new).unwrap())
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_paged_decode,
    bench_window_and_softcap,
    bench_split_policies,
    bench_append
);
criterion_main!(benches);
