//! `harness check --family paged`: random paged batches (1–4 sequences, block sizes 1..=256,
//! spare blocks) then the edge cases (lengths 54/97/577 at block size 1, a pool of > 32768
//! blocks, NaN in unused slots), paged decode with split-KV off, auto and a random partition
//! against the gather + attention oracle; plus gather(append(x)) == x exactly per case, the
//! pool built by the CUDA append kernel under `--device cuda`. On the CPU, the same cases over
//! a `KvCache` in each narrow or progressive format in turn (f16, bf16, FP8 E4M3, int8, per
//! block or per head, progressive int8/FP8 past a window; one token in eight an 8× outlier),
//! paged decode reading the codes directly against the f64 reference of the cache as stored.
//! A third of the random cases and four edge cases take a sliding window (1, a block − 1,
//! random, past the context; the pool slots before it NaN, never read) and some a logit
//! soft-cap.

use crate::checking::Ctx;
use crate::error::Result;
use kernel_attention::shape::options_label;
use kernel_attention::{AttentionInputs, AttentionShape};
use kernel_common::inputs::{derive_seed, rng};
use kernel_common::{tolerance, Buffer, DType, Device, ErrorStats};
use kernel_paged::adapter::build_pool;
use kernel_paged::cuda::KeyLoop;
use kernel_paged::{pool::gather, CacheCaseSpec, KvCacheFormat, PagedCase, PagedCaseSpec, SplitKv};
use rand::Rng;

/// A case: what to build, and the window and soft-cap its shape takes.
struct PagedCheck {
    spec: PagedCaseSpec,
    window: Option<usize>,
    softcap: Option<f32>,
}

/// Random paged batches, then the edge cases, each under every split policy; plus an
/// append round trip (gather(append(x)) == x exactly) per case.
fn paged_cases(cases: usize, seed: u64, dtype: DType) -> Vec<PagedCheck> {
    let mut r = rng(seed ^ 0x9A6E);
    let mut out = vec![];
    let (mut windows, mut softcaps) = (vec![], vec![]);
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
        let (ctx, bs) = (last.context_lens[0], last.block_size);
        windows.push(
            r.gen_bool(1.0 / 3.0)
                .then(|| [1, bs.max(2) - 1, r.gen_range(1..=ctx + 5), ctx + 5][r.gen_range(0..4)]),
        );
        softcaps.push(
            r.gen_bool(0.25)
                .then(|| [50.0, r.gen_range(0.5f32..10.0)][r.gen_range(0..2)]),
        );
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
    windows.extend([None; 4]);
    softcaps.extend([None; 4]);
    // Sliding windows: inside a block, a block − 1 with a cap, across blocks with three new
    // tokens, a window of 1; the pool slots before each window NaN.
    for (spec, window, softcap) in [
        (edge(vec![577, 54], 16, 2, 4, 2), 5, None),
        (edge(vec![97, 577], 16, 1, 8, 1), 15, Some(50.0)),
        (
            PagedCaseSpec {
                q_len: 3,
                ..edge(vec![577, 300], 32, 2, 2, 3)
            },
            100,
            Some(2.0),
        ),
        (edge(vec![54], 1, 4, 1, 0), 1, None),
    ] {
        out.push(spec);
        windows.push(Some(window));
        softcaps.push(softcap);
    }
    out.into_iter()
        .zip(windows.into_iter().zip(softcaps))
        .map(|(spec, (window, softcap))| PagedCheck {
            spec,
            window,
            softcap,
        })
        .collect()
}

/// NaN in K and V of every pool slot before the window of every sequence of `c` (positions
/// no row sees): the decode must never read them.
fn poison_before_windows(c: &mut PagedCase) {
    let l = c.pool.layout;
    let (mut k, mut v) = (c.pool.k.to_f32(), c.pool.v.to_f32());
    for (&ctx, table) in c.batch.context_lens.iter().zip(&c.batch.block_tables) {
        for pos in 0..c.shape.visible_range(ctx).start {
            for h in 0..l.kv_heads {
                let at = l.position_offset(table, h, pos);
                k[at..at + l.head_dim].fill(f32::NAN);
                v[at..at + l.head_dim].fill(f32::NAN);
            }
        }
    }
    let dt = c.pool.dtype();
    c.pool.k = Buffer::from_f32(dt, &k);
    c.pool.v = Buffer::from_f32(dt, &v);
}

/// The case's label with its window and cap.
fn label(base: String, check: &PagedCheck) -> String {
    format!("{base}{}", options_label(check.window, check.softcap))
}

