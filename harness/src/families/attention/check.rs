//! `harness check --family attention`: random attention shapes (decode, append, prefill;
//! MHA/GQA/MQA; odd head dims; a third of the causal ones with a sliding window — 1, 2, any
//! length, the context — and a quarter of all soft-capped) then the DESIGN.md edge cases
//! (kv_len 1, lengths 54/97/577, kv_heads 1 and = q_heads, non-causal with q_len > kv_len)
//! and windowed / soft-capped ones (Mistral- and Gemma-like), every variant on NaN-poisoned
//! output against the f64 reference; paged variants run here too, through the same trait.

use crate::checking::Ctx;
use crate::error::Result;
use crate::registry;
use attention_kernels::reference::attention;
use attention_kernels::{AttentionInputs, AttentionShape};
use kernel_common::inputs::{derive_seed, rng};
use kernel_common::{Buffer, ErrorStats};
use rand::Rng;

/// Random attention shapes (decode, append, prefill; MHA/GQA/MQA) then the edge cases.
fn attention_cases(cases: usize, seed: u64) -> Vec<AttentionShape> {
    let mut r = rng(seed);
    let mut out = vec![];
    for _ in 0..cases {
        let kv_heads = [1, 2, 4][r.gen_range(0..3)];
        let group = r.gen_range(1..=4);
        let head_dim = [64, 128, r.gen_range(1..=160)][r.gen_range(0..3)];
        let kv_len = r.gen_range(1..=600);
        let (q_len, causal) = match r.gen_range(0..3) {
            0 => (1, true),
            1 => (r.gen_range(1..=kv_len.min(16)), true),
            _ => (kv_len, r.gen_bool(0.5)),
        };
        let window = (causal && r.gen_bool(1.0 / 3.0))
            .then(|| [1, 2, r.gen_range(1..=kv_len + 5), kv_len][r.gen_range(0..4)]);
        let softcap = r
            .gen_bool(0.25)
            .then(|| [50.0, r.gen_range(0.5f32..10.0)][r.gen_range(0..2)]);
        out.push(
            AttentionShape::new(
                r.gen_range(1..=3),
                kv_heads * group,
                kv_heads,
                q_len,
                kv_len,
                head_dim,
                causal,
            )
            .with_window(window)
            .with_softcap(softcap),
        );
    }
    out.extend([
        AttentionShape::new(1, 4, 4, 1, 1, 64, true),
        AttentionShape::new(2, 8, 1, 1, 577, 128, true),
        AttentionShape::new(3, 8, 8, 1, 97, 64, true),
        AttentionShape::new(1, 8, 2, 54, 97, 128, true),
        AttentionShape::new(1, 4, 1, 577, 577, 64, true),
        AttentionShape::new(1, 2, 2, 97, 54, 128, false),
        // Sliding windows (decode past a block, prefill across tiles, a window of 1, one
        // past the context) and soft-caps (Gemma-2's 50, a tight one, without a window).
        AttentionShape::new(2, 8, 2, 1, 577, 128, true).with_window(Some(64)),
        AttentionShape::new(1, 8, 2, 97, 97, 64, true)
            .with_window(Some(16))
            .with_softcap(Some(50.0)),
        AttentionShape::new(1, 4, 1, 16, 577, 128, true)
            .with_window(Some(582))
            .with_softcap(Some(2.0)),
        AttentionShape::new(1, 4, 4, 1, 97, 64, true).with_window(Some(1)),
        AttentionShape::new(1, 4, 2, 54, 97, 64, false).with_softcap(Some(1.0)),
    ]);
    out
}

/// Every attention variant of the run's device (the tables' CPU rows, or their CUDA rows under
/// `--device cuda`) on every case.
pub fn check(ctx: &mut Ctx) -> Result<()> {
    let shapes = attention_cases(ctx.opts.cases, ctx.opts.seed);
    for (case, shape) in shapes.iter().enumerate() {
        let seed = derive_seed(ctx.opts.seed, case as u64);
        let mut r = rng(seed);
        // Every row of the attention and paged tables that runs on this device, as its
        // table's check specs for this case (their parameters drawn from the case's rng).
        let variants =
            registry::check_specs(registry::ATTENTION_TABLES, ctx.opts.device, case, &mut r);
        for &dtype in &ctx.opts.dtypes {
            let inputs = AttentionInputs::random(shape, dtype, seed);
            let want = attention(shape, &inputs);
            for v in &variants {
                let kernel = registry::attention_kernel(v)?;
                let outcome = kernel
                    .supports(shape, dtype, ctx.opts.device)
                    .map_err(|e| e.to_string())
                    .and_then(|_| {
                        let mut out = Buffer::poisoned(dtype, shape.q_elems());
                        kernel
                            .prepare(shape, &inputs)
                            .and_then(|mut p| p.run(&mut out))
                            .map_err(|e| e.to_string())?;
                        Ok(ErrorStats::compare(&out.to_f32(), &want))
                    });
                ctx.record(
                    "attention",
                    case,
                    &kernel.name(),
                    dtype,
                    shape.label(),
                    seed,
                    outcome,
                )?;
            }
        }
    }
    Ok(())
}
