//! The kv_precision family's rows: one KV-cache format at one grid point, either the model's
//! quality with the cache in that format (perplexity, KL and top-1 against the f32 cache) or
//! the paged decode kernel over a cache in it (GB/s, error against the reference of the
//! cache as stored); both carry the format's bytes per token and its storage error.

use crate::row::Row;
use serde::{Deserialize, Serialize};

/// One format at one point. Column names are stable; a part's columns are empty on the
/// other part's rows.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct KvPrecisionCols {
    /// quality | decode
    pub part: String,
    /// The format as `--kv-cache` spells it.
    pub kv_cache: String,
    /// uniform | progressive
    pub scheme: String,
    /// Bytes of K and V per token: quality rows over all the model's layers at the window
    /// length, decode rows of the shape's one layer at its context.
    pub kv_bytes_per_token: f64,
    /// `kv_bytes_per_token` over the f32 cache's.
    pub bytes_vs_f32: f64,
    /// Relative L2 distance of the stored K/V from the f32 values written (quality: the
    /// model's own K/V of its first window, every layer; decode: the seeded Gaussian K/V).
    pub store_rel_l2: Option<f64>,
    pub store_max_abs: Option<f64>,
    /// 10·log10(Σx² / Σ(x − stored)²).
    pub store_snr_db: Option<f64>,
    // Quality rows.
    pub model: String,
    pub text: String,
    pub text_sha256: String,
    pub ctx: Option<usize>,
    pub windows: Option<usize>,
    /// Tokens per forward pass while a window is prefilled.
    pub prefill_chunk: Option<usize>,
    pub scored_tokens: Option<usize>,
    pub ppl: Option<f64>,
    /// llama.cpp's "+/-": the perplexity times the standard error of the mean NLL.
    pub ppl_stderr: Option<f64>,
    /// ppl − the f32 cache's ppl.
    pub delta_ppl: Option<f64>,
    /// Mean KL(f32 cache ‖ this) per scored token, nats.
    pub kl_mean: Option<f64>,
    pub kl_stderr: Option<f64>,
    /// Share of scored tokens whose most likely next token is the f32 cache's.
    pub top1_agreement: Option<f64>,
    pub tokens_per_s: Option<f64>,
    // Decode rows.
    /// `b8:h32/8:d128:ctx4096`
    pub shape: String,
    pub batch: Option<usize>,
    pub q_heads: Option<usize>,
    pub kv_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub context: Option<usize>,
    pub block_size: Option<usize>,
    /// The CPU kernels' ISA tier.
    pub isa: String,
    /// Bytes one call reads and writes: q, the K/V as stored (codes and scales), the block
    /// tables, the output.
    pub bytes: Option<f64>,
    pub gbps: Option<f64>,
    /// GB/s as % of the run's read bandwidth.
    pub pct_read_bw: Option<f64>,
    /// The f32 cache's median over this row's, same point and tier.
    pub speedup_vs_f32: Option<f64>,
    /// Against the f64 reference of the cache as stored (first and last sequence).
    pub rel_l2_err: Option<f64>,
    pub max_abs_err: Option<f64>,
}

/// A row: the shared head, these columns, the note.
pub type KvPrecisionRow = Row<KvPrecisionCols>;

/// `store_*` of a comparison of stored values with the f32 ones written.
pub fn storage_columns(stats: &kernel_common::ErrorStats) -> (f64, f64, f64) {
    let snr = if stats.nmse > 0.0 {
        -10.0 * stats.nmse.log10()
    } else {
        f64::INFINITY
    };
    (stats.rel_l2, stats.max_abs, snr)
}
