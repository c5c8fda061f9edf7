//! `harness check --family paged`: random paged batches (1–4 sequences, block sizes 1..=256,
//! spare blocks) then the edge cases (lengths 54/97/577 at block size 1, a pool of > 32768
//! blocks, NaN in unused slots), paged decode with split-KV off, auto and a random partition
//! against the gather + attention oracle; plus gather(append(x)) == x exactly per case, the
//! pool built by the CUDA append kernel under `--device cuda`.

use crate::checking::Ctx;
use crate::error::Result;
use attention_kernels::{AttentionInputs, AttentionShape};
use kernel_common::inputs::{derive_seed, rng};
use kernel_common::{DType, Device, ErrorStats};
use paged_kernels::adapter::build_pool;
use paged_kernels::{pool::gather, PagedCaseSpec, SplitKv};
use rand::Rng;

/// Random paged batches, then the edge cases, each under every split policy; plus an
/// append round trip (gather(append(x)) == x exactly) per case.
fn paged_cases(cases: usize, seed: u64, dtype: DType) -> Vec<PagedCaseSpec> {
    let mut r = rng(seed ^ 0x9A6E);
    let mut out = vec![];
    for c in 0..cases {
        let seqs = r.gen_range(1..=4);
        out.push(PagedCaseSpec {
            context_lens: (0..seqs).map(|_| r.gen_range(1..=1200)).collect(),
            block_size: [1, 16, 32, 256, r.gen_range(1..=256)][c % 5],
            kv_heads: [1, 2, 4][r.gen_range(0..3)],
            group: r.gen_range(1..=4),
            head_dim: [64, 128, r.gen_range(1..=160)][r.gen_range(0..3)],
            q_len: 1,
            dtype,
            spare_blocks: r.gen_range(0..8),
            seed: derive_seed(seed, c as u64),
        });
        let last = out.last_mut().expect("just pushed");
        last.q_len = r
            .gen_range(1..=4)
            .min(*last.context_lens.iter().min().expect("seqs >= 1"));
    }
    let edge = |lens: Vec<usize>,
                block_size: usize,
                kv_heads: usize,
                group: usize,
                spare_blocks: usize| PagedCaseSpec {
        context_lens: lens,
        block_size,
        kv_heads,
        group,
        head_dim: 128,
        q_len: 1,
        dtype,
        spare_blocks,
        seed: derive_seed(seed, 1 << 20),
    };
    out.push(edge(vec![54, 97, 577], 1, 1, 8, 5));
    out.push(edge(vec![54, 97, 577], 16, 8, 1, 3));
    out.push(edge(vec![577, 1], 256, 2, 4, 1));
    // More than 32768 blocks: sequence blocks land at ids beyond i16/u16 and 2^15 ranges.
    out.push(PagedCaseSpec {
        head_dim: 64,
        ..edge(vec![300, 97], 1, 1, 4, 40_000)
    });
    out
}

/// Paged decode under every split policy on every case, and the append round trip.
pub fn check(ctx: &mut Ctx) -> Result<()> {
    for &dtype in &ctx.opts.dtypes.clone() {
        for (case, spec) in paged_cases(ctx.opts.cases, ctx.opts.seed, dtype)
            .iter()
            .enumerate()
        {
            let c = spec.build()?;
            let want = c.reference()?;
            let part = 1 + (spec.seed % 300) as usize;
            let cuda = matches!(ctx.opts.device, Device::Cuda(_));
            for split in [SplitKv::Off, SplitKv::Auto, SplitKv::Tokens(part)] {
                let got = if cuda {
                    paged_kernels::cuda::paged_decode_cuda(&c.shape, &c.batch, &c.pool, &c.q, split)
                        .map(|b| b.to_f32())
                } else {
                    c.decode(split)
                };
                let outcome = got
                    .map(|got| ErrorStats::compare(&got, &want))
                    .map_err(|e| e.to_string());
                let prefix = if cuda {
                    "cuda_paged_decode"
                } else {
                    "paged_decode"
                };
                let name = match split {
                    SplitKv::Off => prefix.to_string(),
                    SplitKv::Auto => format!("{prefix}:split=auto"),
                    SplitKv::Tokens(n) => format!("{prefix}:split={n}"),
                };
                ctx.record("paged", case, &name, dtype, c.label(), spec.seed, outcome)?;
            }
            // Append round trip from contiguous K/V through shuffled blocks and back.
            let kv_len = spec.context_lens[0];
            let shape = AttentionShape::new(
                2,
                spec.kv_heads * spec.group,
                spec.kv_heads,
                1,
                kv_len,
                spec.head_dim,
                true,
            );
            let inputs = AttentionInputs::random(&shape, dtype, spec.seed);
            let (pool, batch) = if cuda {
                super::device_pool::build_pool_on_device(
                    &shape,
                    &inputs,
                    spec.block_size,
                    spec.seed,
                )?
            } else {
                build_pool(&shape, &inputs, spec.block_size, spec.seed)?
            };
            let per = shape.kv_heads * kv_len * shape.head_dim;
            let mut exact = true;
            for (b, table) in batch.block_tables.iter().enumerate() {
                let (k, v) = gather(&pool, table, kv_len)?;
                exact &= k == inputs.k.slice(b * per, per) && v == inputs.v.slice(b * per, per);
            }
            let stats = ErrorStats {
                max_abs: if exact { 0.0 } else { f64::INFINITY },
                rel_l2: if exact { 0.0 } else { f64::INFINITY },
                nmse: if exact { 0.0 } else { f64::INFINITY },
                non_finite: 0,
                count: 2 * per,
            };
            ctx.record(
                "paged",
                case,
                if cuda {
                    "cuda_append_roundtrip"
                } else {
                    "append_roundtrip"
                },
                dtype,
                format!("kv{kv_len} bs{}", spec.block_size),
                spec.seed,
                Ok(stats),
            )?;
        }
    }
    Ok(())
}
