//! Sweeps that outgrow one machine, without a scheduler of their own: a grid split into
//! shards by a stable hash of each point's key (`harness exp --shard i/n`), a killed shard
//! resumed from the complete points of its CSV (`--resume`), shards put back together by
//! `harness merge`, and `harness plan` to choose n. Every family's runner takes part through
//! two calls on its `RunFiles` (`owns(key)` before a point, `write_point` after it); the
//! rest lives here and in `run_files.rs`.

/// Which points a run measures, and the check that none is written twice.
pub mod book;
/// The sweep's identity: options, definition digest, sweep id, shard file names.
pub mod id;
/// Point keys and shards: which shard a grid point belongs to.
pub mod key;
/// `harness plan`: points, rows and estimated time per shard.
pub mod plan;
/// A shard's CSV read back by point: its complete points, and what follows them.
pub mod shard_csv;

pub use book::{PointBook, Role};
pub use id::{Definition, SweepOptions};
pub use key::{PointKey, Shard};
