//! The model room: the decoder every architecture runs (`llama.rs`; the table of architectures
//! — Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Gemma-3, Phi-3, OLMoE — in `arch/`) and where
//! its weights come from — GGUF files, Hugging Face safetensors directories, seeded random
//! presets — plus the file's tokenizer and the per-layer K/V pools the forward pass writes
//! into. Imports inside the room run one way: `rope` ← `llama` ← `kv` ← `forward` ←
//! `attention`; `llama` ← `ffn`; `mapped` ← `gguf` ← `arch` ← `source` ← `hf`/`presets` ←
//! `load`; `gguf` ← `tokenizer` ← `hf`/`load`. Nothing here imports `serve` or `spec`.

/// The architecture table: config readers and tensor names per architecture.
pub mod arch;
/// One layer's attention over the cache: tree, paged or contiguous kernels.
pub mod attention;
/// Published model shapes (presets) for calculators.
pub mod config;
/// The feed-forward: SwiGLU/GeGLU MLPs, MoE blocks, shared experts.
pub mod ffn;
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
/// A model file's bytes: memory-mapped, pages released as tensors are copied out.
pub mod mapped;
/// Random-weight presets.
pub mod presets;
/// Rotary embeddings and their scaling schemes (default, linear, llama3, yarn, longrope).
pub mod rope;
/// Tensor sources and building a model from one.
pub mod source;
/// The file's tokenizer: byte-level BPE or SentencePiece, as llama.cpp tokenizes.
pub mod tokenizer;
