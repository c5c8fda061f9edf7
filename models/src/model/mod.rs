//! The model room: a Llama/Mixtral decoder (HF `LlamaForCausalLM` / `MixtralForCausalLM`,
//! llama.cpp's `llama`) and where its weights come from — GGUF files, Hugging Face safetensors
//! directories, seeded random presets — plus the file's tokenizer and the per-layer K/V pools
//! the forward pass writes into. Imports inside the room run one way: `llama` ← `kv` ←
//! `forward`; `llama` ← `source` ← `gguf`/`hf`/`presets` ← `load`; `gguf` ← `tokenizer` ←
//! `hf`/`load`. Nothing here imports `serve` or `spec`.

/// Published model shapes (presets) for calculators.
pub mod config;
/// The forward pass: a batch of sequence chunks over the paged KV cache.
pub mod forward;
/// GGUF v2/v3 reader; a GGUF file as a tensor source.
pub mod gguf;
/// Hugging Face checkpoint directories (config.json + safetensors).
pub mod hf;
/// K/V block pools per layer (what the forward pass writes into).
pub mod kv;
/// The Llama/Mixtral decoder: config, layers, weights, the attention choice.
pub mod llama;
/// `--model` dispatch to a weight source.
pub mod load;
/// Random-weight presets.
pub mod presets;
/// Tensor sources and building a model from one.
pub mod source;
/// The file's tokenizer: byte-level BPE or SentencePiece, as llama.cpp tokenizes.
pub mod tokenizer;
