//! The serving room: what runs requests on a model (vLLM's PagedAttention block manager, Orca's
//! continuous batching): the batch-1 session, block management, the scheduler and its seeded
//! workloads, the KV allocation simulator, sampling, the batch/thread invariance check, and
//! speculation inside the engine (draft chains from any `speculate::ChainDrafter`). Uses
//! `model`, never `speculative` (which implements `ChainDrafter` for its drafters).

/// Block manager: reference counts, prefix sharing, copy-on-write; the contiguous allocator.
pub mod blocks;
/// Batch and thread invariance: a sequence's logits alone vs in a batch, 1 vs N threads.
pub mod invariance;
/// KV allocation simulated under a budget: contiguous vs paged, prefix sharing.
pub mod kvsim;
/// The scheduler's modes, configuration, requests and records.
pub mod policy;
/// Greedy, temperature, top-k and top-p sampling, seeded.
pub mod sampler;
/// Continuous, static and dynamic batching over the paged KV cache.
pub mod scheduler;
/// One sequence over its own pools (batch 1), and `Llama::greedy`.
pub mod session;
/// Speculative decoding inside the engine: draft chains verified in the batched step.
pub mod speculate;
/// Seeded serving workloads: log-normal lengths, Poisson arrivals, a shared system prompt.
pub mod workload;
