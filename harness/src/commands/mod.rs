//! The commands of the `harness` CLI, above the family table: each looks families up in
//! `families::FAMILIES` and never matches on a family's name.

/// `harness check`.
pub mod check;
/// `harness eval perplexity`.
pub mod eval;
/// `harness exp` and `harness render`.
pub mod exp;
/// `harness generate`.
pub mod generate;
/// `harness replay`.
pub mod replay;
