//! The reference generation pipeline: model sources (GGUF files, Hugging Face safetensors
//! directories, seeded random presets), the file's tokenizer, a Llama/Mixtral
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
pub mod speculative;

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
    cached("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Where `scripts/fetch-models.sh` puts Qwen2.5-Coder-0.5B-Instruct (`qwen2`; a Q5_0, Q8_0,
/// Q4_K and Q6_K mix), if it has run.
pub fn qwen25_path() -> std::path::PathBuf {
    cached("Qwen2.5-Coder-0.5B-Instruct.gguf")
}

/// Where `scripts/fetch-models.sh` puts Gemma-3-270M (`gemma3`, Q4_K_M), if it has run.
pub fn gemma3_path() -> std::path::PathBuf {
    cached("gemma-3-270m-q4_k_m.gguf")
}

/// The real models by the names `--model` takes: (name, file).
pub fn fetched_models() -> [(&'static str, std::path::PathBuf); 3] {
    [
        ("smollm2", smollm2_path()),
        ("qwen2.5-0.5b", qwen25_path()),
        ("gemma3-270m", gemma3_path()),
    ]
}

fn cached(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("cache")
        .join(file)
}