/// The KV-cache formats the cache cases take in turn.
const CACHE_FORMATS: [&str; 9] = [
    "f16",
    "bf16",
    "fp8",
    "int8",
    "fp8:per_head",
    "int8:per_head",
    "progressive:window=64,old=int8",
    "progressive:window=40,old=fp8,recent=bf16",
    "f32",
];

/// The split policies of a case, each with its variant name.
fn splits(prefix: &str, seed: u64) -> [(SplitKv, String); 4] {
    let part = 1 + (seed % 300) as usize;
    [
        (SplitKv::Off, prefix.to_string()),
        (SplitKv::Auto, format!("{prefix}:split=auto")),
        (SplitKv::Context, format!("{prefix}:split=ctx")),
        (SplitKv::Tokens(part), format!("{prefix}:split={part}")),
    ]
}

/// Paged decode over a `KvCache` in each format in turn, every split policy, against the
/// f64 reference of the cache as stored (its tolerance scaled to the reference's size: the
/// outliers make some outputs large).
fn check_cache_formats(ctx: &mut Ctx, checks: &[PagedCheck]) -> Result<()> {
    for (case, check) in checks.iter().enumerate() {
        let spec = &check.spec;
        let format = KvCacheFormat::parse(CACHE_FORMATS[case % CACHE_FORMATS.len()])?;
        let mut c = CacheCaseSpec {
            context_lens: spec.context_lens.clone(),
            block_size: spec.block_size,
            kv_heads: spec.kv_heads,
            group: spec.group,
            head_dim: spec.head_dim,
            q_len: spec.q_len,
            format,
            spare_blocks: spec.spare_blocks,
            outlier: 8.0,
            seed: spec.seed,
        }
        .build()?;
        c.shape = c
            .shape
            .with_window(check.window)
            .with_softcap(check.softcap);
        let want = c.reference()?;
        let tol = tolerance(DType::F32).scaled_to(&want);
        for (split, name) in splits("paged_decode_cache", spec.seed) {
            let outcome = c
                .decode(split)
                .map(|got| ErrorStats::compare(&got, &want))
                .map_err(|e| e.to_string());
            ctx.record_with(
                "paged",
                case,
                &name,
                DType::F32,
                tol,
                label(c.label(), check),
                spec.seed,
                outcome,
            )?;
        }
    }
    Ok(())
}

/// Paged decode under every split policy on every case, and the append round trip; on the
/// CPU, the cases again over a cache in each format.
pub fn check(ctx: &mut Ctx) -> Result<()> {
    let cuda = matches!(ctx.opts.device, Device::Cuda(_));
    if !cuda {
        check_cache_formats(ctx, &paged_cases(ctx.opts.cases, ctx.opts.seed, DType::F32))?;
    }
    for &dtype in &ctx.opts.dtypes.clone() {
        for (case, check) in paged_cases(ctx.opts.cases, ctx.opts.seed, dtype)
            .iter()
            .enumerate()
        {
            let spec = &check.spec;
            let mut c = spec.build()?;
            c.shape = c
                .shape
                .with_window(check.window)
                .with_softcap(check.softcap);
            poison_before_windows(&mut c);
            let want = c.reference()?;
            let prefix = if cuda {
                "cuda_paged_decode"
            } else {
                "paged_decode"
            };
            // On CUDA each split under both key loops (the plain one and `pipe=1`), named as
            // `cuda_paged` names them (`KeyLoop::param`).
            let loops: &[KeyLoop] = if cuda {
                &[KeyLoop::Plain(1), KeyLoop::Pipelined]
            } else {
                &[KeyLoop::Plain(1)]
            };
            let runs = splits(prefix, spec.seed)
                .into_iter()
                .flat_map(|(split, name)| {
                    loops.iter().map(move |&keys| {
                        let param = keys.param();
                        let name = match param.strip_prefix(',') {
                            Some(p) if !name.contains(':') => format!("{name}:{p}"),
                            _ => format!("{name}{param}"),
                        };
                        (split, keys, name)
                    })
                });
            for (split, keys, name) in runs {
                let got = if cuda {
                    kernel_paged::cuda::paged_decode_cuda(
                        &c.shape, &c.batch, &c.pool, &c.q, split, keys,
                    )
                    .map(|b| b.to_f32())
                } else {
                    c.decode(split)
                };
                let outcome = got
                    .map(|got| ErrorStats::compare(&got, &want))
                    .map_err(|e| e.to_string());
                let case_label = label(c.label(), check);
                let tol = tolerance(dtype).at_peak(&want);
                ctx.record_with(
                    "paged", case, &name, dtype, tol, case_label, spec.seed, outcome,
                )?;
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
