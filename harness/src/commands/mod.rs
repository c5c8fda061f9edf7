//! The commands of the `harness` CLI, above the family table: each looks families up in
//! `families::FAMILIES` and never matches on a family's name.

/// `harness check`.
pub mod check;
/// `harness compare`: two runs row by row, regressions flagged.
pub mod compare;
/// `harness eval perplexity`.
pub mod eval;
/// `harness exp`, `harness plan` and `harness render`.
pub mod exp;
/// `harness generate`.
pub mod generate;
/// `harness merge`: the shards of a sweep put together.
pub mod merge;
/// `harness replay`.
pub mod replay;
