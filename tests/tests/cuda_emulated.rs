//! Every CUDA kernel, run by the CPU emulator (`kernel_common::cuda::emu`: g++, CUDA threads
//! as coroutines, warp shuffles and the m16n8k16 MMA from its fragment layout), against the
//! same f64 references the CPU variants answer to, with launch shapes from the host-side plans
//! and NaN-poisoned outputs. No GPU is involved: this checks what the kernels compute before a
//! GPU is lent, not their speed. Skips (with the reason) where g++ is missing.

use attention_kernels::cuda::{plan, CudaAlgo, FLASH2_BLOCK_ROWS};
use attention_kernels::reference::attention;
use attention_kernels::{AttentionInputs, AttentionShape};
use kernel_common::cuda::buffer::{
    buffer_bytes, buffer_from_bytes, f32_bytes, f32_from_bytes, i32_bytes, i32_from_bytes,
};
use kernel_common::cuda::emu::{unavailable, Arg, EmuModule};
use kernel_common::cuda::{blocks_for, KernelSource, Launch};
use kernel_common::inputs::{derive_seed, normal_buffer, normal_f32, rng};
use kernel_common::{tolerance, Buffer, DType, ErrorStats};
use paged_kernels::cuda::{flat_tables, plan_decode, slots};
use paged_kernels::{append, KvPool, PagedCaseSpec, PoolLayout, SplitKv};
use rand::seq::SliceRandom;

fn module(source: &KernelSource) -> Option<EmuModule> {
    if let Some(why) = unavailable() {
        eprintln!("SKIPPED emulated CUDA kernels: {why}");
        return None;
    }
    Some(EmuModule::build(source).unwrap_or_else(|e| panic!("{e}")))
}

fn assert_close(what: &str, got: &[f32], want: &[f64], tol: kernel_common::Tolerance) {
    let stats = ErrorStats::compare(got, want);
    assert!(
        stats.passes(&tol),
        "{what}: rel L2 {:.3e}, max |err| {:.3e}, {} non-finite of {}",
        stats.rel_l2,
        stats.max_abs,
        stats.non_finite,
        stats.count
    );
}

fn nan_bytes(dtype: DType, len: usize) -> Vec<u8> {
    vec![0xff; len * dtype.size()]
}

#[test]
fn attention_naive_and_flash2_match_the_reference() {
    let Some(m) = module(&attention_kernels::cuda::SOURCE) else {
        return;
    };
    let shapes = [
        AttentionShape::new(2, 4, 2, 70, 70, 64, true),
        AttentionShape::new(1, 2, 2, 1, 130, 128, true),
        AttentionShape::new(1, 4, 1, 33, 97, 64, false),
        AttentionShape::new(1, 2, 1, 5, 200, 128, true),
        AttentionShape::new(1, 2, 2, 129, 129, 128, true),
    ];
    for (i, shape) in shapes.iter().enumerate() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let inputs = AttentionInputs::random(shape, dtype, derive_seed(7, i as u64));
            let want = attention(shape, &inputs);
            let (q, k, v) = (
                buffer_bytes(&inputs.q),
                buffer_bytes(&inputs.k),
                buffer_bytes(&inputs.v),
            );
            let ints = |x: usize| Arg::I32(x as i32);
            for algo in [CudaAlgo::Naive, CudaAlgo::Flash2, CudaAlgo::Flash2Pipelined] {
                let Ok(p) = plan(algo, shape, dtype) else {
                    assert!(algo != CudaAlgo::Naive && dtype == DType::F32);
                    continue;
                };
                let mut o = nan_bytes(dtype, shape.q_elems());
                let mut scores = vec![0u8; p.workspace_bytes];
                for l in &p.launches {
                    let s = shape;
                    let mut args: Vec<Arg> = if l.entry.starts_with("flash2") {
                        vec![Arg::In(&q), Arg::In(&k), Arg::In(&v), Arg::Out(&mut o)]
                    } else if l.entry.starts_with("naive_scores") {
                        vec![Arg::In(&q), Arg::In(&k), Arg::Out(&mut scores)]
                    } else if l.entry == "naive_softmax_f32" {
                        let rows = (s.batch * s.q_heads * s.q_len) as i64;
                        vec![Arg::Out(&mut scores), Arg::I64(rows), ints(s.kv_len)]
                    } else {
                        vec![Arg::In(&scores), Arg::In(&v), Arg::Out(&mut o)]
                    };
                    if l.entry.starts_with("flash2") || l.entry.starts_with("naive_scores") {
                        args.extend([ints(s.q_heads), ints(s.kv_heads), ints(s.q_len)]);
                        args.push(ints(s.kv_len));
                        if l.entry.starts_with("naive_scores") {
                            args.push(ints(s.head_dim));
                        }
                        args.extend([Arg::I32(s.causal as i32), Arg::F32(s.scale)]);
                    } else if l.entry.starts_with("naive_pv") {
                        args.extend([ints(s.q_heads), ints(s.kv_heads), ints(s.q_len)]);
                        args.extend([ints(s.kv_len), ints(s.head_dim)]);
                    }
                    m.launch(&l.entry, l.launch, &mut args)
                        .unwrap_or_else(|e| panic!("{e}"));
                }
                let got = buffer_from_bytes(dtype, &o).to_f32();
                assert_close(
                    &format!("{algo:?} {} {dtype}", shape.label()),
                    &got,
                    &want,
                    tolerance(dtype),
                );
            }
        }
    }
    assert_eq!(FLASH2_BLOCK_ROWS, 64);
}

