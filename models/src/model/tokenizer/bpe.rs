//! Byte-level BPE over a GGUF vocabulary (`tokenizer.ggml.model = gpt2`), built with the
//! `tokenizers` crate from `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`, with the
//! pre-tokenizer llama.cpp's `llm_tokenizer_bpe` picks for `tokenizer.ggml.pre`
//! (`src/llama-vocab.cpp`; the regexes are its `unicode.cpp` ones):
//! - `smollm`: digits one by one, then GPT-2's regex;
//! - `qwen2`: Qwen2's regex (contractions, letters with one leading non-letter, single digits,
//!   punctuation runs with their newlines, newline runs, spaces but the last before a word);
//! - `default` (also when the key is missing, where llama.cpp warns): punctuation runs, GPT-2's
//!   regex, digit runs, then three-digit groups.
//!
//! The crate's merge order is llama.cpp's (lowest rank first, the leftmost of equal ranks).

use crate::model::gguf::{Gguf, Result};
use crate::model::tokenizer::vocab::{err, Vocab};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// GPT-2's regex (the `tokenizers` crate's byte-level one; llama.cpp's `unicode.cpp` has it
/// without the final `|\s+`, which its hand-written matcher applies anyway).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Qwen2's regex as llama.cpp spells it: the case-insensitive contractions with ASCII classes.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's `default` BPE pre-tokenizer, applied in turn.
const DEFAULT: [&str; 4] = [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];

/// The pre-tokenizers `tokenizer.ggml.pre` can name.
pub(super) const PRE: &str = "smollm, qwen2, default";

fn split(g: &Gguf, regex: &str) -> Result<PreTokenizerWrapper> {
    Split::new(
        SplitPattern::Regex(regex.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map(Into::into)
    .map_err(|e| err(g, format!("the pre-tokenizer regex {regex:?}: {e}")))
}

/// The byte-level BPE of `g` with pre-tokenizer `pre` (None: the key is missing), or None when
/// `pre` is none this module knows. The specials are registered so that decoding writes them.
pub(super) fn bpe(g: &Gguf, pre: Option<&str>, vocab: &Vocab) -> Result<Option<Tokenizer>> {
    let bytes = ByteLevel::new(false, true, false);
    let steps: Vec<PreTokenizerWrapper> = match pre {
        Some("smollm") => vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ],
        Some("qwen2") => vec![split(g, QWEN2)?, bytes.into()],
        Some("default") | None => {
            let mut s = DEFAULT
                .iter()
                .map(|r| split(g, r))
                .collect::<Result<Vec<_>>>()?;
            s.push(bytes.into());
            s
        }
        Some(_) => return Ok(None),
    };
    let merges: Vec<(String, String)> = g
        .strings("tokenizer.ggml.merges")?
        .iter()
        .map(|m| {
            // llama.cpp splits at the first space after the first byte.
            m.bytes()
                .skip(1)
                .position(|b| b == b' ')
                .map(|at| (m[..=at].to_string(), m[at + 2..].to_string()))
                .ok_or_else(|| err(g, format!("merge {m:?} is not two tokens")))
        })
        .collect::<Result<_>>()?;
    let ids: tokenizers::models::bpe::Vocab = vocab
        .tokens
        .iter()
        .zip(0u32..)
        .map(|(t, id)| (t.text.to_string(), id))
        .collect();
    let model = BPE::builder()
        .vocab_and_merges(ids, merges)
        .build()
        .map_err(|e| err(g, format!("building the BPE model: {e}")))?;
    let mut inner = Tokenizer::new(model);
    inner.with_pre_tokenizer(Some(Sequence::new(steps)));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    let specials: Vec<AddedToken> = vocab
        .specials()
        .into_iter()
        .map(|(text, _)| AddedToken::from(text.to_string(), true))
        .collect();
    inner.add_special_tokens(&specials);
    Ok(Some(inner))
}
