//! The f64 oracle: y[b][r] = Σ_k w(r, k) · x[b][k] in f64, with w(r, k) the value the format
//! stores (decoded block by block with the format's own arithmetic, then widened). A fused
//! kernel must equal "dequantise, then this" within the f32 tolerance.

use crate::matrix::QuantMatrix;

/// Reference outputs of `rows` (every batch entry), in (batch, row) order.
pub fn matmul_rows(w: &QuantMatrix, x: &[f32], batch: usize, rows: &[usize]) -> Vec<f64> {
    assert_eq!(x.len(), batch * w.cols, "x must be batch × cols");
    let mut decoded = vec![0.0f32; w.cols];
    let mut codes = Vec::new();
    let mut per_row = Vec::with_capacity(rows.len());
    for &r in rows {
        w.decode_row_range(r, 0, &mut decoded, &mut codes);
        per_row.push(decoded.iter().map(|&v| v as f64).collect::<Vec<f64>>());
    }
    let mut out = Vec::with_capacity(batch * rows.len());
    for b in 0..batch {
        let xb = &x[b * w.cols..(b + 1) * w.cols];
        for wr in &per_row {
            out.push(wr.iter().zip(xb).map(|(&a, &v)| a * v as f64).sum());
        }
    }
    out
}

/// Every output, (batch, row) order = the layout `matvec::matmul` writes.
pub fn matmul(w: &QuantMatrix, x: &[f32], batch: usize) -> Vec<f64> {
    let rows: Vec<usize> = (0..w.rows).collect();
    matmul_rows(w, x, batch, &rows)
}
