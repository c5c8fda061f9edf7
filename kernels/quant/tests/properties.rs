//! Property tests of the quant family: round-trip error within half a stored step for every
//! width and group size, codes that never leave their range, all-zero and huge-outlier groups
//! without NaN, and every product variant (fused and int8-activation at every ISA tier this
//! machine runs — avx512, avx2, portable; the others named as skipped — dequant-GEMM, faer)
//! equal to the f64 reference of the dequantised weights on NaN-poisoned outputs.

use kernel_common::inputs::{normal_f32, rng};
use kernel_common::{tolerance, DType, ErrorStats};
use kernel_quant::group::{block_affine, raw_scale, stored_scale};
use kernel_quant::{
    activation_as_seen, matmul, reference, Isa, MatVecVariant, QuantMatrix, ScaleType, WeightDist,
    WeightFormat,
};
use proptest::prelude::*;
use std::sync::OnceLock;

fn group_format(asym: bool, bits: u8, group: usize, s32: bool) -> WeightFormat {
    let scale = if s32 { ScaleType::F32 } else { ScaleType::F16 };
    if asym {
        WeightFormat::Asym { bits, group, scale }
    } else {
        WeightFormat::Sym { bits, group, scale }
    }
}

/// Every variant at every tier this process runs (`isa::runnable` names the skipped ones).
fn variants() -> &'static [MatVecVariant] {
    static ALL: OnceLock<Vec<MatVecVariant>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut v = vec![
            MatVecVariant::Fused(None),
            MatVecVariant::FusedQ8(None),
            MatVecVariant::Dequant,
            MatVecVariant::Faer,
        ];
        for isa in kernel_cpu::isa::runnable() {
            v.push(MatVecVariant::Fused(Some(isa)));
            v.push(MatVecVariant::FusedQ8(Some(isa)));
        }
        v
    })
}

