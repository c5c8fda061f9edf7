//! Byte-exactness against llama.cpp itself: rows of the real SmolLM2-135M checkpoint that
//! `llama-quantize` requantised to every ggml type we read (tests/data/llama_*.safetensors,
//! written by make_llama_vectors.py). For each tensor, `x` is what llama-quantize quantised
//! (the Q4_1/Q8_0 source rows dequantised), `q` the bytes it wrote and `out` the `gguf`
//! package's dequantisation of them: our encoder must write `q` byte for byte, our decoder
//! give `out` bit for bit, the f64 field-by-field reference round to our decoder, and the
//! fused products on those bytes match the f64 product of gguf's floats.

use kernel_quant::{matmul, reference_blocks, supports, MatVecVariant, QuantMatrix, WeightFormat};
use safetensors::{Dtype, SafeTensors};

/// Every format with llama-quantize vectors.
const FORMATS: [&str; 10] = [
    "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "q5_0", "q5_1", "q4_0", "q8_0",
];

struct Tensor {
    name: String,
    rows: usize,
    cols: usize,
    x: Vec<f32>,
    q: Vec<u8>,
    out: Vec<f32>,
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn load(format: &str) -> (WeightFormat, Vec<Tensor>) {
    let path = format!(
        "{}/tests/data/llama_{format}.safetensors",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(&path).expect("committed vector");
    let (_, meta) = SafeTensors::read_metadata(&bytes).expect("valid safetensors");
    let meta = meta.metadata().clone().expect("metadata");
    assert_eq!(meta["family"], "quant");
    assert!(meta["generator"].starts_with("llama-quantize"));
    let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let mut names: Vec<String> = st
        .names()
        .iter()
        .filter_map(|n| n.strip_prefix("x:").map(str::to_string))
        .collect();
    names.sort();
    let tensors = names
        .into_iter()
        .map(|name| {
            let x = st.tensor(&format!("x:{name}")).unwrap();
            let q = st.tensor(&format!("q:{name}")).unwrap();
            let out = st.tensor(&format!("out:{name}")).unwrap();
            assert_eq!(
                (x.dtype(), q.dtype(), out.dtype()),
                (Dtype::F32, Dtype::U8, Dtype::F32)
            );
            Tensor {
                rows: x.shape()[0],
                cols: x.shape()[1],
                x: f32s(x.data()),
                q: q.data().to_vec(),
                out: f32s(out.data()),
                name,
            }
        })
        .collect();
    (WeightFormat::parse(&meta["format"]).unwrap(), tensors)
}

#[test]
fn encoder_writes_llama_quantizes_bytes() {
    for name in FORMATS {
        let (format, tensors) = load(name);
        assert_eq!(format.to_string(), name);
        assert!(!tensors.is_empty(), "{name}");
        for t in &tensors {
            let m = QuantMatrix::quantize(format, t.rows, t.cols, &t.x).unwrap();
            assert_eq!(m.bytes().len(), t.q.len(), "{name} {}", t.name);
            if let Some(i) = m.bytes().iter().zip(&t.q).position(|(a, b)| a != b) {
                let rb = format.row_bytes(t.cols);
                panic!(
                    "{name} {}: byte {i} (row {}, block {}, byte {} of it) is {:#04x}, llama-quantize wrote {:#04x}",
                    t.name,
                    i / rb,
                    i % rb / format.block_bytes(),
                    i % rb % format.block_bytes(),
                    m.bytes()[i],
                    t.q[i]
                );
            }
        }
    }
}

#[test]
fn decoder_gives_ggufs_floats_and_the_f64_reference_rounded() {
    for name in FORMATS {
        let (format, tensors) = load(name);
        for t in &tensors {
            let m = QuantMatrix::from_bytes(format, t.rows, t.cols, t.q.clone()).unwrap();
            let ours = m.dequantize();
            for (i, (a, b)) in ours.iter().zip(&t.out).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{name} {}: value {i}: {a} vs gguf {b}",
                    t.name
                );
            }
            for r in 0..t.rows {
                let exact = reference_blocks::stored_row(format, m.row(r)).unwrap();
                for (k, e) in exact.iter().enumerate() {
                    assert_eq!(
                        ours[r * t.cols + k],
                        *e as f32,
                        "{name} {} ({r}, {k})",
                        t.name
                    );
                }
            }
        }
    }
}

#[test]
fn fused_products_on_llama_bytes_match_the_reference() {
    for name in FORMATS {
        let (format, tensors) = load(name);
        for t in &tensors {
            let m = QuantMatrix::from_bytes(format, t.rows, t.cols, t.q.clone()).unwrap();
            let x: Vec<f32> = (0..t.cols)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
                .collect();
            // The reference from gguf's dequantised floats, not ours.
            let want: Vec<f64> = (0..t.rows)
                .map(|r| {
                    (0..t.cols)
                        .map(|k| t.out[r * t.cols + k] as f64 * x[k] as f64)
                        .sum()
                })
                .collect();
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for isa in kernel_cpu::isa::runnable() {
                let v = MatVecVariant::Fused(Some(isa));
                if supports(v, format).is_err() {
                    continue;
                }
                let mut y = vec![f32::NAN; t.rows];
                matmul(&m, &x, 1, &mut y, v).unwrap();
                for (r, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (*a as f64 - b).abs() <= 1e-5 * (scale + b.abs()),
                        "{name} {} {isa:?} row {r}: {a} vs {b}",
                        t.name
                    );
                }
            }
        }
    }
}
