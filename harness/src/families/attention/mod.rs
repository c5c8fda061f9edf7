//! The attention family: MHA/GQA/MQA attention over contiguous K/V (naive, FlashAttention-2
//! tiles) and paged decode behind the same `AttentionKernel` trait, so one experiment compares
//! them at the same points. Its experiments' grid (mode × dtype × batch × heads × lengths ×
//! head_dim × causal) expands here into `Point`s; `check.rs`, `exp.rs`, `report.rs` and
//! `replay.rs` hold the rest.

use crate::family::{listed, ExpFamily, Family, ReplayFamily, VariantInfo};

/// `harness check --family attention`.
pub mod check;
/// An attention row's own columns.
pub mod cols;
/// `harness exp` for attention specs: the point runner.
pub mod exp;
/// The grid keys and their expansion into points.
pub mod grid;
/// Points with peers: checked, then timed in alternating rounds with the variants.
pub mod peers;
/// One grid point: inputs, reference rows, a variant's row, check and timing.
pub mod point;
/// `harness replay` of attention case files.
pub mod replay;
/// Tables of an attention run: per mode, speed-ups over the baseline.
pub mod report;

pub const FAMILY: Family = Family {
    name: "attention",
    about: "MHA/GQA/MQA attention: reference, naive, FlashAttention-2, and paged decode at the same points",
    variants,
    check: Some(check::check),
    exp: Some(ExpFamily {
        grid_keys: grid::GRID_KEYS,
        variant: |v| crate::registry::attention_kernel(v).map(|_| ()),
        run: exp::run,
        render: report::render,
        peers: true,
    }),
    cuda: &[kernel_attention::cuda::SOURCE],
    replay: Some(ReplayFamily {
        needs: "q, k, v ([batch, heads, len, head_dim]) and optionally out",
        prepare: replay::prepare,
    }),
};

fn variants() -> Vec<VariantInfo> {
    listed("attention", kernel_attention::VARIANTS)
}
