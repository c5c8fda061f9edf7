//! The model room: a Llama/Mixtral decoder (HF `LlamaForCausalLM` / `MixtralForCausalLM`,
//! llama.cpp's `llama`) and where its weights come from — GGUF files, Hugging Face safetensors
//! directories, seeded random presets — plus the file's tokenizer and the per-layer K/V pools
//! the forward pass writes into. Nothing here imports `serve` or `spec`.

/// Published model shapes (presets) for calculators.
pub mod config;
/// GGUF v2/v3 reader.
pub mod gguf;
/// Hugging Face checkpoint directories (config.json + safetensors).
pub mod hf;
/// K/V block pools per layer, and the batch-1 `Session`.
pub mod kv;
/// The Llama/Mixtral decoder (kernel-crate products and attention).
pub mod llama;
/// Building a model from a tensor source; `--model` dispatch.
pub mod load;
/// Random-weight presets.
pub mod presets;
/// Byte-level BPE from GGUF metadata.
pub mod tokenizer;
