//! The reference generation pipeline: model sources (GGUF files, Hugging Face safetensors
//! directories, seeded random presets), the file's byte-level BPE tokenizer, a Llama/Mixtral
//! decoder whose every projection and attention call goes through the kernel crates, a paged
//! KV cache, a seeded sampler, continuous batching and speculative decoding, and the evaluation
//! of its quality (perplexity, KL divergence). Rooms whose imports run one way, `model` ←
//! `serve` ← `spec`, and `eval` over `model` and `serve`; the common types are re-exported
//! here.

/// Model quality: perplexity, KL divergence and top-1 agreement against a reference run.
pub mod eval;
/// The decoder, its weight sources, tokenizer and K/V pools.
pub mod model;
/// Running requests: sessions, block management, batching, workloads, sampling.
pub mod serve;
/// Speculative decoding: the driver and the drafters.
pub mod spec;

pub use model::config::{preset, ModelShape, PRESETS};
pub use model::forward::SeqChunk;
pub use model::gguf::Gguf;
pub use model::kv::KvPools;
pub use model::llama::{argmax, Llama, LlamaConfig};
pub use model::load::{load, load_gguf, Loaded};
pub use model::source::{LoadOptions, Proj, WeightOverride};
pub use model::tokenizer::TextTokenizer;
pub use serve::sampler::{Sampler, SamplerConfig};
pub use serve::scheduler::{BatchingMode, Engine, Finished, Request, SchedulerConfig};
pub use serve::session::Session;

/// Where `scripts/fetch-models.sh` puts SmolLM2-135M-Instruct (Q4_1), if it has run.
pub fn smollm2_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("cache")
        .join("SmolLM2-135M-Instruct.Q4_1.gguf")
}
