//! `harness check --family quant`: every product variant on `kernel_quant::cases` (random
//! weight formats, shapes, batch sizes and weight distributions, then the edge cases);
//! outputs NaN-poisoned, compared with the f64 product of the dequantised weights under the f32
//! tolerance scaled to the output's magnitude. The fused kernels run at every ISA tier the run
//! allows (`fused:isa=avx512|avx2|portable`, the same with `act=q8`, and `packed`), so one `check` covers
//! every path this machine has; a tier it lacks or `--isa` excludes is named once on stderr.

use crate::checking::Ctx;
use crate::error::Result;
use crate::registry;
use kernel_common::inputs::{derive_seed, normal_f32, rng};
use kernel_common::{tolerance, DType, ErrorStats};
use kernel_quant::cases::cases;
use kernel_quant::{matmul, reference, supports, QuantMatrix};

/// Runs the quant cases; rows go through `ctx` like every family's.
pub fn check(ctx: &mut Ctx) -> Result<()> {
    // Every row of the quant table for this device, as its check specs (the fused and
    // packed products at every tier this run allows).
    let variants =
        registry::case_free_variants("quant", &[kernel_quant::VARIANTS], ctx.opts.device)?;
    for (i, case) in cases(ctx.opts.cases, ctx.opts.seed).iter().enumerate() {
        let seed = derive_seed(ctx.opts.seed ^ 0x0AA7, i as u64);
        let w = case.weights(seed);
        let label = format!(
            "{}x{} b{} {}{}",
            case.rows,
            case.cols,
            case.batch,
            case.format,
            if case.hostile { " zero+outlier" } else { "" }
        );
        let m = QuantMatrix::quantize(case.format, case.rows, case.cols, &w)?;
        let x = normal_f32(&mut rng(seed ^ 1), case.batch * case.cols, 1.0);
        for (name, variant) in &variants {
            let variant = *variant;
            if supports(variant, case.format).is_err() {
                continue;
            }
            let seen = kernel_quant::activation_as_seen(variant, case.format, &x, case.cols);
            let want = reference::matmul(&m, &seen, case.batch);
            let tol = tolerance(DType::F32).scaled_to(&want);
            let mut y = vec![f32::NAN; case.batch * case.rows];
            let outcome = matmul(&m, &x, case.batch, &mut y, variant)
                .map(|_| ErrorStats::compare(&y, &want))
                .map_err(|e| e.to_string());
            ctx.record_with(
                "quant",
                i,
                name,
                DType::F32,
                tol,
                label.clone(),
                seed,
                outcome,
            )?;
        }
    }
    Ok(())
}
