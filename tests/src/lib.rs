//! Cross-crate tests of the workbench (see `tests/`): one conformance suite run against every
//! registered attention-family variant, and proof that the suite catches broken variants.
//! The harness's own CLI end-to-end tests live in `harness/tests/cli.rs`, beside its binary.

/// Fuzzing on stable Rust: mutated seed files and the contract every parser is held to.
pub mod fuzz;
