//! The columns of an attention experiment's row, after the shared head: the point, then the
//! cost model, speed, memory and error, then a CUDA row's hot median.

use crate::row::Row;
use serde::{Deserialize, Serialize};

/// An attention row's own columns: the point, then cost, speed, memory and error.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AttentionCols {
    pub mode: String,
    pub dtype: String,
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub gbps: Option<f64>,
    pub gflops: Option<f64>,
    /// Roofline time / measured time, in %.
    pub pct_roofline: Option<f64>,
    /// memory | compute: the side of the ridge point this call's cost model lies on.
    pub bound: String,
    pub bytes: u64,
    pub flops: u64,
    /// Peak heap bytes allocated during one call, MiB (measured by the counting allocator);
    /// empty for CUDA variants, whose workspace is device memory.
    pub scratch_mib: Option<f64>,
    pub prepare_ms: Option<f64>,
    pub max_abs_err: Option<f64>,
    pub rel_l2_err: Option<f64>,
    pub nmse: Option<f64>,
    pub checked_rows: usize,
    /// CUDA rows: the median of the same kernels timed hot (after the warm-up, L2 not
    /// flushed), beside `median_ms`, which is cold (L2 flushed before each repetition).
    /// Empty on the CPU and in runs before it.
    pub hot_median_ms: Option<f64>,
}

/// One measured (or skipped) variant at one grid point.
pub type ExpRow = Row<AttentionCols>;
