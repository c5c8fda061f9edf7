//! `harness check --family quant`: every product variant on random weight formats (every
//! width 2..=8, symmetric and asymmetric, random group sizes and scale types, every ggml block
//! — Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and the K-quants Q2_K..Q8_K — f32/f16/bf16), random
//! shapes and batch sizes, Gaussian or outlier weights, then edge cases
//! (all-zero groups, one huge outlier among tiny values, one row, one block, batch 64);
//! outputs NaN-poisoned, compared with the f64 product of the dequantised weights under the f32
//! tolerance scaled to the output's magnitude. The fused kernels run at every ISA tier the run
//! allows (`fused:isa=avx512|avx2|portable`, the same with `act=q8`, and `packed`), so one `check` covers
//! every path this machine has; a tier it lacks or `--isa` excludes is named once on stderr.

use crate::checking::Ctx;
use crate::error::Result;
use crate::registry;
use kernel_common::inputs::{derive_seed, normal_f32, rng};
use kernel_common::{tolerance, DType, ErrorStats};
use quant_kernels::{
    matmul, reference, supports, MatVecVariant, QuantMatrix, ScaleType, WeightDist, WeightFormat,
};
use rand::Rng;

/// The variants checked: every row of the quant table that runs on `device`, as its check
/// specs (the fused and packed products at every tier this run allows).
fn variants(device: kernel_common::Device) -> Result<Vec<(String, MatVecVariant)>> {
    let mut none = rand::rngs::mock::StepRng::new(0, 0);
    registry::check_specs(&[quant_kernels::VARIANTS], device, 0, &mut none)
        .iter()
        .map(|spec| registry::quant_variant(spec))
        .collect()
}

/// One check case: a format, a matrix shape, a batch and how weights are drawn.
struct Case {
    format: WeightFormat,
    rows: usize,
    cols: usize,
    batch: usize,
    dist: WeightDist,
    /// Overwrite group 0 of every row with zeros and put one 3e4 outlier among 1e-9 values.
    hostile: bool,
}

fn random_format(r: &mut impl Rng) -> WeightFormat {
    let scale = if r.gen_bool(0.3) {
        ScaleType::F32
    } else {
        ScaleType::F16
    };
    let bits = r.gen_range(2..=8u8);
    let group = [16, 32, 64, 128, r.gen_range(1..=96)][r.gen_range(0..5)];
    const GGML: [WeightFormat; 13] = [
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q5_0,
        WeightFormat::Q5_1,
        WeightFormat::IQ4_NL,
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
        WeightFormat::Q8_K,
        WeightFormat::BF16,
    ];
    match r.gen_range(0..10) {
        0 => WeightFormat::F32,
        1 => WeightFormat::F16,
        2..=5 => GGML[r.gen_range(0..GGML.len())],
        6 | 7 => WeightFormat::Sym { bits, group, scale },
        _ => WeightFormat::Asym { bits, group, scale },
    }
}

fn cases(n: usize, seed: u64) -> Vec<Case> {
    let mut r = rng(seed ^ 0x0AA7);
    let mut out = vec![];
    for _ in 0..n {
        let format = random_format(&mut r);
        let block = format.block_values().max(1);
        let per_row = (r.gen_range(16..=700) / block).max(1);
        out.push(Case {
            format,
            rows: r.gen_range(1..=200),
            cols: block * per_row,
            batch: [1, 1, 2, 3, 5, 8, 64][r.gen_range(0..7)],
            dist: if r.gen_bool(0.5) {
                WeightDist::Gaussian
            } else {
                WeightDist::Outliers {
                    channels: 3,
                    scale: 50.0,
                }
            },
            hostile: false,
        });
    }
    let f = |s: &str| WeightFormat::parse(s).expect("known format");
    let edge = |format, rows, cols, batch, hostile| Case {
        format,
        rows,
        cols,
        batch,
        dist: WeightDist::Gaussian,
        hostile,
    };
    out.extend([
        edge(f("q4_0"), 67, 256, 1, true),
        edge(f("q4_1"), 67, 256, 3, true),
        edge(f("q8_0"), 9, 128, 64, true),
        edge(f("sym4g32"), 33, 96, 1, true),
        edge(f("asym2g64"), 5, 128, 2, true),
        edge(f("sym3g128"), 130, 384, 4, true),
        edge(f("asym8g32s32"), 1, 32, 1, false),
        edge(f("q4_0"), 1, 32, 64, false),
        edge(f("sym7g5"), 3, 5, 1, false),
    ]);
    // Every codec format at a GEMV, an odd tile and a full 64-activation tile, with the zero
    // group + outlier rows.
    for (i, format) in [
        "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k",
    ]
    .into_iter()
    .enumerate()
    {
        let cols = f(format).block_values().max(32) * 3;
        out.push(edge(f(format), 37 + i, cols, 1, true));
        out.push(edge(f(format), 70, 2 * cols, 7, i % 2 == 0));
        out.push(edge(f(format), 5, cols, 64, false));
    }
    // The CUDA GEMV's formats at its batch sizes (the CPU variants run them too).
    for (i, format) in ["f16", "sym4g32", "q4_0", "q8_0"].into_iter().enumerate() {
        out.push(edge(f(format), 257, 4096, [1, 3, 8, 2][i], i % 2 == 0));
        out.push(edge(f(format), 5, 32, 8 - i, false));
    }
    out
}

/// Runs the quant cases; rows go through `ctx` like every family's.
pub fn check(ctx: &mut Ctx) -> Result<()> {
    let variants = variants(ctx.opts.device)?;
    for (i, case) in cases(ctx.opts.cases, ctx.opts.seed).iter().enumerate() {
        let seed = derive_seed(ctx.opts.seed ^ 0x0AA7, i as u64);
        let mut w = case.dist.sample(case.rows, case.cols, seed);
        if case.hostile {
            let g = case.format.block_values().max(32).min(case.cols);
            for row in w.chunks_mut(case.cols) {
                row[..g].fill(0.0);
                if case.cols >= 2 * g {
                    row[g..2 * g].fill(1e-9);
                    row[g + 1] = 3.0e4;
                }
            }
        }
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
            let seen = quant_kernels::activation_as_seen(variant, case.format, &x, case.cols);
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
