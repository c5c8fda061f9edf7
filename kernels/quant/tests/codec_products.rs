//! The products of the codec formats (Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, Q8_K) at every ISA tier
//! this machine runs (`isa::runnable`; the others are named as skipped): the batch-1 GEMV and
//! the multi-token tile with f32 activations (B from 1 to 64, odd ones included) and the
//! int8-activation product, each against the f64 product of the dequantised weights with the
//! activation the variant multiplies (`activation_as_seen`), on NaN-poisoned outputs; NaN and
//! ±Inf activations make exactly their own batch entry's outputs non-finite; arbitrary
//! bytes (NaN/Inf scales) multiply without a panic.

use kernel_common::inputs::{normal_f32, rng};
use kernel_common::{tolerance, DType, ErrorStats};
use kernel_quant::{
    activation_as_seen, matmul, reference, supports, MatVecVariant, QuantMatrix, WeightDist,
    WeightFormat,
};
use proptest::prelude::*;

const FORMATS: [&str; 9] = [
    "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k",
];

/// Fused and FusedQ8 at every tier this process runs.
fn variants() -> Vec<MatVecVariant> {
    let mut v = vec![];
    for isa in kernel_cpu::isa::runnable() {
        v.push(MatVecVariant::Fused(Some(isa)));
        v.push(MatVecVariant::FusedQ8(Some(isa)));
    }
    v
}

fn check(m: &QuantMatrix, x: &[f32], batch: usize) {
    for v in variants() {
        supports(v, m.format).unwrap_or_else(|e| panic!("{} {v:?}: {e}", m.format));
        let want = reference::matmul(m, &activation_as_seen(v, m.format, x, m.cols), batch);
        let mut y = vec![f32::NAN; batch * m.rows];
        matmul(m, x, batch, &mut y, v).unwrap();
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
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn every_product_matches_the_reference(
        format in 0usize..FORMATS.len(), rows in 1usize..40, blocks in 1usize..4,
        batch in prop::sample::select(vec![1usize, 2, 3, 4, 5, 7, 8, 13, 17, 31, 64]),
        outliers in any::<bool>(), seed in any::<u64>(),
    ) {
        let f = WeightFormat::parse(FORMATS[format]).unwrap();
        // Rows of 1..3 super-blocks, or for the 32-value blocks 1..3 × 96 values (odd block counts).
        let cols = if f.block_values() == 256 { 256 * blocks } else { 96 * blocks };
        let dist = if outliers {
            WeightDist::Outliers { channels: 2, scale: 30.0 }
        } else {
            WeightDist::Gaussian
        };
        let w = dist.sample(rows, cols, seed);
        let m = QuantMatrix::quantize(f, rows, cols, &w).unwrap();
        let x = normal_f32(&mut rng(seed ^ 7), batch * cols, 1.0);
        check(&m, &x, batch);
    }
}

#[test]
fn large_shapes_take_every_path() {
    // Several tasks of 32 rows, a partial last task, a tail of < 4 rows, several column
    // chunks of the tile and a partial one.
    for name in FORMATS {
        let f = WeightFormat::parse(name).unwrap();
        let (rows, cols) = (133, 1280);
        let w = WeightDist::Gaussian.sample(rows, cols, 9);
        let m = QuantMatrix::quantize(f, rows, cols, &w).unwrap();
        for batch in [1, 6, 64] {
            let x = normal_f32(&mut rng(batch as u64), batch * cols, 1.0);
            check(&m, &x, batch);
        }
    }
}

#[test]
fn non_finite_activations_reach_only_their_own_outputs() {
    for name in FORMATS {
        let f = WeightFormat::parse(name).unwrap();
        let (rows, cols, batch) = (9, 512, 3);
        let m = QuantMatrix::quantize(f, rows, cols, &WeightDist::Gaussian.sample(rows, cols, 4))
            .unwrap();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = normal_f32(&mut rng(5), batch * cols, 1.0);
            x[cols + 300] = bad; // activation 1
            for v in variants() {
                let mut y = vec![0.0f32; batch * rows];
                matmul(&m, &x, batch, &mut y, v).unwrap();
                for (i, o) in y.iter().enumerate() {
                    assert_eq!(
                        o.is_finite(),
                        i / rows != 1,
                        "{name} {v:?} {bad}: output {i} = {o}"
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn arbitrary_bytes_multiply_without_panic(
        format in 0usize..FORMATS.len(), seed in any::<u64>(), batch in 1usize..6,
    ) {
        let f = WeightFormat::parse(FORMATS[format]).unwrap();
        let (rows, cols) = (5, 512);
        let mut bytes = vec![0u8; f.matrix_bytes(rows, cols).unwrap()];
        let mut r = rng(seed);
        rand::RngCore::fill_bytes(&mut r, &mut bytes);
        // Plant an f16 NaN and an Inf at the first two blocks' first field.
        bytes[..2].copy_from_slice(&[0x00, 0x7E]);
        bytes[f.block_bytes()..f.block_bytes() + 2].copy_from_slice(&[0x00, 0x7C]);
        let m = QuantMatrix::from_bytes(f, rows, cols, bytes).unwrap();
        let x = normal_f32(&mut rng(seed ^ 3), batch * cols, 1.0);
        for v in variants() {
            let mut y = vec![0.0f32; batch * rows];
            matmul(&m, &x, batch, &mut y, v).unwrap();
        }
    }
}
