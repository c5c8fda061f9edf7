//! Byte-exactness against the reference encoder: the committed vectors in tests/data were
//! written by the `gguf` package's quantisers (llama.cpp's Python port; see make_vectors.py):
//! Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and BF16. (The K-quants and IQ4_NL, which gguf does not
//! quantise, are checked against llama-quantize in llama_vectors.rs.)
//! Our encoder must produce the same bytes, our decoder the same floats, and the fused GEMV on
//! those bytes must match the f64 product of gguf's dequantised weights.

use kernel_quant::{matmul, reference, MatVecVariant, QuantMatrix, WeightFormat};
use safetensors::{Dtype, SafeTensors};

/// The formats `gguf.quants` quantises.
const GGUF: [&str; 6] = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "bf16"];

struct Vector {
    format: WeightFormat,
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

fn load(name: &str) -> Vector {
    let path = format!(
        "{}/tests/data/gguf_{name}.safetensors",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(&path).expect("committed vector");
    let (_, meta) = SafeTensors::read_metadata(&bytes).expect("valid safetensors");
    let meta = meta.metadata().clone().expect("metadata");
    assert_eq!(meta["family"], "quant");
    assert!(meta["generator"].starts_with("gguf "));
    let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let x = st.tensor("x").unwrap();
    let q = st.tensor("q").unwrap();
    let out = st.tensor("out").unwrap();
    assert_eq!(
        (x.dtype(), q.dtype(), out.dtype()),
        (Dtype::F32, Dtype::U8, Dtype::F32)
    );
    Vector {
        format: WeightFormat::parse(&meta["format"]).unwrap(),
        rows: x.shape()[0],
        cols: x.shape()[1],
        x: f32s(x.data()),
        q: q.data().to_vec(),
        out: f32s(out.data()),
    }
}

#[test]
fn encoder_and_decoder_match_gguf_byte_for_byte() {
    for name in GGUF {
        let v = load(name);
        assert_eq!(v.format.to_string(), name);
        let m = QuantMatrix::quantize(v.format, v.rows, v.cols, &v.x).unwrap();
        if let Some(i) = m.bytes().iter().zip(&v.q).position(|(a, b)| a != b) {
            panic!(
                "{name}: byte {i} (row {}, block {}) is {:#04x}, gguf wrote {:#04x}",
                i / v.format.row_bytes(v.cols),
                i % v.format.row_bytes(v.cols) / v.format.block_bytes(),
                m.bytes()[i],
                v.q[i]
            );
        }
        assert_eq!(m.bytes().len(), v.q.len());
        let adopted = QuantMatrix::from_bytes(v.format, v.rows, v.cols, v.q.clone()).unwrap();
        let ours = adopted.dequantize();
        for (i, (a, b)) in ours.iter().zip(&v.out).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{name}: value {i}: {a} vs gguf {b}"
            );
        }
    }
}

#[test]
fn fused_gemv_on_gguf_bytes_matches_reference() {
    for name in GGUF {
        let v = load(name);
        let m = QuantMatrix::from_bytes(v.format, v.rows, v.cols, v.q.clone()).unwrap();
        let x: Vec<f32> = (0..v.cols)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        // The reference from gguf's own dequantised floats, not ours.
        let want: Vec<f64> = (0..v.rows)
            .map(|r| {
                (0..v.cols)
                    .map(|k| v.out[r * v.cols + k] as f64 * x[k] as f64)
                    .sum()
            })
            .collect();
        assert_eq!(reference::matmul(&m, &x, 1), want);
        for isa in kernel_cpu::isa::runnable() {
            let mut y = vec![f32::NAN; v.rows];
            matmul(&m, &x, 1, &mut y, MatVecVariant::Fused(Some(isa))).unwrap();
            for (r, (a, b)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (*a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{name} {isa:?} row {r}: {a} vs {b}"
                );
            }
        }
    }
}
