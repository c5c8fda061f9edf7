//! A weight matrix laid out for the product variant that will read it, built once and untimed
//! (a model at load, an experiment before its timing loop): the row-major blocks every variant
//! reads, or the 16-row tiles of `packed`. A model holds these, so a packed model keeps one
//! copy of its weights, not two.

use crate::format::WeightFormat;
use crate::matrix::QuantMatrix;
use crate::matvec::{self, MatVecVariant};
use crate::packed::{self, PackedMatrix};
use kernel_common::{error::Result, KernelError};
use std::sync::Arc;

/// A weight matrix in the layout of one product variant.
#[derive(Debug, Clone, PartialEq)]
pub enum Prepared {
    /// Row-major blocks (every variant but `packed`).
    Rows(Arc<QuantMatrix>),
    /// 16-row interleaved tiles (`packed`).
    Tiles(Arc<PackedMatrix>),
}

impl From<QuantMatrix> for Prepared {
    /// The row-major layout every variant but `packed` reads.
    fn from(m: QuantMatrix) -> Prepared {
        Prepared::Rows(Arc::new(m))
    }
}

impl Prepared {
    /// `m` laid out for `variant`: packed into tiles for `MatVecVariant::Packed` (an error for
    /// a format it does not take), else kept as it is.
    pub fn new(m: Arc<QuantMatrix>, variant: MatVecVariant) -> Result<Prepared> {
        match variant {
            MatVecVariant::Packed(_) => {
                matvec::supports(variant, m.format)?;
                Ok(Prepared::Tiles(Arc::new(PackedMatrix::pack(&m)?)))
            }
            _ => Ok(Prepared::Rows(m)),
        }
    }

    /// Y = X · Wᵀ with `variant`; tiles are read by `packed` only.
    pub fn matmul(
        &self,
        x: &[f32],
        batch: usize,
        y: &mut [f32],
        variant: MatVecVariant,
    ) -> Result<()> {
        match (self, variant) {
            (Prepared::Rows(m), _) => matvec::matmul(m, x, batch, y, variant),
            (Prepared::Tiles(p), MatVecVariant::Packed(_)) => {
                let isa = variant.isa()?.expect("a CPU variant");
                packed::matmul(p, x, batch, y, isa)
            }
            (Prepared::Tiles(_), other) => Err(KernelError::Unsupported(format!(
                "packed tiles are read by the packed variant only, not {other:?}"
            ))),
        }
    }

    pub fn format(&self) -> WeightFormat {
        match self {
            Prepared::Rows(m) => m.format,
            Prepared::Tiles(p) => p.format,
        }
    }

    pub fn rows(&self) -> usize {
        match self {
            Prepared::Rows(m) => m.rows,
            Prepared::Tiles(p) => p.rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Prepared::Rows(m) => m.cols,
            Prepared::Tiles(p) => p.cols,
        }
    }

    /// Bytes the weights occupy (and a batch-1 product reads).
    pub fn byte_len(&self) -> usize {
        match self {
            Prepared::Rows(m) => m.bytes().len(),
            Prepared::Tiles(p) => p.bytes().len(),
        }
    }

    /// Decodes row r into `out` (`cols` values; an embedding lookup).
    pub fn decode_row(&self, r: usize, out: &mut [f32], codes: &mut Vec<u8>) {
        match self {
            Prepared::Rows(m) => m.decode_row_range(r, 0, out, codes),
            Prepared::Tiles(p) => p.decode_row(r, out),
        }
    }

    /// The row-major matrix (shared when it is one, unpacked from tiles otherwise).
    pub fn rows_matrix(&self) -> Arc<QuantMatrix> {
        match self {
            Prepared::Rows(m) => m.clone(),
            Prepared::Tiles(p) => Arc::new(p.unpack()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{reference, WeightDist};
    use kernel_common::inputs::{normal_f32, rng};
    use kernel_common::{tolerance, DType, ErrorStats};

    #[test]
    fn packed_products_equal_the_reference_at_every_tier() {
        for f in crate::packed::PACKABLE {
            for (rows, blocks, batch) in
                [(1, 1, 1), (37, 3, 1), (64, 18, 5), (17, 2, 9), (40, 4, 33)]
            {
                let cols = crate::packed::block_values(f) * blocks;
                let w = WeightDist::Outliers {
                    channels: 2,
                    scale: 30.0,
                }
                .sample(rows, cols, rows as u64);
                let m = Arc::new(QuantMatrix::quantize(f, rows, cols, &w).unwrap());
                let x = normal_f32(&mut rng(7), batch * cols, 1.0);
                let seen = matvec::activation_as_seen(MatVecVariant::Packed(None), f, &x, cols);
                let want = reference::matmul(&m, &seen, batch);
                for isa in kernel_cpu::isa::runnable() {
                    let v = MatVecVariant::Packed(Some(isa));
                    let p = Prepared::new(m.clone(), v).unwrap();
                    assert!(matches!(p, Prepared::Tiles(_)));
                    let mut y = vec![f32::NAN; batch * rows];
                    p.matmul(&x, batch, &mut y, v).unwrap();
                    let stats = ErrorStats::compare(&y, &want);
                    assert!(
                        stats.passes(&tolerance(DType::F32).scaled_to(&want)),
                        "{f} {rows}x{cols} b{batch} {isa}: {stats:?}"
                    );
                    // The row-major matrix handed to the packed variant packs per call.
                    let mut y2 = vec![f32::NAN; batch * rows];
                    matvec::matmul(&m, &x, batch, &mut y2, v).unwrap();
                    assert_eq!(y, y2);
                }
                let p = Prepared::new(m.clone(), MatVecVariant::Packed(None)).unwrap();
                assert_eq!(*p.rows_matrix(), *m);
                let e = p
                    .matmul(
                        &x,
                        batch,
                        &mut vec![0.0; batch * rows],
                        MatVecVariant::FUSED,
                    )
                    .unwrap_err();
                assert!(e.to_string().contains("packed variant only"), "{e}");
            }
        }
    }
}
