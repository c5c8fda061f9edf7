//! The tokenizer of a GGUF llama file: GPT-2 style byte-level BPE built with the `tokenizers`
//! crate from the file's `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`, with SmolLM's
//! pre-tokenizer (digits split one by one, then byte-level with GPT-2's regex, no prefix space)
//! and the control tokens (`<|im_start|>`, ...) as special tokens.

use crate::model::gguf::{Gguf, Result, Value};
use kernel_common::KernelError;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, Tokenizer};

/// A tokenizer and the ids generation needs.
pub struct TextTokenizer {
    pub inner: Tokenizer,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub vocab_size: usize,
    /// Byte-level BPE without a normaliser: decoding the ids of a text gives the text back,
    /// so a text it cannot (a byte without a token: SmolLM2's vocabulary lacks 21 of the 256,
    /// control characters and the lead bytes above U+3FFFF among them) is refused rather than
    /// silently shortened.
    pub lossless: bool,
}

fn err(g: &Gguf, m: impl std::fmt::Display) -> KernelError {
    KernelError::BadBuffer(format!("{}: {m}", g.path.display()))
}

impl TextTokenizer {
    /// Builds the tokenizer of `g` (model `gpt2`).
    pub fn from_gguf(g: &Gguf) -> Result<TextTokenizer> {
        let model = g.string("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(err(
                g,
                format!("tokenizer model '{model}' is not gpt2 (byte-level BPE)"),
            ));
        }
        let tokens = g.strings("tokenizer.ggml.tokens")?;
        let merges: Vec<(String, String)> = g
            .strings("tokenizer.ggml.merges")?
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| err(g, format!("merge '{m}' is not two tokens")))
            })
            .collect::<Result<_>>()?;
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| err(g, format!("building the BPE model: {e}")))?;
        let mut inner = Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        if let Some(Value::Array(types)) = g.meta.get("tokenizer.ggml.token_type") {
            let special: Vec<AddedToken> = types
                .iter()
                .zip(&tokens)
                .filter(|(t, _)| matches!(t, Value::Int(3) | Value::UInt(3)))
                .map(|(_, tok)| AddedToken::from(tok.to_string(), true))
                .collect();
            inner.add_special_tokens(&special);
        }
        let id = |k: &str| g.uint(k).ok().map(|v| v as u32);
        Ok(TextTokenizer {
            inner,
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            vocab_size: tokens.len(),
            lossless: true,
        })
    }

    /// Token ids of `text` (no BOS added: SmolLM's files say add_bos_token = false); for a
    /// lossless tokenizer, an error naming the first character the vocabulary cannot hold.
    pub fn encode(&self, text: &str) -> std::result::Result<Vec<u32>, KernelError> {
        let ids = self
            .inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| KernelError::BadBuffer(format!("tokenizing: {e}")))?;
        if self.lossless {
            let back = self.decode(&ids)?;
            if back != text {
                let at = text
                    .char_indices()
                    .zip(back.chars().map(Some).chain(std::iter::repeat(None)))
                    .find(|((_, a), b)| Some(*a) != *b)
                    .map_or(text.len(), |((i, _), _)| i);
                let c = text[at..].chars().next().unwrap_or('?');
                return Err(KernelError::BadBuffer(format!(
                    "tokenizing: the vocabulary has no token for {c:?} (U+{:04X}) at byte {at} of the text",
                    c as u32
                )));
            }
        }
        Ok(ids)
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> std::result::Result<String, KernelError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| KernelError::BadBuffer(format!("detokenizing: {e}")))
    }
}
