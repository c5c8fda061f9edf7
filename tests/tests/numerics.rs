//! What NaN, ±Inf and extreme inputs do, family by family (the README's "Numerics" table):
//! a non-finite input makes the outputs that read it non-finite — the same ones the f64
//! reference makes non-finite (attention: plus, for a non-finite V, the masked rows that share
//! its tile, since 0·NaN = NaN) — and leaves every other output within tolerance; nothing
//! hangs or reads out of bounds. Softmax over logits around ±1e4 (exact in every dtype)
//! matches the reference, as do K/V of length 1, rows whose tiles are partly or wholly masked,
//! and paged decode over a 32,768-block pool (vLLM's test size) whose unused blocks are NaN;
//! the pool's index arithmetic is checked at 2^32 blocks without allocating them.

use kernel_attention::reference::attention;
use kernel_attention::{AttentionInputs, AttentionShape};
use kernel_common::{tolerance, Buffer, DType, Device, ErrorStats, Runs, VariantSpec};
use kernel_moe::{experts_forward, route, Capacity, Choice, ExpertVariant, MoeConfig, Priority};
use kernel_paged::{PagedCaseSpec, PoolLayout, SplitKv};
use kernel_quant::{MatVecVariant, Prepared, QuantMatrix, WeightFormat};
use std::sync::Arc;

/// Every CPU attention-shaped variant, with small and odd tiles.
fn attention_specs() -> Vec<String> {
    let mut specs: Vec<String> = harness::registry::ATTENTION_TABLES
        .iter()
        .flat_map(|t| t.iter())
        .filter(|v| v.device == Runs::Cpu)
        .map(|v| v.name.to_string())
        .collect();
    specs.extend(
        [
            "flash2:br=1,bc=1",
            "flash2:br=8,bc=3",
            "paged:split=auto,bs=2",
        ]
        .map(String::from),
    );
    specs
}

/// `spec` on the case, or `None` where it does not support it.
fn run_attention(spec: &str, shape: &AttentionShape, inputs: &AttentionInputs) -> Option<Vec<f32>> {
    let k = harness::registry::attention_kernel(spec).unwrap();
    k.supports(shape, inputs.dtype(), Device::Cpu).ok()?;
    let mut out = Buffer::poisoned(inputs.dtype(), shape.q_elems());
    k.prepare(shape, inputs).unwrap().run(&mut out).unwrap();
    Some(out.to_f32())
}

/// The outputs the reference makes non-finite are exactly the variant's, and the rest agree.
fn same_non_finite(what: &str, got: &[f32], want: &[f64], dtype: DType) {
    let bad_got: Vec<bool> = got.iter().map(|x| !x.is_finite()).collect();
    let bad_want: Vec<bool> = want.iter().map(|x| !x.is_finite()).collect();
    assert_eq!(
        bad_got, bad_want,
        "{what}: non-finite outputs differ from the reference's"
    );
    assert!(
        bad_want.contains(&true) && bad_want.contains(&false),
        "{what}: a partial case"
    );
    let (g, w): (Vec<f32>, Vec<f64>) = got
        .iter()
        .zip(want)
        .filter(|(_, w)| w.is_finite())
        .map(|(&g, &w)| (g, w))
        .unzip();
    let stats = ErrorStats::compare(&g, &w);
    assert!(stats.passes(&tolerance(dtype)), "{what}: {stats:?}");
}

fn set(b: &mut Buffer, at: usize, v: f32) {
    let mut x = b.to_f32();
    x[at] = v;
    *b = Buffer::from_f32(b.dtype(), &x);
}

