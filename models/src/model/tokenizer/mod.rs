//! The tokenizers of the models' files, as llama.cpp tokenizes a GGUF file: byte-level BPE
//! (SmolLM2, Qwen2) and SentencePiece (Gemma-3), chosen from the file's metadata, with the
//! special tokens cut out of the text first.

/// Byte-level BPE with the pre-tokenizer `tokenizer.ggml.pre` names.
mod bpe;
/// The special-token partition of a text.
mod special;
/// SentencePiece BPE by piece scores, with byte fallback.
mod spm;
/// `TextTokenizer`: the choice of tokenizer, encode, decode, BOS.
mod text;
/// A GGUF vocabulary: texts, scores, token types.
mod vocab;

pub use text::TextTokenizer;
