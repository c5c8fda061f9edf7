//! Property tests of the ggml codecs added beside Q8_0/Q4_0/Q4_1 (Q5_0, Q5_1, IQ4_NL, Q2_K,
//! Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, bf16): random rows round-trip within a per-format error
//! bound, and the K-quants' final codes are the nearest under the scales they stored;
//! adversarial rows (zeros, constants, one outlier, tiny values, values up to and beyond the
//! f16 scale limit) stay finite or are refused with a one-line error; decoding arbitrary
//! bytes — NaN/Inf f16 scales, sub-block scales at their extremes — never panics and always
//! equals the f64 field-by-field reference rounded to f32.

use kernel_common::inputs::{normal_f32, rng};
use kernel_quant::codecs::unpack_block;
use kernel_quant::matrix::decode_block;
use kernel_quant::reference_blocks::stored_value;
use kernel_quant::{QuantMatrix, WeightFormat};
use proptest::prelude::*;

/// (format, max |error| / max |x| per 256 values, rms error / rms x per 256 values of
/// Gaussian rows). The bounds are ~1.3× the worst seen over 200 Gaussian and 200
/// outlier-channel 4 × 512 matrices, and match the formats' steps where those are plain:
/// Q8_K half of max / 127 (0.0039), Q5_0 one step of 2·max / 32 on the side the largest
/// magnitude does not set (0.0625), bf16 half an ulp of 8 bits (0.0039).
const CODECS: [(&str, f64, f64); 10] = [
    ("q5_0", 0.065, 0.07),
    ("q5_1", 0.045, 0.06),
    ("iq4_nl", 0.13, 0.12),
    ("q2_k", 0.48, 0.47),
    ("q3_k", 0.28, 0.24),
    ("q4_k", 0.105, 0.11),
    ("q5_k", 0.07, 0.056),
    ("q6_k", 0.022, 0.028),
    ("q8_k", 0.0045, 0.0135),
    ("bf16", 0.004, 0.004),
];

fn format(name: &str) -> WeightFormat {
    WeightFormat::parse(name).unwrap()
}

/// Values per row for `blocks` blocks, at least 256 so every bound is per 256 values.
fn cols_for(f: WeightFormat, blocks: usize) -> usize {
    256usize.max(f.block_values()) * blocks
}

/// Checks the per-256 bounds of `name` on `x` and its round trip `y` (the rms one when given:
/// an outlier inflates every step of its block, so the rms error is then judged by the max).
fn assert_bounded(name: &str, max_frac: f64, rms_frac: Option<f64>, x: &[f32], y: &[f32]) {
    for (c, (xs, ys)) in x.chunks(256).zip(y.chunks(256)).enumerate() {
        let amax = xs.iter().fold(0.0f64, |m, &v| m.max(v.abs() as f64));
        let rms = (xs.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / xs.len() as f64).sqrt();
        let mut e2 = 0.0f64;
        for (k, (&a, &b)) in xs.iter().zip(ys).enumerate() {
            let e = (a as f64 - b as f64).abs();
            assert!(
                e <= max_frac * amax,
                "{name} chunk {c} value {k}: {a} -> {b}, error {e:e} > {max_frac} × {amax:e}"
            );
            e2 += e * e;
        }
        let erms = (e2 / xs.len() as f64).sqrt();
        if let Some(rms_frac) = rms_frac {
            assert!(
                erms <= rms_frac * rms,
                "{name} chunk {c}: rms error {erms:e} > {rms_frac} × {rms:e}"
            );
        }
    }
}

