//! Dense f32 products on tiles (C = α·A·B + β·C with arbitrary strides, via the
//! `matrixmultiply` crate's packed AVX2/FMA micro-kernels) and widening of f16/bf16 storage
//! into f32 scratch: the two building blocks the attention variants share.

use kernel_common::Element;

/// Row/column strides of a matrix view in elements.
#[derive(Debug, Clone, Copy)]
pub struct Strides {
    pub row: usize,
    pub col: usize,
}

impl Strides {
    /// Row-major with `cols` elements per row.
    pub const fn row_major(cols: usize) -> Strides {
        Strides { row: cols, col: 1 }
    }
    /// The transpose of a row-major matrix with `cols` elements per row.
    pub const fn transposed(cols: usize) -> Strides {
        Strides { row: 1, col: cols }
    }
    fn last_index(self, rows: usize, cols: usize) -> usize {
        (rows - 1) * self.row + (cols - 1) * self.col
    }
}

/// C[m×n] = alpha·A[m×k]·B[k×n] + beta·C, C row-major with `ldc` elements per row.
/// Panics (a bug, not bad input) when a view would read or write out of bounds.
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    sa: Strides,
    b: &[f32],
    sb: Strides,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        k == 0 || a.len() > sa.last_index(m, k),
        "A view out of bounds"
    );
    assert!(
        k == 0 || b.len() > sb.last_index(k, n),
        "B view out of bounds"
    );
    assert!(
        c.len() > (m - 1) * ldc + n - 1 && n <= ldc,
        "C view out of bounds"
    );
    // SAFETY: the asserts above keep every access of the three views inside the slices.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            sa.row as isize,
            sa.col as isize,
            b.as_ptr(),
            sb.row as isize,
            sb.col as isize,
            beta,
            c.as_mut_ptr(),
            ldc as isize,
            1,
        );
    }
}

/// `src` as f32: the slice itself for f32 storage, else widened into `scratch`.
pub fn widen<'a, T: Element>(src: &'a [T], scratch: &'a mut Vec<f32>) -> &'a [f32] {
    match T::as_f32(src) {
        Some(s) => s,
        None => {
            scratch.resize(src.len(), 0.0);
            T::widen_into(src, scratch);
            scratch
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgemm_with_transposed_b_matches_loops() {
        let (m, k, n) = (3, 5, 4);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 3.0).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| (i as f32).sin()).collect(); // n×k row-major
        let mut c = vec![1.0f32; m * n];
        sgemm(
            m,
            k,
            n,
            2.0,
            &a,
            Strides::row_major(k),
            &bt,
            Strides::transposed(k),
            1.0,
            &mut c,
            n,
        );
        for i in 0..m {
            for j in 0..n {
                let want: f32 =
                    1.0 + 2.0 * (0..k).map(|p| a[i * k + p] * bt[j * k + p]).sum::<f32>();
                assert!((c[i * n + j] - want).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn widen_borrows_f32_and_converts_half() {
        let x = [1.0f32, 2.0];
        let mut scratch = Vec::new();
        assert_eq!(widen(&x, &mut scratch).as_ptr(), x.as_ptr());
        let h = [half::f16::from_f32(1.5), half::f16::from_f32(-2.0)];
        assert_eq!(widen(&h, &mut scratch), &[1.5, -2.0]);
    }
}