#[test]
fn attention_propagates_nan_and_inf_to_the_rows_that_read_them() {
    // Causal, bottom-right aligned: row i sees keys 0..=3+i, so key 5 reaches rows 2.. of the
    // query heads 0 and 1 (KV head 0); the heads of KV head 1 never read it.
    let shape = AttentionShape::new(1, 4, 2, 6, 9, 16, true);
    let key5 = 5 * 16;
    for (what, tensor, at, v) in [
        ("NaN in K", 'k', key5 + 3, f32::NAN),
        ("+Inf in K", 'k', key5, f32::INFINITY),
        ("NaN in V", 'v', key5 + 7, f32::NAN),
        ("-Inf in V", 'v', key5 + 1, f32::NEG_INFINITY),
        ("+Inf in Q row 4", 'q', 4 * 16 + 2, f32::INFINITY),
        ("NaN in Q row 0", 'q', 2, f32::NAN),
    ] {
        let mut inputs = AttentionInputs::random(&shape, DType::F32, 3);
        match tensor {
            'q' => set(&mut inputs.q, at, v),
            'k' => set(&mut inputs.k, at, v),
            _ => set(&mut inputs.v, at, v),
        }
        let want = attention(&shape, &inputs);
        for spec in attention_specs() {
            let Some(got) = run_attention(&spec, &shape, &inputs) else {
                continue;
            };
            let what = format!("{spec} {what}");
            if tensor != 'v' {
                same_non_finite(&what, &got, &want, DType::F32);
                continue;
            }
            // A masked probability is exactly 0, and 0·NaN = NaN: a non-finite V at a key a
            // row does not see still reaches that row's output in the V's own dimension when
            // the key shares a tile with one the row sees (FlashAttention and PyTorch's math
            // backend do the same). Rows of other KV heads and other dimensions stay clean.
            let dim = at % 16;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let (head, d) = (i / (6 * 16), i % 16);
                if !w.is_finite() {
                    assert!(
                        !g.is_finite(),
                        "{what}: output {i} lost its non-finite value"
                    );
                } else if !g.is_finite() {
                    assert!(
                        head < 2 && d == dim,
                        "{what}: output {i} (head {head}, dim {d})"
                    );
                }
            }
            let (g, w): (Vec<f32>, Vec<f64>) = got
                .iter()
                .zip(&want)
                .filter(|(g, w)| g.is_finite() && w.is_finite())
                .map(|(&g, &w)| (g, w))
                .unzip();
            assert!(
                ErrorStats::compare(&g, &w).passes(&tolerance(DType::F32)),
                "{what}"
            );
        }
    }
}

/// Q and K whose scores are `base` + a small integer (exact in f32, f16 and bf16: every value
/// is an integer below 256 and every sum below 2^24), V random.
fn large_logits(
    shape: &AttentionShape,
    dtype: DType,
    base_sign: f32,
    seed: u64,
) -> AttentionInputs {
    let random = AttentionInputs::random(shape, dtype, seed);
    let d = shape.head_dim;
    let small = |i: usize| ((i * 7 + seed as usize) % 3) as f32 - 1.0;
    let q: Vec<f32> = (0..shape.q_elems())
        .map(|i| {
            if i % d == 0 {
                100.0
            } else if i % d < 5 {
                small(i)
            } else {
                0.0
            }
        })
        .collect();
    let k: Vec<f32> = (0..shape.kv_elems())
        .map(|i| {
            if i % d == 0 {
                100.0 * base_sign
            } else if i % d < 5 {
                small(i / 3 + i)
            } else {
                0.0
            }
        })
        .collect();
    AttentionInputs {
        q: Buffer::from_f32(dtype, &q),
        k: Buffer::from_f32(dtype, &k),
        v: random.v,
    }
}

/// The tolerance at logits of 1e4: an f32 logit of that size is rounded by 1e4·2^-24 ≈ 6e-4,
/// and a kernel that scales by log2(e) first (paged decode, the online softmaxes) carries
/// that into every weight, so f32 outputs are held to 1e-3 instead of 1e-5; a softmax that
/// overflowed or lost its shift would be off by O(1) or NaN.
fn near_1e4(dtype: DType) -> kernel_common::Tolerance {
    let t = tolerance(dtype);
    kernel_common::Tolerance {
        rel_l2: t.rel_l2.max(1e-3),
        max_abs: t.max_abs.max(2e-3),
    }
}