fn check_products(m: &QuantMatrix, batch: usize, seed: u64) {
    let x = normal_f32(&mut rng(seed), batch * m.cols, 1.0);
    for &v in variants() {
        if kernel_quant::supports(v, m.format).is_err() {
            continue;
        }
        // FusedQ8 multiplies the int8-quantised activation: the reference takes that one.
        let want = reference::matmul(m, &activation_as_seen(v, m.format, &x, m.cols), batch);
        let mut y = vec![f32::NAN; batch * m.rows];
        matmul(m, &x, batch, &mut y, v).unwrap();
        let stats = ErrorStats::compare(&y, &want);
        assert!(
            stats.passes(&tolerance(DType::F32).scaled_to(&want)),
            "{} {}x{} batch {batch} {v:?}: {stats:?}",
            m.format,
            m.rows,
            m.cols
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn round_trip_within_half_a_step(
        asym in any::<bool>(), bits in 2u8..=8, group in prop::sample::select(vec![1usize, 3, 7, 8, 32, 64, 128]),
        s32 in any::<bool>(), blocks in 1usize..4, rows in 1usize..4, seed in any::<u64>(),
    ) {
        let f = group_format(asym, bits, group, s32);
        let cols = group * blocks;
        let w = normal_f32(&mut rng(seed), rows * cols, 3.0);
        let m = QuantMatrix::quantize(f, rows, cols, &w).unwrap();
        let back = m.dequantize();
        let levels = if asym { (1u32 << bits) - 1 } else { (1u32 << (bits - 1)) - 1 } as f32;
        for r in 0..rows {
            for k in 0..blocks {
                let xs = &w[r * cols + k * group..r * cols + (k + 1) * group];
                let ys = &back[r * cols + k * group..r * cols + (k + 1) * group];
                let raw = raw_scale(f, xs);
                let stored = stored_scale(raw, f_scale(f));
                let at = k * f.block_bytes();
                let (s, zero) = block_affine(f, &m.row(r)[at..at + f.block_bytes()]);
                prop_assert_eq!(s, stored);
                prop_assert!((0..1 << bits).contains(&zero));
                // Half a stored step, plus what rounding the scale moved the range's edge.
                let bound = 0.5 * stored + levels * (raw - stored).abs() + 1e-6 * raw.max(1e-30);
                for (x, y) in xs.iter().zip(ys) {
                    prop_assert!((x - y).abs() <= bound, "{f}: {x} -> {y}, bound {bound}");
                }
            }
        }
    }

    #[test]
    fn every_variant_matches_the_reference(
        name in prop::sample::select(vec![
            "f32", "f16", "q8_0", "q4_0", "q4_1", "sym4g32", "asym4g64", "sym4g128s32",
            "sym8g32", "asym8g16", "sym2g32", "sym2g64", "asym2g128", "asym3g64", "sym5g8", "asym6g7",
            "bf16", "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k",
        ]),
        rows in 1usize..70, blocks in 1usize..6, batch in prop::sample::select(vec![1usize, 2, 3, 9]),
        outliers in any::<bool>(), seed in any::<u64>(),
    ) {
        let f = WeightFormat::parse(name).unwrap();
        let cols = f.block_values().max(32) / f.block_values() * f.block_values() * blocks;
        let dist = if outliers { WeightDist::Outliers { channels: 2, scale: 40.0 } } else { WeightDist::Gaussian };
        let w = dist.sample(rows, cols, seed);
        let m = QuantMatrix::quantize(f, rows, cols, &w).unwrap();
        check_products(&m, batch, seed ^ 1);
    }
}

fn f_scale(f: WeightFormat) -> ScaleType {
    match f {
        WeightFormat::Sym { scale, .. } | WeightFormat::Asym { scale, .. } => scale,
        _ => unreachable!(),
    }
}

#[test]
fn zero_and_outlier_groups_stay_finite() {
    for name in [
        "q8_0", "q4_0", "q4_1", "sym4g32", "asym4g32", "sym2g32", "asym8g32",
    ] {
        let f = WeightFormat::parse(name).unwrap();
        let (rows, cols) = (4, 128);
        let mut w = normal_f32(&mut rng(3), rows * cols, 1.0);
        w[..32].fill(0.0); // an all-zero group
        w[32 + 5] = 3.0e4; // one huge outlier among small values
        w[64..96].fill(1e-9); // values far below f16's smallest subnormal scale
        let m = QuantMatrix::quantize(f, rows, cols, &w).unwrap();
        let back = m.dequantize();
        assert!(back.iter().all(|v| v.is_finite()), "{name}");
        assert!(back[..32].iter().all(|v| *v == 0.0), "{name}: zero group");
        assert!(
            (back[37] - 3.0e4).abs() / 3.0e4 < 0.01,
            "{name}: outlier kept, got {}",
            back[37]
        );
        check_products(&m, 1, 5);
        check_products(&m, 4, 6);
    }
}

#[test]
fn large_shapes_take_every_path() {
    // Many rows (several GEMV tasks, a partial last task, a tail of < 4 rows) and a GEMM with
    // a partial row tile and a partial column tile.
    for name in [
        "f32",
        "f16",
        "q4_0",
        "q4_1",
        "q8_0",
        "sym4g64",
        "asym4g128",
        "sym3g32",
        "asym2g64",
        "sym8g16",
        "bf16",
        "q5_0",
        "q5_1",
        "iq4_nl",
        "q2_k",
        "q3_k",
        "q4_k",
        "q5_k",
        "q6_k",
        "q8_k",
    ] {
        let f = WeightFormat::parse(name).unwrap();
        let cols = if f.block_values() == 256 { 768 } else { 640 };
        let rows = 133;
        let w = WeightDist::Gaussian.sample(rows, cols, 9);
        let m = QuantMatrix::quantize(f, rows, cols, &w).unwrap();
        check_products(&m, 1, 11);
        check_products(&m, 5, 12);
    }
}

#[test]
fn bad_calls_are_errors() {
    let m = QuantMatrix::quantize(WeightFormat::Q4_0, 2, 32, &[0.5; 64]).unwrap();
    let mut y = vec![0.0; 2];
    assert!(matmul(&m, &[1.0; 31], 1, &mut y, MatVecVariant::Dequant).is_err());
    assert!(matmul(&m, &[1.0; 32], 0, &mut y, MatVecVariant::Dequant).is_err());
    assert!(matmul(&m, &[1.0; 64], 2, &mut y, MatVecVariant::Dequant).is_err());
    let e = matmul(&m, &[1.0; 32], 1, &mut y, MatVecVariant::Faer).unwrap_err();
    assert!(e.to_string().contains("faer multiplies f32 weights"), "{e}");
    let sym3 =
        QuantMatrix::quantize(WeightFormat::parse("sym3g32").unwrap(), 2, 32, &[0.5; 64]).unwrap();
    let e = matmul(&sym3, &[1.0; 32], 1, &mut y, MatVecVariant::FusedQ8(None)).unwrap_err();
    assert!(e.to_string().contains("act=q8"), "{e}");
    // A tier this CPU lacks is refused by name, never silently narrowed.
    for isa in Isa::ALL.into_iter().filter(|i| !i.supported()) {
        let e = matmul(&m, &[1.0; 32], 1, &mut y, MatVecVariant::Fused(Some(isa))).unwrap_err();
        assert!(e.to_string().contains("lacks"), "{e}");
    }
    assert!(
        QuantMatrix::quantize(WeightFormat::parse("sym4g30").unwrap(), 1, 32, &[0.0; 32]).is_err()
    );
}
