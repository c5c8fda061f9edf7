//! Dense f32 products on tiles (C = α·A·B + β·C with arbitrary strides) through one of two
//! well-kept GEMM crates — `matrixmultiply` (packed AVX2/FMA micro-kernels) or `gemm` from the
//! faer project (AVX-512 micro-kernels where the CPU has them) — and widening of f16/bf16
//! storage into f32 scratch: the building blocks the attention and quantisation kernels share.

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

/// Which crate computes the tile products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmBackend {
    /// `matrixmultiply::sgemm`.
    MatrixMultiply,
    /// `gemm::gemm` (faer), single-threaded.
    Faer,
}

impl GemmBackend {
    /// The faster of the two on the tile shapes of attention, measured side by side on the
    /// 2-core AMD EPYC (flash2 prefill, 2048 tokens, 32/8 heads, d=128, tiles 128×128):
    /// faer 251 ms vs matrixmultiply 285 ms (136.8 vs 120.6 GFLOP/s).
    pub const DEFAULT: GemmBackend = GemmBackend::Faer;

    /// Parses `mm` or `faer`.
    pub fn parse(text: &str) -> Option<GemmBackend> {
        match text {
            "mm" => Some(GemmBackend::MatrixMultiply),
            "faer" => Some(GemmBackend::Faer),
            _ => None,
        }
    }

    /// The name `parse` accepts.
    pub fn name(self) -> &'static str {
        match self {
            GemmBackend::MatrixMultiply => "mm",
            GemmBackend::Faer => "faer",
        }
    }
}

/// C[m×n] = alpha·A[m×k]·B[k×n] + beta·C with `GemmBackend::DEFAULT`.
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
    sgemm_with(
        GemmBackend::DEFAULT,
        m,
        k,
        n,
        alpha,
        a,
        sa,
        b,
        sb,
        beta,
        c,
        ldc,
    )
}

/// C[m×n] = alpha·A[m×k]·B[k×n] + beta·C, C row-major with `ldc` elements per row.
/// Panics (a bug, not bad input) when a view would read or write out of bounds.
#[allow(clippy::too_many_arguments)]
pub fn sgemm_with(
    backend: GemmBackend,
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
    if !check_views(m, k, n, a, sa, b, sb, c, ldc) {
        return;
    }
    if backend == GemmBackend::Faer {
        let views = (a, sa, b, sb);
        return faer(m, k, n, alpha, views, beta, c, ldc, gemm::Parallelism::None);
    }
    // SAFETY: check_views keeps every access of the three views inside the slices.
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

/// C[m×n] = A[m×k]·B[k×n] by faer's `gemm`, split over the rayon pool (one whole-problem call,
/// for baselines that should use a library's own blocking and threading).
#[allow(clippy::too_many_arguments)]
pub fn sgemm_parallel(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    sa: Strides,
    b: &[f32],
    sb: Strides,
    c: &mut [f32],
    ldc: usize,
) {
    if check_views(m, k, n, a, sa, b, sb, c, ldc) {
        let par = gemm::Parallelism::Rayon(rayon::current_num_threads());
        faer(m, k, n, 1.0, (a, sa, b, sb), 0.0, c, ldc, par);
    }
}

/// Panics when a view would leave its slice; false when the product is empty.
#[allow(clippy::too_many_arguments)]
fn check_views(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    sa: Strides,
    b: &[f32],
    sb: Strides,
    c: &[f32],
    ldc: usize,
) -> bool {
    if m == 0 || n == 0 {
        return false;
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
    true
}

/// faer's `gemm` on views `check_views` accepted (its convention: dst = alpha·dst +
/// beta·lhs·rhs, so our alpha and beta swap places).
#[allow(clippy::too_many_arguments)]
fn faer(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    (a, sa, b, sb): (&[f32], Strides, &[f32], Strides),
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    par: gemm::Parallelism,
) {
    // SAFETY: the caller checked every view with `check_views`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            beta != 0.0,
            a.as_ptr(),
            sa.col as isize,
            sa.row as isize,
            b.as_ptr(),
            sb.col as isize,
            sb.row as isize,
            beta,
            alpha,
            false,
            false,
            false,
            par,
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
    fn backends_agree() {
        let (m, k, n) = (13, 37, 21);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.3).sin()).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.7).cos()).collect();
        let mut c1 = vec![0.5f32; m * n];
        let mut c2 = c1.clone();
        for (backend, c) in [
            (GemmBackend::MatrixMultiply, &mut c1),
            (GemmBackend::Faer, &mut c2),
        ] {
            sgemm_with(
                backend,
                m,
                k,
                n,
                0.25,
                &a,
                Strides::row_major(k),
                &bt,
                Strides::transposed(k),
                1.0,
                c,
                n,
            );
        }
        for (x, y) in c1.iter().zip(&c2) {
            assert!((x - y).abs() < 1e-4);
        }
        assert_eq!(GemmBackend::parse("faer"), Some(GemmBackend::Faer));
        assert_eq!(GemmBackend::parse("mm").unwrap().name(), "mm");
        assert!(GemmBackend::parse("blas").is_none());
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