/// For the K-quants (and Q8_K): every value whose code is not at an end of its range is
/// within half a stored step (|a| of its sub-block) of x — the codes were re-chosen against
/// the stored scales.
fn assert_nearest_codes(f: WeightFormat, m: &QuantMatrix, x: &[f32]) {
    let range = match f {
        WeightFormat::Q2_K => (0, 3),
        WeightFormat::Q3_K => (-4, 3),
        WeightFormat::Q4_K => (0, 15),
        WeightFormat::Q5_K => (0, 31),
        WeightFormat::Q6_K => (-32, 31),
        WeightFormat::Q8_K => (-128, 127),
        _ => return,
    };
    let bb = f.block_bytes();
    for r in 0..m.rows {
        for (k, b) in m.row(r).chunks_exact(bb).enumerate() {
            let u = unpack_block(f, b).expect("a codec");
            for v in 0..256 {
                let xv = x[r * m.cols + k * 256 + v] as f64;
                let (a, q) = (u.a(v / 16) as f64, u.q[v] as i32);
                if a == 0.0 || q == range.0 || q == range.1 {
                    continue;
                }
                let got = stored_value(f, b, v).unwrap();
                let e = (xv - got).abs();
                let half = 0.5 * a.abs() * (1.0 + 1e-5) + 1e-6 * xv.abs();
                assert!(
                    e <= half,
                    "{f} row {r} block {k} value {v}: code {q} gives {got}, x = {xv}, error {e:e} > half step {half:e}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_rows_round_trip_within_bounds(
        codec in 0usize..CODECS.len(), rows in 1usize..4, blocks in 1usize..3,
        exp in -1.0f64..3.0, outliers in any::<bool>(), seed in any::<u64>(),
    ) {
        let (name, max_frac, rms_frac) = CODECS[codec];
        let f = format(name);
        let cols = cols_for(f, blocks);
        let mut w = normal_f32(&mut rng(seed), rows * cols, 10f64.powf(exp) as f32);
        if outliers {
            for row in w.chunks_mut(cols) {
                row[seed as usize % cols] *= 30.0;
            }
        }
        let m = QuantMatrix::quantize(f, rows, cols, &w).unwrap();
        let back = m.dequantize();
        assert_bounded(name, max_frac, (!outliers).then_some(rms_frac), &w, &back);
        assert_nearest_codes(f, &m, &w);
    }

    #[test]
    fn arbitrary_bytes_decode_like_the_f64_reference(
        codec in 0usize..CODECS.len(), bytes in prop::collection::vec(any::<u8>(), 292),
        special in 0usize..6, at in 0usize..292,
    ) {
        let f = format(CODECS[codec].0);
        let bb = f.block_bytes();
        let mut b = bytes[..bb].to_vec();
        // Plant an f16 NaN, ±Inf, the largest f16, a subnormal, or extreme scale bytes at an
        // even offset (every f16 field of these layouts is 2-aligned).
        let at = (at % bb) & !1;
        let planted: [u8; 2] = match special {
            0 => [0x00, 0x7E],
            1 => [0x00, 0x7C],
            2 => [0x00, 0xFC],
            3 => [0xFF, 0x7B],
            4 => [0x01, 0x00],
            _ => [0xFF, 0xFF],
        };
        b[at..at + 2].copy_from_slice(&planted);
        let bv = f.block_values();
        let mut out = vec![0.0f32; bv];
        decode_block(f, &b, &mut vec![0; bv], &mut out);
        for (v, &got) in out.iter().enumerate() {
            let want = stored_value(f, &b, v).unwrap() as f32;
            prop_assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{f} value {v}: {got} vs f64 reference {want}"
            );
        }
        let m = QuantMatrix::from_bytes(f, 1, bv, b).unwrap();
        prop_assert_eq!(m.dequantize().len(), bv);
    }
}

#[test]
fn adversarial_rows() {
    for (name, max_frac, _) in CODECS {
        let f = format(name);
        let cols = cols_for(f, 2);
        let quantize = |w: &[f32]| {
            QuantMatrix::quantize(f, 1, cols, w)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .dequantize()
        };
        // Zeros stay exact zeros.
        assert!(
            quantize(&vec![0.0; cols]).iter().all(|v| *v == 0.0),
            "{name}"
        );
        // Constants (positive, negative, large) within the bound.
        for c in [1.25f32, -0.75, 3.0e3, 1.0e-2] {
            let y = quantize(&vec![c; cols]);
            for v in &y {
                assert!(
                    ((v - c).abs() as f64) <= max_frac * c.abs() as f64,
                    "{name} constant {c}: {v}"
                );
            }
        }
        // One outlier among small values: kept, the rest bounded by its magnitude.
        let mut w = normal_f32(&mut rng(1), cols, 0.01);
        w[37] = 1.0e3;
        let y = quantize(&w);
        assert!(
            ((y[37] - 1.0e3).abs() as f64) <= max_frac * 1.0e3,
            "{name} outlier: {}",
            y[37]
        );
        assert!(y.iter().all(|v| v.is_finite()), "{name}");
        // Tiny values (below f16's subnormals once divided into scales): finite, no larger
        // than the values themselves.
        for tiny in [1e-9f32, 1e-30, f32::MIN_POSITIVE] {
            let w: Vec<f32> = (0..cols).map(|i| tiny * ((i % 7) as f32 - 3.0)).collect();
            let y = quantize(&w);
            for (a, b) in w.iter().zip(&y) {
                assert!(
                    b.is_finite() && b.abs() <= 3.0 * tiny * 1.01,
                    "{name} tiny {tiny}: {a} -> {b}"
                );
            }
        }
    }
}

#[test]
fn scales_up_to_the_f16_limit_and_beyond() {
    // Grow a Gaussian row by powers of 2: while every scale fits f16 the round trip is
    // bounded and finite; past it the quantiser refuses with the one-line reason.
    for (name, max_frac, rms_frac) in CODECS {
        let f = format(name);
        let cols = cols_for(f, 1);
        let base = normal_f32(&mut rng(5), cols, 1.0);
        let (mut ok, mut refused) = (0, 0);
        for p in (0..=128).step_by(2) {
            let w: Vec<f32> = base.iter().map(|v| v * 2f32.powi(p)).collect();
            if w.iter().any(|v| !v.is_finite()) {
                break;
            }
            match QuantMatrix::quantize(f, 1, cols, &w) {
                Ok(m) => {
                    assert_eq!(
                        refused, 0,
                        "{name}: 2^{p} stored after a smaller scale was refused"
                    );
                    let y = m.dequantize();
                    assert!(y.iter().all(|v| v.is_finite()), "{name} 2^{p}");
                    assert_bounded(name, max_frac, Some(rms_frac), &w, &y);
                    ok += 1;
                }
                Err(e) => {
                    let e = e.to_string();
                    assert!(e.contains("65504") || e.contains("bf16"), "{name}: {e}");
                    assert!(!e.contains('\n'), "{name}: {e}");
                    refused += 1;
                }
            }
        }
        assert!(ok > 5, "{name}: only {ok} scales stored");
        // Q8_K's scale is f32 and bf16's range is f32's: only the f16-scaled ones refuse.
        assert_eq!(
            refused > 0,
            !matches!(name, "q8_k" | "bf16"),
            "{name}: {refused} refused"
        );
    }
}

#[test]
fn a_matrix_of_k_quants_refuses_rows_that_are_not_whole_super_blocks() {
    for name in ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k"] {
        let e = QuantMatrix::quantize(format(name), 1, 576, &[0.5; 576]).unwrap_err();
        assert!(
            e.to_string()
                .contains("multiple of the block/group size 256"),
            "{e}"
        );
        let e = QuantMatrix::from_bytes(format(name), 2, 512, vec![0; 10]).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
    }
}
