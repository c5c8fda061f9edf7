//! A GGUF vocabulary as llama.cpp's `llama_vocab::impl::load` reads it: each token's text
//! (`tokenizer.ggml.tokens`; an empty one is named `[EMPTY_<id>]`), score
//! (`tokenizer.ggml.scores`, f32 or i32, else 0) and type (`tokenizer.ggml.token_type`, else
//! normal), with the one override of a type that changes tokenization here: a token spelled as
//! one of llama.cpp's end-of-generation texts is a control token whatever the file says
//! (Qwen2's `</s>` is a normal token in the file). The control, user-defined and unknown
//! tokens are the specials the text is partitioned on (`special.rs`).
//!
//! Not mirrored: the attribute tweaks llama.cpp keys on a model's name (lstrip/rstrip for
//! jina, phi-3, modern-bert), its first-found-only EOT/FIM promotions when the file gives no
//! id for them, and the demotion of `</s>` beside a Gemma-4 / PLaMo end marker.

use crate::model::gguf::{Gguf, Result, Value};
use kernel_common::KernelError;
use std::sync::Arc;

/// A token's type (llama.cpp's `llama_token_type`, as `token_to_piece` treats it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    /// Unused or undefined: decodes to nothing.
    Unused,
    /// `<0xXX>`: decodes to that byte.
    Byte(u8),
}

/// One vocabulary entry.
pub(super) struct Token {
    pub(super) text: Arc<str>,
    pub(super) score: f32,
    pub(super) kind: TokenType,
}

/// The vocabulary of a GGUF file.
pub(super) struct Vocab {
    pub(super) tokens: Vec<Token>,
}

/// Texts llama.cpp treats as control tokens (they end generation) whatever their type.
const END_OF_GENERATION: [&str; 22] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

pub(super) fn err(g: &Gguf, m: impl std::fmt::Display) -> KernelError {
    KernelError::BadBuffer(format!("{}: {m}", g.path.display()))
}

/// The numbers of array `key`, at least `n` of them, or None when the file lacks the key.
fn numbers(g: &Gguf, key: &str, n: usize) -> Result<Option<Vec<f64>>> {
    let Some(v) = g.meta.get(key) else {
        return Ok(None);
    };
    let Value::Array(items) = v else {
        return Err(err(g, format!("metadata {key} is not an array")));
    };
    if items.len() < n {
        return Err(err(
            g,
            format!("metadata {key} has {} entries for {n} tokens", items.len()),
        ));
    }
    items[..n]
        .iter()
        .map(|x| match x {
            Value::Float(f) => Ok(*f),
            Value::Int(i) => Ok(*i as f64),
            Value::UInt(u) => Ok(*u as f64),
            other => Err(err(
                g,
                format!("metadata {key} holds {other:?}, not a number"),
            )),
        })
        .collect::<Result<Vec<f64>>>()
        .map(Some)
}

impl Vocab {
    /// The vocabulary of `g`.
    pub(super) fn from_gguf(g: &Gguf) -> Result<Vocab> {
        let texts = g.strings("tokenizer.ggml.tokens")?;
        let n = texts.len();
        let scores = numbers(g, "tokenizer.ggml.scores", n)?;
        let types = numbers(g, "tokenizer.ggml.token_type", n)?;
        let tokens = texts
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let text: Arc<str> = if t.is_empty() {
                    format!("[EMPTY_{i}]").into()
                } else {
                    t.into()
                };
                let mut kind = match types.as_ref().map_or(1.0, |v| v[i]) as i64 {
                    1 => TokenType::Normal,
                    2 => TokenType::Unknown,
                    3 => TokenType::Control,
                    4 => TokenType::UserDefined,
                    6 => TokenType::Byte(byte_of(&text).ok_or_else(|| {
                        err(
                            g,
                            format!("token {i} is a byte token but reads {text:?}, not <0xXX>"),
                        )
                    })?),
                    _ => TokenType::Unused,
                };
                if END_OF_GENERATION.contains(&&*text)
                    && !matches!(kind, TokenType::UserDefined | TokenType::Unknown)
                {
                    kind = TokenType::Control;
                }
                let score = scores.as_ref().map_or(0.0, |v| v[i] as f32);
                Ok(Token { text, score, kind })
            })
            .collect::<Result<Vec<Token>>>()?;
        Ok(Vocab { tokens })
    }

    pub(super) fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Token `id`, or an error naming it.
    pub(super) fn get(&self, id: u32) -> std::result::Result<&Token, KernelError> {
        self.tokens.get(id as usize).ok_or_else(|| {
            KernelError::BadBuffer(format!(
                "detokenizing: token id {id} is outside the vocabulary of {}",
                self.tokens.len()
            ))
        })
    }

    /// The tokens the text is partitioned on: control, user-defined and unknown ones.
    pub(super) fn specials(&self) -> Vec<(Box<str>, u32)> {
        self.tokens
            .iter()
            .zip(0u32..)
            .filter(|(t, _)| {
                matches!(
                    t.kind,
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                )
            })
            .map(|(t, id)| (Box::from(&*t.text), id))
            .collect()
    }
}

/// The byte of a `<0xXX>` token text.
fn byte_of(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}
