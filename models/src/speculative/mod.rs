//! The speculation room: speculative decoding (Leviathan et al. 2023; SpecInfer, Medusa and
//! EAGLE-2 trees) — the driver that drafts a tree, verifies it in one tree-masked target pass
//! and keeps the accepted path, and the drafters that propose it. Uses `model` and `serve`.

/// Drafters as chains for the continuous-batching engine (`EngineSpec`).
pub mod chain;
/// Retrieval drafting: a token corpus indexed by a suffix array (REST; SuffixDecoding's
/// global tree).
pub mod corpus;
/// The cost-aware depth policy: measured pass costs, expected tokens per step.
pub mod cost;
/// Drafters: a smaller model, the target in a cheaper format, n-gram lookup (and the suffix
/// drafter of `suffix`).
pub mod draft;
/// Speculative decoding: draft trees verified by the target in one pass.
pub mod driver;
/// Suffix drafting (SuffixDecoding): a suffix tree over the sequence so far.
pub mod suffix;
