//! The reference generation pipeline: model sources (GGUF files, Hugging Face safetensors
//! directories, seeded random presets), the file's byte-level BPE tokenizer, a Llama/Mixtral
//! decoder whose every projection and attention call goes through the kernel crates, a paged
//! KV cache, and a seeded sampler.

/// Block manager: reference counts, prefix sharing, copy-on-write; the contiguous allocator.
pub mod blocks;
/// Published model shapes (presets) for calculators.
pub mod config;
/// GGUF v2/v3 reader.
pub mod gguf;
/// Hugging Face checkpoint directories (config.json + safetensors).
pub mod hf;
/// K/V block pools per layer, and the batch-1 `Session`.
pub mod kv;
/// KV allocation simulated under a budget: contiguous vs paged, prefix sharing.
pub mod kvsim;
/// The Llama/Mixtral decoder (kernel-crate products and attention).
pub mod llama;
/// Building a model from a tensor source; `--model` dispatch.
pub mod load;
/// Random-weight presets.
pub mod presets;
/// Greedy, temperature, top-k and top-p sampling, seeded.
pub mod sampler;
/// Continuous, static and dynamic batching over the paged KV cache.
pub mod scheduler;
/// Speculative decoding: draft trees verified by the target in one pass.
pub mod spec;
/// Drafters: a smaller model, the target in a cheaper format, n-gram lookup.
pub mod spec_draft;
/// Byte-level BPE from GGUF metadata.
pub mod tokenizer;
/// Seeded serving workloads: log-normal lengths, Poisson arrivals, a shared system prompt.
pub mod workload;

pub use config::{preset, ModelShape, PRESETS};
pub use gguf::Gguf;
pub use kv::{KvPools, Session};
pub use llama::{argmax, Llama, LlamaConfig, SeqChunk};
pub use load::{load, LoadOptions, Loaded};
pub use sampler::{Sampler, SamplerConfig};
pub use scheduler::{BatchingMode, Engine, Finished, Request, SchedulerConfig};
pub use tokenizer::TextTokenizer;

/// Where `scripts/fetch-models.sh` puts SmolLM2-135M-Instruct (Q4_1), if it has run.
pub fn smollm2_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("cache")
        .join("SmolLM2-135M-Instruct.Q4_1.gguf")
}
