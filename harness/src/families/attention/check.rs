//! `harness check --family attention`: `kernel_attention::cases::check_cases` (random shapes,
//! then the DESIGN.md edge cases and windowed / soft-capped ones), every row of the attention
//! and paged tables for the run's device as its check specs, on NaN-poisoned output against
//! the f64 reference; paged variants run here too, through the same trait.

use crate::checking::Ctx;
use crate::error::Result;
use crate::registry;
use kernel_attention::reference::attention;
use kernel_attention::AttentionInputs;
use kernel_common::inputs::{derive_seed, rng};
use kernel_common::{tolerance, Buffer, ErrorStats};

/// Every attention variant of the run's device (the tables' CPU rows, or their CUDA rows under
/// `--device cuda`) on every case.
pub fn check(ctx: &mut Ctx) -> Result<()> {
    let shapes = kernel_attention::cases::check_cases(ctx.opts.cases, ctx.opts.seed);
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
                ctx.record_with(
                    "attention",
                    case,
                    &kernel.name(),
                    dtype,
                    tolerance(dtype).at_peak(&want),
                    shape.label(),
                    seed,
                    outcome,
                )?;
            }
        }
    }
    Ok(())
}