#[test]
fn softmax_over_logits_around_plus_and_minus_1e4_matches_the_reference() {
    // Unshifted, exp(1e4) overflows and exp(-1e4) underflows to 0/0; the max shift and the
    // online rescaling keep both exact.
    for (i, shape) in [
        AttentionShape::new(1, 4, 2, 1, 70, 16, true),
        AttentionShape::new(2, 2, 1, 20, 33, 16, true),
        AttentionShape::new(1, 2, 2, 9, 9, 32, false),
    ]
    .into_iter()
    .enumerate()
    {
        let mut shape = shape;
        shape.scale = 1.0;
        for sign in [1.0, -1.0] {
            for dtype in DType::ALL {
                let inputs = large_logits(&shape, dtype, sign, i as u64);
                let want = attention(&shape, &inputs);
                for spec in attention_specs() {
                    if let Some(got) = run_attention(&spec, &shape, &inputs) {
                        let stats = ErrorStats::compare(&got, &want);
                        assert!(
                            stats.passes(&near_1e4(dtype)),
                            "{spec} {dtype} logits {}1e4 {}: {stats:?}",
                            if sign > 0.0 { "+" } else { "-" },
                            shape.label()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn kv_of_length_one_and_masked_tiles_match_the_reference() {
    // A single key (decode and a non-causal multi-row query), and causal rows whose tiles are
    // wholly masked for part of a row block (br 8 over 1-key tiles: row 0 of a block sees one
    // key of the first tile and none of the next seven). Attention cannot express a row that
    // sees no key at all: causal needs q_len ≤ kv_len, so every row sees key 0.
    for shape in [
        AttentionShape::new(2, 4, 2, 1, 1, 64, true),
        AttentionShape::new(1, 3, 1, 5, 1, 32, false),
        AttentionShape::new(1, 2, 1, 1, 1, 128, false),
        AttentionShape::new(1, 2, 2, 17, 17, 16, true),
        AttentionShape::new(1, 2, 1, 9, 30, 8, true),
    ] {
        for dtype in DType::ALL {
            let inputs = AttentionInputs::random(&shape, dtype, 11);
            let want = attention(&shape, &inputs);
            for spec in attention_specs() {
                if let Some(got) = run_attention(&spec, &shape, &inputs) {
                    let stats = ErrorStats::compare(&got, &want);
                    assert!(
                        stats.passes(&tolerance(dtype)),
                        "{spec} {dtype} {}: {stats:?}",
                        shape.label()
                    );
                }
            }
        }
    }
}

#[test]
fn paged_decode_over_32768_blocks_with_nan_spares_matches_the_reference() {
    // vLLM's largest test pool: 32,768 blocks of one token, 21,300 of them holding three
    // sequences (block tables of up to 12,000 ids, up to 32,767), the rest NaN.
    let spec = PagedCaseSpec {
        context_lens: vec![9000, 12000, 300],
        block_size: 1,
        kv_heads: 1,
        group: 4,
        head_dim: 64,
        q_len: 1,
        dtype: DType::F32,
        spare_blocks: 32768 - 21300,
        seed: 5,
    };
    let case = spec.build().unwrap();
    assert_eq!(case.pool.layout.num_blocks, 32768);
    let top = case.batch.block_tables.iter().flatten().max().copied();
    assert!(
        top >= Some(32000),
        "the tables reach the top of the pool: {top:?}"
    );
    let want = case.reference().unwrap();
    for split in [SplitKv::Off, SplitKv::Auto, SplitKv::Tokens(1000)] {
        let got = case.decode(split).unwrap();
        assert!(
            got.iter().all(|x| x.is_finite()),
            "{split:?}: a NaN spare block leaked"
        );
        let stats = ErrorStats::compare(&got, &want);
        assert!(stats.passes(&tolerance(DType::F32)), "{split:?}: {stats:?}");
    }
}

#[test]
fn pool_index_arithmetic_holds_past_u32_without_allocating() {
    // 2^32 − 1 blocks of 8 heads × 256 tokens × 128 dims: element offsets reach 2^50. The
    // offset of the last element is computed in usize (no 32-bit product wraps), and one
    // block more than u32 ids can name is refused.
    let layout = PoolLayout {
        num_blocks: u32::MAX as usize,
        block_size: 256,
        kv_heads: 8,
        head_dim: 128,
    };
    layout.validate().unwrap();
    let last = layout.offset(layout.num_blocks - 1, 7, 255) + layout.head_dim;
    assert_eq!(last, layout.num_blocks * layout.block_elems());
    assert_eq!(
        layout.position_offset(&[7, u32::MAX - 1], 3, 256 + 5),
        ((((u32::MAX - 1) as usize * 8 + 3) * 256) + 5) * 128
    );
    let too_many = PoolLayout {
        num_blocks: u32::MAX as usize + 1,
        ..layout
    };
    assert!(too_many.validate().is_err());
}

#[test]
fn quantised_products_propagate_nan_and_inf_activations() {
    // Batch row 0 holds a NaN, row 1 a +Inf, row 2 is finite: rows 0 and 1 of the output are
    // non-finite in every column (the f32 products and the int8-activation ones alike — an
    // int8 chunk with a non-finite value gets a NaN scale), row 2 matches the reference.
    let (rows, cols) = (48, 256);
    let w: Vec<f32> =
        kernel_common::inputs::normal_f32(&mut kernel_common::inputs::rng(2), rows * cols, 0.3);
    let mut x =
        kernel_common::inputs::normal_f32(&mut kernel_common::inputs::rng(3), 3 * cols, 1.0);
    x[37] = f32::NAN;
    x[cols + 200] = f32::INFINITY;
    for format in ["f32", "f16", "q8_0", "q4_0", "q4_1", "sym4g32"] {
        let m = Arc::new(
            QuantMatrix::quantize(WeightFormat::parse(format).unwrap(), rows, cols, &w).unwrap(),
        );
        let finite_row = kernel_quant::reference::matmul(&m, &x[2 * cols..], 1);
        for spec in ["fused", "fused:act=q8", "packed", "dequant", "faer"] {
            let variant: MatVecVariant =
                kernel_quant::variant_from_spec(&VariantSpec::parse(spec).unwrap())
                    .unwrap()
                    .unwrap();
            let Ok(p) = Prepared::new(m.clone(), variant) else {
                continue;
            };
            let mut y = vec![0.0f32; 3 * rows];
            if p.matmul(&x, 3, &mut y, variant).is_err() {
                continue; // a product that does not take this format
            }
            assert!(
                y[..2 * rows].iter().all(|v| !v.is_finite()),
                "{spec} {format}: {:?}",
                &y[..8]
            );
            let stats = ErrorStats::compare(&y[2 * rows..], &finite_row);
            let tol = tolerance(DType::F32).scaled_to(&finite_row);
            let tol = if spec.contains("q8") || spec == "packed" {
                kernel_common::Tolerance {
                    rel_l2: 2e-2,
                    max_abs: tol.max_abs * 200.0,
                }
            } else {
                tol
            };
            assert!(stats.passes(&tol), "{spec} {format} finite row: {stats:?}");
        }
    }
    // Non-finite weights are refused when stored, naming the first.
    let mut bad = w.clone();
    bad[5 * cols + 9] = f32::NAN;
    let e = QuantMatrix::quantize(WeightFormat::Q4_0, rows, cols, &bad).unwrap_err();
    assert!(e.to_string().contains("(5, 9)"), "{e}");
}

#[test]
fn moe_routes_a_nan_token_without_panic_and_keeps_the_others() {
    let tokens = |policy| Choice::Tokens { top_k: 2, policy };
    for (capacity, choice) in [
        (Capacity::Dropless, tokens(Priority::Score)),
        (Capacity::Factor(1.0), tokens(Priority::Score)),
        (Capacity::Factor(1.0), tokens(Priority::TokenOrder)),
        (Capacity::Factor(1.0), tokens(Priority::RankMajor)),
        (Capacity::Factor(1.0), tokens(Priority::Reroute)),
        (Capacity::Factor(1.0), Choice::Experts),
    ] {
        let cfg = MoeConfig {
            tokens: 7,
            d_model: 32,
            d_ff: 48,
            experts: 4,
            choice,
            norm: if choice == Choice::Experts {
                kernel_moe::WeightNorm::Raw
            } else {
                kernel_moe::WeightNorm::Renormalize
            },
            capacity,
            min_capacity: 1,
        };
        let w = kernel_moe::MoeWeights::random(&cfg, 0.0, 4);
        let mut x =
            kernel_common::inputs::normal_f32(&mut kernel_common::inputs::rng(6), 7 * 32, 1.0);
        x[2 * 32 + 5] = f32::NAN;
        let routing = route(&cfg, &x, &w.router, &w.bias).unwrap();
        assert!(routing
            .assignments
            .iter()
            .all(|a| a.expert < 4 && a.token < 7));
        for variant in [ExpertVariant::Grouped, ExpertVariant::Naive] {
            let mut out = vec![f32::NAN; 7 * 32];
            experts_forward(&cfg, &w, &x, &routing, variant, &mut out).unwrap();
            let want = kernel_moe::reference::experts_reference(
                &cfg,
                &w,
                &x,
                &routing,
                &(0..7).collect::<Vec<_>>(),
            );
            same_non_finite(
                &format!("moe {variant:?} {capacity:?} {choice:?}"),
                &out,
                &want,
                DType::F32,
            );
        }
    }
}

#[test]
fn tree_attention_and_verification_stay_in_bounds_on_non_finite_input() {
    use kernel_paged::KvPool;
    use kernel_speculative::{
        tree_attention, tree_attention_reference, verify_greedy, verify_stochastic,
    };
    use kernel_speculative::{DraftTree, Proposal, TreeAttnShape, TreeContext};
    let layout = PoolLayout {
        num_blocks: 8,
        block_size: 4,
        kv_heads: 2,
        head_dim: 16,
    };
    let n = 8 * layout.block_elems();
    let mut r = kernel_common::inputs::rng(9);
    let mut pool = KvPool {
        layout,
        k: kernel_common::inputs::normal_buffer(&mut r, DType::F32, n),
        v: kernel_common::inputs::normal_buffer(&mut r, DType::F32, n),
    };
    let table: Vec<u32> = vec![3, 0, 6, 1, 7, 2, 5, 4];
    let tree = DraftTree::from_parents(&[None, Some(0), Some(0), Some(1), Some(3)]).unwrap();
    let nodes: Vec<usize> = (0..5).collect();
    let shape = TreeAttnShape {
        q_heads: 4,
        kv_heads: 2,
        head_dim: 16,
        scale: 0.25,
        window: None,
        softcap: None,
    };
    let mut q = kernel_common::inputs::normal_f32(&mut r, 5 * 4 * 16, 1.0);
    // NaN in the query of node 2 (head 1), and +Inf in the context's K at position 6, head 1.
    q[(2 * 4 + 1) * 16 + 3] = f32::NAN;
    set(
        &mut pool.k,
        layout.position_offset(&table, 1, 6) + 2,
        f32::INFINITY,
    );
    let at = TreeContext {
        pool: &pool,
        table: &table,
        ctx: 10,
        tree: &tree,
        nodes: &nodes,
    };
    let mut out = vec![0.0f32; q.len()];
    tree_attention(&shape, &at, &q, &mut out).unwrap();
    let want = tree_attention_reference(&shape, &at, &q).unwrap();
    same_non_finite("tree attention", &out, &want, DType::F32);
    // Verification on non-finite scores: it ends, and every token it names is in the
    // vocabulary (which tokens is unspecified: there is no distribution to be faithful to).
    let v = 6;
    let tokens = [0u32, 2, 5, 1, 3];
    let mut logits = vec![0.5f32; 5 * v];
    logits[3] = f32::NAN;
    logits[v + 2] = f32::INFINITY;
    let g = verify_greedy(&tree, &tokens, &logits, v);
    assert!((g.next_token as usize) < v && g.accepted.iter().all(|&n| n < 5));
    let mut probs = vec![1.0 / v as f32; 5 * v];
    probs[..v].fill(f32::NAN);
    probs[2 * v + 1] = f32::INFINITY;
    for seed in 0..50 {
        let q = Proposal::Sampled(vec![1.0 / v as f32; v]);
        let s = verify_stochastic(
            &tree,
            &tokens,
            &probs,
            v,
            &vec![q; 5],
            &mut kernel_common::inputs::rng(seed),
        );
        assert!((s.next_token as usize) < v && s.accepted.iter().all(|&n| n < 5));
    }
}