/// Runs the decode (and the reduction) of `plan_decode` on the emulator.
fn emulated_decode(
    m: &EmuModule,
    case: &paged_kernels::PagedCase,
    split: SplitKv,
    unroll: usize,
) -> Vec<f32> {
    let dtype = case.pool.dtype();
    let lens = &case.batch.context_lens;
    let p = plan_decode(&case.shape, lens, dtype, split, unroll, 132).unwrap();
    let (tables, width) = flat_tables(&case.batch.block_tables);
    let lens: Vec<i32> = case.batch.context_lens.iter().map(|&l| l as i32).collect();
    let (kp, vp, q) = (
        buffer_bytes(&case.pool.k),
        buffer_bytes(&case.pool.v),
        buffer_bytes(&case.q),
    );
    let (tb, lb) = (i32_bytes(&tables), i32_bytes(&lens));
    let mut out = nan_bytes(dtype, case.q.len());
    let mut part_o = f32_bytes(&vec![f32::NAN; p.partial_elems.max(1)]);
    let mut part_lse = f32_bytes(&vec![f32::NAN; p.lse_elems.max(1)]);
    let s = &case.shape;
    let i = |x: usize| Arg::I32(x as i32);
    let l = case.pool.layout;
    m.launch(
        &p.decode_entry,
        p.decode,
        &mut [
            Arg::In(&q),
            Arg::In(&kp),
            Arg::In(&vp),
            Arg::In(&tb),
            Arg::In(&lb),
            Arg::Out(&mut out),
            Arg::Out(&mut part_o),
            Arg::Out(&mut part_lse),
            i(case.batch.len()),
            i(s.q_heads),
            i(s.kv_heads),
            i(s.q_len),
            i(l.block_size),
            i(width),
            i(p.part_tokens),
            i(p.row_chunks),
            Arg::F32(s.scale),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    if let Some((entry, launch)) = &p.reduce {
        m.launch(
            entry,
            *launch,
            &mut [
                Arg::In(&part_o),
                Arg::In(&part_lse),
                Arg::In(&lb),
                Arg::Out(&mut out),
                i(case.batch.len()),
                i(s.q_heads),
                i(s.q_len),
                i(s.head_dim),
                i(p.part_tokens),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    buffer_from_bytes(dtype, &out).to_f32()
}

#[test]
fn paged_decode_unsplit_and_split_match_the_reference() {
    let Some(m) = module(&paged_kernels::cuda::SOURCE) else {
        return;
    };
    let spec =
        |lens: Vec<usize>, bs, kv_heads, group, head_dim, q_len, dtype, seed| PagedCaseSpec {
            context_lens: lens,
            block_size: bs,
            kv_heads,
            group,
            head_dim,
            q_len,
            dtype,
            spare_blocks: 3,
            seed,
        };
    let cases = [
        spec(vec![54, 97, 577], 16, 2, 4, 128, 1, DType::F32, 1),
        spec(vec![300, 1], 1, 1, 8, 64, 1, DType::F16, 2),
        spec(vec![130, 77], 32, 2, 2, 128, 3, DType::BF16, 3),
        // MQA with 9 query heads × 2 new tokens = 18 rows: two row chunks.
        spec(vec![40], 4, 1, 9, 64, 2, DType::F32, 4),
    ];
    for s in &cases {
        let case = s.build().unwrap();
        let want = case.reference().unwrap();
        for (split, unroll) in [
            (SplitKv::Off, 1),
            (SplitKv::Tokens(37), 1),
            (SplitKv::Auto, 1),
            (SplitKv::Off, 2),
            (SplitKv::Tokens(37), 2),
        ] {
            let got = emulated_decode(&m, &case, split, unroll);
            assert_close(
                &format!("{} {split:?} unroll {unroll}", case.label()),
                &got,
                &want,
                tolerance(s.dtype),
            );
        }
    }
}

#[test]
fn paged_append_writes_exactly_the_slots() {
    let Some(m) = module(&paged_kernels::cuda::SOURCE) else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let layout = PoolLayout {
            num_blocks: 9,
            block_size: 4,
            kv_heads: 2,
            head_dim: 64,
        };
        let mut r = rng(11);
        let mut table: Vec<u32> = (0..9).collect();
        table.shuffle(&mut r);
        let (start, n) = (3, 13);
        // The CPU append takes [kv_heads, n, d]; the kernel [n, kv_heads, d].
        let k = normal_buffer(&mut r, dtype, 2 * n * 64);
        let v = normal_buffer(&mut r, dtype, 2 * n * 64);
        let mut want = KvPool::poisoned(layout, dtype).unwrap();
        append(&mut want, &table, start, &k, &v).unwrap();
        let to_tokens = |b: &Buffer| -> Vec<u8> {
            let f = b.to_f32();
            let mut t = Vec::with_capacity(f.len());
            for pos in 0..n {
                for h in 0..2 {
                    t.extend_from_slice(&f[(h * n + pos) * 64..(h * n + pos + 1) * 64]);
                }
            }
            buffer_bytes(&Buffer::from_f32(dtype, &t))
        };
        let mut sl = slots(&layout, &table, start, n).unwrap();
        sl[5] = -1; // padding: must land nowhere
        let mut kp = nan_bytes(dtype, 9 * layout.block_elems());
        let mut vp = nan_bytes(dtype, 9 * layout.block_elems());
        let (kn, vn, sb) = (to_tokens(&k), to_tokens(&v), i32_bytes(&sl));
        let entry = format!("paged_append_{}", kernel_common::cuda::dtype_suffix(dtype));
        m.launch(
            &entry,
            Launch::new((n, 1, 1), 128, 0).unwrap(),
            &mut [
                Arg::In(&kn),
                Arg::In(&vn),
                Arg::In(&sb),
                Arg::Out(&mut kp),
                Arg::Out(&mut vp),
                Arg::I32(2),
                Arg::I32(64),
                Arg::I32(4),
            ],
        )
        .unwrap();
        // Equal to the CPU append everywhere but token 5's slot, which stays poisoned.
        let (got_k, want_k) = (buffer_from_bytes(dtype, &kp).to_f32(), want.k.to_f32());
        let skipped = layout.position_offset(&table, 0, start + 5);
        for (i, (g, w)) in got_k.iter().zip(&want_k).enumerate() {
            let in_skipped = (0..2).any(|h| {
                let at = layout.position_offset(&table, h, start + 5);
                (at..at + 64).contains(&i)
            });
            if in_skipped {
                assert!(
                    g.is_nan(),
                    "padding token written at {i} (slot at {skipped})"
                );
            } else {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "K {i}"
                );
            }
        }
        let got_v = buffer_from_bytes(dtype, &vp).to_f32();
        assert_eq!(
            got_v.iter().filter(|x| !x.is_nan()).count(),
            (n - 1) * 2 * 64
        );
    }
}

#[test]
fn quant_gemv_matches_the_dequantised_reference() {
    let Some(m) = module(&quant_kernels::cuda::SOURCE) else {
        return;
    };
    use quant_kernels::cuda::{gemv_entry, plan_gemv};
    use quant_kernels::{reference, QuantMatrix, WeightFormat};
    for (fi, fmt) in ["f16", "sym4g32", "q4_0", "q8_0"].into_iter().enumerate() {
        let format = WeightFormat::parse(fmt).unwrap();
        for (rows, cols, batch) in [(37, 96, 1), (9, 1024, 3), (130, 64, 8)] {
            let seed = derive_seed(fi as u64, rows as u64);
            let w = normal_f32(&mut rng(seed), rows * cols, 1.0);
            let q = QuantMatrix::quantize(format, rows, cols, &w).unwrap();
            let x = normal_f32(&mut rng(seed ^ 1), batch * cols, 1.0);
            let want = reference::matmul(&q, &x, batch);
            let mut y = f32_bytes(&vec![f32::NAN; batch * rows]);
            let xb = f32_bytes(&x);
            m.launch(
                gemv_entry(format).unwrap(),
                plan_gemv(format, rows, cols, batch).unwrap(),
                &mut [
                    Arg::In(q.bytes()),
                    Arg::In(&xb),
                    Arg::Out(&mut y),
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::I32(batch as i32),
                ],
            )
            .unwrap();
            assert_close(
                &format!("{fmt} {rows}x{cols} b{batch}"),
                &f32_from_bytes(&y),
                &want,
                tolerance(DType::F32).scaled_to(&want),
            );
        }
    }
}

#[test]
fn moe_route_capacity_dispatch_combine_match_the_cpu() {
    let Some(m) = module(&moe_kernels::cuda::SOURCE) else {
        return;
    };
    use moe_kernels::cuda::{plan_route, slots_per_expert};
    use moe_kernels::{route_reference, select, Capacity, DropPolicy, MoeConfig, MoeWeights};
    let base = MoeConfig {
        tokens: 97,
        d_model: 54,
        d_ff: 8,
        experts: 40,
        top_k: 2,
        norm: moe_kernels::WeightNorm::Renormalize,
        capacity: Capacity::Factor(1.0),
        policy: DropPolicy::TokenOrder,
    };
    let configs = [
        base,
        MoeConfig {
            policy: DropPolicy::Score,
            capacity: Capacity::Factor(0.5),
            ..base
        },
        MoeConfig {
            top_k: 8,
            experts: 8,
            capacity: Capacity::Dropless,
            norm: moe_kernels::WeightNorm::Raw,
            ..base
        },
    ];
    for (ci, c) in configs.iter().enumerate() {
        let w = MoeWeights::random(c, 1.0, ci as u64);
        let x = normal_f32(&mut rng(ci as u64 ^ 9), c.tokens * c.d_model, 1.0);
        let (t, k, e) = (c.tokens, c.top_k, c.experts);
        let (xb, gb, bb) = (f32_bytes(&x), f32_bytes(&w.router), f32_bytes(&w.bias));
        let mut probs = f32_bytes(&vec![f32::NAN; t * e]);
        let mut ex = i32_bytes(&vec![-1; t * k]);
        let mut gp = f32_bytes(&vec![f32::NAN; t * k]);
        let mut wt = f32_bytes(&vec![f32::NAN; t * k]);
        let i = |v: usize| Arg::I32(v as i32);
        m.launch(
            "moe_route_f32",
            plan_route(c).unwrap(),
            &mut [
                Arg::In(&xb),
                Arg::In(&gb),
                Arg::In(&bb),
                Arg::Out(&mut probs),
                Arg::Out(&mut ex),
                Arg::Out(&mut gp),
                Arg::Out(&mut wt),
                i(t),
                i(c.d_model),
                i(e),
                i(k),
                Arg::I32((c.norm == moe_kernels::WeightNorm::Renormalize) as i32),
            ],
        )
        .unwrap();
        let probs = f32_from_bytes(&probs);
        let exact = route_reference(c, &x, &w.router, &w.bias).unwrap();
        assert_close("router probs", &probs, &exact.probs, tolerance(DType::F32));
        let cpu = select(c, probs.iter().map(|&p| p as f64).collect());
        let experts = i32_from_bytes(&ex);
        for (a, &got) in cpu.assignments.iter().zip(&experts) {
            assert_eq!(a.expert as i32, got, "config {ci}: top-k choice");
        }
        let weights = f32_from_bytes(&wt);
        let want_w: Vec<f64> = cpu.assignments.iter().map(|a| a.weight).collect();
        assert_close("weights", &weights, &want_w, tolerance(DType::F32));
        // Capacity positions: kept exactly when the CPU keeps, positions 0..kept per expert.
        let cap = slots_per_expert(c);
        let mut pos = i32_bytes(&vec![i32::MIN; t * k]);
        let n = t * k;
        m.launch(
            "moe_capacity_f32",
            Launch::new((blocks_for(n, 256), 1, 1), 256, 0).unwrap(),
            &mut [
                Arg::In(&ex),
                Arg::In(&gp),
                Arg::Out(&mut pos),
                i(n),
                i(k),
                i(cap),
                Arg::I32((c.policy == DropPolicy::Score) as i32),
            ],
        )
        .unwrap();
        let pos = i32_from_bytes(&pos);
        let mut per_expert = vec![vec![]; e];
        for (a, &p) in cpu.assignments.iter().zip(&pos) {
            assert_eq!(a.kept, p >= 0, "config {ci}: kept flag of {a:?}");
            if p >= 0 {
                per_expert[a.expert].push(p);
            }
        }
        for v in &mut per_expert {
            v.sort_unstable();
            assert!(v.iter().enumerate().all(|(i, &p)| i as i32 == p));
        }
        // Dispatch (bf16 rows, bit-exact) and combine (f64 reference of the same decisions).
        let dt = DType::BF16;
        let xs = Buffer::from_f32(dt, &x);
        let xsb = buffer_bytes(&xs);
        let mut slots_b = nan_bytes(dt, e * cap * c.d_model);
        m.launch(
            "moe_dispatch_bf16",
            Launch::new((n, 1, 1), 128, 0).unwrap(),
            &mut [
                Arg::In(&xsb),
                Arg::In(&ex),
                Arg::In(&i32_bytes(&pos)),
                Arg::Out(&mut slots_b),
                i(k),
                i(c.d_model),
                i(cap),
            ],
        )
        .unwrap();
        let slots_f = buffer_from_bytes(dt, &slots_b).to_f32();
        let xf = xs.to_f32();
        let d = c.d_model;
        for (a, (&ee, &p)) in experts.iter().zip(&pos).enumerate() {
            if p >= 0 {
                let at = (ee as usize * cap + p as usize) * d;
                assert_eq!(&slots_f[at..at + d], &xf[(a / k) * d..(a / k + 1) * d]);
            }
        }
        let y = normal_buffer(&mut rng(5), dt, e * cap * d);
        let yf = y.to_f32();
        let mut want = vec![0.0f64; t * d];
        for (a, (&ee, &p)) in experts.iter().zip(&pos).enumerate() {
            if p >= 0 {
                let at = (ee as usize * cap + p as usize) * d;
                for j in 0..d {
                    want[(a / k) * d + j] += weights[a] as f64 * yf[at + j] as f64;
                }
            }
        }
        let mut out = nan_bytes(dt, t * d);
        m.launch(
            "moe_combine_bf16",
            Launch::new((t, 1, 1), 128, 0).unwrap(),
            &mut [
                Arg::In(&buffer_bytes(&y)),
                Arg::In(&ex),
                Arg::In(&i32_bytes(&pos)),
                Arg::In(&f32_bytes(&weights)),
                Arg::Out(&mut out),
                i(k),
                i(d),
                i(cap),
            ],
        )
        .unwrap();
        assert_close(
            "combine",
            &buffer_from_bytes(dt, &out).to_f32(),
            &want,
            tolerance(dt).scaled_to(&want),
        );
    }
}

#[test]
fn tree_attention_matches_the_reference() {
    let Some(m) = module(&spec_kernels::cuda::SOURCE) else {
        return;
    };
    use spec_kernels::cuda::{mask_bytes, plan_tree_attention};
    use spec_kernels::{tree_attention_reference, DraftTree, TreeAttnShape, TreeContext};
    let trees = [
        (DraftTree::static_shape(&[3, 2, 1]).unwrap(), 21, 64, 4),
        (DraftTree::chain(5), 0, 48, 1),
        (DraftTree::root(), 9, 128, 16),
    ];
    for (ti, (tree, ctx, head_dim, bs)) in trees.iter().enumerate() {
        let (kv_heads, q_heads) = (2, 6);
        let n = tree.len();
        let used = (ctx + n).div_ceil(*bs);
        let layout = PoolLayout {
            num_blocks: used + 1,
            block_size: *bs,
            kv_heads,
            head_dim: *head_dim,
        };
        let mut r = rng(ti as u64);
        let elems = layout.num_blocks * layout.block_elems();
        let pool = KvPool {
            layout,
            k: normal_buffer(&mut r, DType::F32, elems),
            v: normal_buffer(&mut r, DType::F32, elems),
        };
        let mut table: Vec<u32> = (0..layout.num_blocks as u32).collect();
        table.shuffle(&mut r);
        let nodes: Vec<usize> = (0..n).rev().collect();
        let shape = TreeAttnShape {
            q_heads,
            kv_heads,
            head_dim: *head_dim,
            scale: 0.2,
        };
        let at = TreeContext {
            pool: &pool,
            table: &table,
            ctx: *ctx,
            tree,
            nodes: &nodes,
        };
        let q = normal_f32(&mut r, n * q_heads * head_dim, 1.0);
        let want = tree_attention_reference(&shape, &at, &q).unwrap();
        let mut out = f32_bytes(&vec![f32::NAN; q.len()]);
        let tb = i32_bytes(&table.iter().map(|&b| b as i32).collect::<Vec<_>>());
        let nb = i32_bytes(&nodes.iter().map(|&x| x as i32).collect::<Vec<_>>());
        let i = |v: usize| Arg::I32(v as i32);
        m.launch(
            "tree_attention_f32",
            plan_tree_attention(&shape, n).unwrap(),
            &mut [
                Arg::In(&f32_bytes(&q)),
                Arg::In(&buffer_bytes(&pool.k)),
                Arg::In(&buffer_bytes(&pool.v)),
                Arg::In(&tb),
                Arg::In(&mask_bytes(&at)),
                Arg::In(&nb),
                Arg::Out(&mut out),
                i(n),
                i(n),
                i(*ctx),
                i(q_heads),
                i(kv_heads),
                i(*head_dim),
                i(*bs),
                Arg::F32(0.2),
            ],
        )
        .unwrap();
        assert_close(
            &format!("tree {ti}"),
            &f32_from_bytes(&out),
            &want,
            tolerance(DType::F32).scaled_to(&want),
        );
    }
}

#[test]
fn roofline_gemm_matches_an_f64_product() {
    let Some(m) = module(&kernel_common::cuda::roofline::SOURCE) else {
        return;
    };
    use half::bf16;
    let (mm, nn, kk) = (128, 256, 64);
    let a: Vec<bf16> = normal_f32(&mut rng(1), mm * kk, 1.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let b: Vec<bf16> = normal_f32(&mut rng(2), nn * kk, 1.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let mut c = f32_bytes(&vec![f32::NAN; mm * nn]);
    m.launch(
        "gemm_bf16",
        kernel_common::cuda::roofline::plan_gemm(mm, nn, kk).unwrap(),
        &mut [
            Arg::In(&buffer_bytes(&Buffer::BF16(a.clone()))),
            Arg::In(&buffer_bytes(&Buffer::BF16(b.clone()))),
            Arg::Out(&mut c),
            Arg::I32(mm as i32),
            Arg::I32(nn as i32),
            Arg::I32(kk as i32),
        ],
    )
    .unwrap();
    let want: Vec<f64> = (0..mm * nn)
        .map(|ij| {
            let (i, j) = (ij / nn, ij % nn);
            (0..kk)
                .map(|t| a[i * kk + t].to_f64() * b[j * kk + t].to_f64())
                .sum()
        })
        .collect();
    assert_close("gemm", &f32_from_bytes(&c), &want, tolerance(DType::F32));
}
