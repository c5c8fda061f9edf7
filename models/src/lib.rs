//! The reference generation pipeline, first part: GGUF loading, the file's byte-level BPE
//! tokenizer, and a Llama decoder whose every projection and attention call goes through the
//! kernel crates, and a seeded sampler. KV block management, batching and the other
//! checkpoint formats are still to come (module plan in README.md).

/// Published model shapes (presets) for calculators.
pub mod config;
/// GGUF v2/v3 reader.
pub mod gguf;
/// The Llama decoder (GGUF weights, kernel-crate products).
pub mod llama;
/// Greedy, temperature, top-k and top-p sampling, seeded.
pub mod sampler;
/// Byte-level BPE from GGUF metadata.
pub mod tokenizer;

pub use config::{preset, ModelShape, PRESETS};
pub use gguf::Gguf;
pub use llama::{Llama, LlamaConfig};
pub use sampler::{Sampler, SamplerConfig};
pub use tokenizer::TextTokenizer;

/// Where `scripts/fetch-models.sh` puts SmolLM2-135M-Instruct (Q4_1), if it has run.
pub fn smollm2_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("cache")
        .join("SmolLM2-135M-Instruct.Q4_1.gguf")
}
