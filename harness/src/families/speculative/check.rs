//! `harness check --family speculative`: tree attention (speculative decoding's one pass over a
//! draft tree) on `kernel_speculative::cases` — random trees of 1..=48 nodes over a paged pool with a shuffled block table
//! (MHA/GQA/MQA, odd head dims, block sizes 1..=32, contexts 0..=300 ending mid-block), with
//! the queries of every node or of the deepest half only (a drafter's level-by-level pass),
//! then the edge cases (root alone over an empty context, a long chain, a static tree, and
//! windowed / soft-capped ones), each on NaN-poisoned output against the f64 reference that
//! walks parent pointers. A third of the random cases take a sliding window (measured in
//! positions, ctx + depth for nodes; the context before every query's window NaN, never
//! read) and a quarter a logit soft-cap.

use crate::checking::Ctx;
use crate::error::Result;
use kernel_attention::shape::options_label;
use kernel_common::inputs::derive_seed;
use kernel_common::{tolerance, DType, ErrorStats};
use kernel_speculative::cases::cases;
use kernel_speculative::tree_attention_reference;

/// Runs the spec cases; rows go through `ctx` like every family's.
pub fn check(ctx: &mut Ctx) -> Result<()> {
    // The rows of the spec table that run on this device, as their check specs.
    let kernels = crate::registry::case_free_variants(
        "speculative",
        &[kernel_speculative::VARIANTS],
        ctx.opts.device,
    )?;
    for (i, c) in cases(ctx.opts.cases, ctx.opts.seed).iter().enumerate() {
        let seed = derive_seed(ctx.opts.seed ^ 0x5EC, i as u64);
        let n = c.tree.len();
        let built = c.build(seed);
        let (shape, q, at) = (built.shape, &built.q, built.context(c));
        let want = tree_attention_reference(&shape, &at, q)?;
        let outcomes: Vec<_> = kernels
            .iter()
            .map(|(name, kernel)| {
                let outcome = kernel(&shape, &at, q)
                    .map(|out| ErrorStats::compare(&out, &want))
                    .map_err(|e| e.to_string());
                (name.clone(), outcome)
            })
            .collect();
        let label = format!(
            "h{}/{} d{} bs{} ctx{} tree{}{} (height {}){}",
            c.q_heads,
            c.kv_heads,
            c.head_dim,
            c.block_size,
            c.ctx,
            n,
            if c.late_half { " late half" } else { "" },
            c.tree.height(),
            options_label(c.window, c.softcap)
        );
        for (name, outcome) in outcomes {
            ctx.record_with(
                "speculative",
                i,
                &name,
                DType::F32,
                tolerance(DType::F32).scaled_to(&want),
                label.clone(),
                seed,
                outcome,
            )?;
        }
    }
    Ok(())
}
