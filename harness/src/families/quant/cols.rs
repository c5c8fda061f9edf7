//! The quant family's rows: `QuantCols` (one variant or peer × format × shape × weights ×
//! batch, or a quantiser row), `RowBase` (what every row of a (shape, weights) pair shares)
//! and `Stored` (a format quantised once), shared by the runner, its peers and its report.

use crate::row::{Heads, Row};
use kernel_common::KernelError;
use kernel_quant::{QuantError, QuantMatrix, WeightFormat};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One variant (or peer) × format × shape × weights × batch. Column names are stable.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct QuantCols {
    pub format: String,
    /// dense | ggml | sym g<group> | asym g<group> (one line per scheme in the plots)
    pub scheme: String,
    pub bits: u8,
    pub bits_per_weight: f64,
    pub rows: usize,
    pub cols: usize,
    pub shape: String,
    pub weights: String,
    pub batch: usize,
    pub gbps: Option<f64>,
    pub gflops: Option<f64>,
    /// Achieved GB/s as % of the run's measured read bandwidth.
    pub pct_read_bw: Option<f64>,
    /// Median of the fastest f32-weight row of the same shape, weights and batch (our fused
    /// kernel or faer's GEMM, timed round-robin with this one) / this row's median.
    pub speedup_vs_f32: Option<f64>,
    pub speedup_vs_f16: Option<f64>,
    pub weight_bytes: u64,
    pub bytes: u64,
    pub flops: u64,
    /// Dequantised vs original weights.
    pub w_rmse: f64,
    pub w_max_abs: f64,
    pub w_snr_db: f64,
    /// Relative L2 distance of the sampled outputs from the f64 product with the original
    /// (unquantised) weights: the error quantisation adds to the layer's output.
    pub out_rel_err: Option<f64>,
    /// Against the f64 product of the dequantised weights (the correctness check).
    pub max_abs_err: Option<f64>,
    pub rel_l2_err: Option<f64>,
    pub checked_outputs: usize,
    pub quantize_ms: f64,
    /// matmul (the product; `batch` activations) | quantize (f32 → the format, timed beside
    /// a quantiser peer; `batch` is 0). Absent from earlier runs: matmul.
    #[serde(default = "matmul")]
    pub op: String,
    /// CUDA rows (ours and a peer's on the device): the median timed hot (after the warm-up,
    /// L2 not flushed), beside `median_ms`, which is cold (L2 flushed before each
    /// repetition). Empty on the CPU and in runs before it.
    #[serde(default)]
    pub hot_median_ms: Option<f64>,
}

fn matmul() -> String {
    "matmul".into()
}

/// A row: the shared head, these columns, the note.
pub type QuantRow = Row<QuantCols>;

/// `dense`, `ggml` (the 32-value blocks), `ggml k` (the K-quants), `sym g32`, `asym g128`.
pub fn scheme(f: WeightFormat) -> String {
    match f {
        WeightFormat::Sym { group, .. } => format!("sym g{group}"),
        WeightFormat::Asym { group, .. } => format!("asym g{group}"),
        f if f.is_k_quant() => "ggml k".into(),
        f if f.is_ggml() => "ggml".into(),
        _ => "dense".into(),
    }
}

/// What every row of one (shape, weights) pair shares.
pub struct RowBase<'a> {
    /// The run's id, experiment and device.
    pub heads: &'a Heads,
    pub seed: u64,
    pub rows: usize,
    pub cols: usize,
    pub weights: String,
}

impl RowBase<'_> {
    /// A row of `variant` for weights stored as `format` (a label: a `WeightFormat`, or a
    /// peer's dtype such as bf16) with `bits_per_weight`, their error against the originals.
    pub fn row(
        &self,
        variant: &str,
        format: &str,
        (scheme, bits_per_weight): (String, f64),
        batch: usize,
        err: Option<QuantError>,
    ) -> QuantRow {
        let (rows, cols) = (self.rows, self.cols);
        Row::new(
            self.heads.head(variant, self.seed),
            QuantCols {
                format: format.into(),
                scheme,
                bits: bits_per_weight.round().min(255.0) as u8,
                bits_per_weight,
                rows,
                cols,
                shape: format!("{rows}x{cols}"),
                weights: self.weights.clone(),
                batch,
                weight_bytes: (rows as f64 * cols as f64 * bits_per_weight / 8.0) as u64,
                w_rmse: err.map_or(f64::NAN, |e| e.rmse),
                w_max_abs: err.map_or(f64::NAN, |e| e.max_abs),
                w_snr_db: err.map_or(f64::NAN, |e| e.snr_db),
                op: matmul(),
                ..QuantCols::default()
            },
        )
    }

    /// A row of one of our formats.
    pub fn format_row(
        &self,
        variant: &str,
        format: WeightFormat,
        batch: usize,
        err: Option<QuantError>,
    ) -> QuantRow {
        let mut row = self.row(
            variant,
            &format.to_string(),
            (scheme(format), format.bits_per_weight()),
            batch,
            err,
        );
        row.cols.bits = format.bits();
        row.cols.weight_bytes = (self.rows * format.row_bytes(self.cols)) as u64;
        row
    }
}

/// One format of a (shape, weights) pair, quantised once: the matrix (or why not), the time
/// it took, its error against the originals.
pub struct Stored {
    pub format: WeightFormat,
    pub matrix: std::result::Result<Arc<QuantMatrix>, KernelError>,
    pub quantize_ms: f64,
    pub err: Option<QuantError>,
}
