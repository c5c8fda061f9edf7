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
/// `harness check --invariance`: logits alone vs in a batch, 1 vs N threads.
pub mod invariance;
/// `harness list`: families, variants, experiments, peers, grid keys.
pub mod list;
/// `harness merge`: the shards of a sweep put together.
pub mod merge;
/// `harness replay`.
pub mod replay;
/// `harness roofline`: this machine's (or GPU's) limits, measured and stored.
pub mod roofline;
