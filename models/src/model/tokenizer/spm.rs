//! SentencePiece BPE over a GGUF vocabulary (`tokenizer.ggml.model = llama`: Llama 1/2,
//! Gemma), llama.cpp's `llm_tokenizer_spm_session` (after the original SentencePiece BPE
//! encoder): spaces become U+2581, the text starts as one symbol per character, and the
//! adjacent pair whose concatenation is the best-scoring vocabulary entry merges first (the
//! leftmost of equal scores), until no pair is an entry; a symbol left that is no entry (a
//! character outside the vocabulary) becomes its UTF-8 bytes' `<0xXX>` tokens. Decoding is
//! llama.cpp's `token_to_piece` with special tokens rendered: U+2581 back to spaces, byte
//! tokens to their byte, control and user-defined tokens as their text.
//!
//! It is not the `tokenizers` crate's Unigram (a Viterbi search for the best total score, which
//! gives other ids), and the crate's BPE could express it only through a merge list the file
//! does not carry (every split of every entry into two entries, ranked by the entry's score),
//! to be derived from the whole vocabulary at every load.

use crate::model::tokenizer::vocab::{TokenType, Vocab};
use kernel_common::KernelError;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

/// SentencePiece's space marker, U+2581.
pub(super) const SPACE: char = '\u{2581}';

/// The SentencePiece tokenizer of a vocabulary.
pub(super) struct Spm {
    /// Every token's text (as the file spells it) to its id; a text that appears twice keeps
    /// its last id, as llama.cpp's `token_to_id` does.
    ids: HashMap<Arc<str>, u32>,
    vocab: Vocab,
    /// The id of `<0xXX>` for each of the 256 bytes, where the vocabulary has it.
    bytes: Vec<Option<u32>>,
    /// Prefix a space to text at the start and after a special token (`add_space_prefix`),
    /// and drop the first token's leading space when decoding.
    add_space_prefix: bool,
}

/// A mergeable pair of adjacent symbols, ordered as llama.cpp's queue pops them.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Bytes the merged symbol would span: the pair is stale once either side has grown.
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// The highest score first, then the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

/// A symbol: a run of the text's bytes; `len` 0 once merged into its left neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Spm {
    pub(super) fn new(vocab: Vocab, add_space_prefix: bool) -> Spm {
        let mut ids = HashMap::with_capacity(vocab.len());
        for (id, t) in vocab.tokens.iter().enumerate() {
            ids.insert(t.text.clone(), id as u32);
        }
        let bytes = (0..256)
            .map(|b| ids.get(format!("<0x{b:02X}>").as_str()).copied())
            .collect();
        Spm {
            ids,
            vocab,
            bytes,
            add_space_prefix,
        }
    }

    /// The id of the entry spelled `text`.
    pub(super) fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Appends the ids of plain `text` (no special token in it) to `out`; `after_special`: it
    /// starts the input or follows a special token (where `add_space_prefix` adds its space).
    pub(super) fn encode_into(
        &self,
        text: &str,
        after_special: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), KernelError> {
        let mut s = String::with_capacity(text.len() + 3);
        if self.add_space_prefix && after_special {
            s.push(SPACE);
        }
        s.extend(text.chars().map(|c| if c == ' ' { SPACE } else { c }));
        let n = s.chars().count();
        let mut symbols: Vec<Symbol> = s
            .char_indices()
            .enumerate()
            .map(|(i, (start, c))| Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: (i + 1 < n).then_some(i + 1),
            })
            .collect();
        let mut queue = BinaryHeap::new();
        for i in 1..n {
            self.push_bigram(&s, &symbols, Some(i - 1), Some(i), &mut queue);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.left].next = r.next;
            symbols[b.right].len = 0;
            if let Some(next) = r.next {
                symbols[next].prev = Some(b.left);
            }
            self.push_bigram(&s, &symbols, l.prev, Some(b.left), &mut queue);
            self.push_bigram(&s, &symbols, Some(b.left), r.next, &mut queue);
        }
        // A merged symbol is an entry by construction, so only a lone character can be none:
        // llama.cpp's `rev_merge` fallback (a merged text to its halves) is never reached.
        let mut at = (n > 0).then_some(0);
        while let Some(i) = at {
            let sym = symbols[i];
            let piece = &s[sym.start..sym.start + sym.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &byte in piece.as_bytes() {
                        out.push(self.bytes[byte as usize].ok_or_else(|| {
                            KernelError::BadBuffer(format!(
                                "tokenizing: {piece:?} is not in the vocabulary and its byte \
                                 0x{byte:02X} has no <0x{byte:02X}> token"
                            ))
                        })?);
                    }
                }
            }
            at = sym.next;
        }
        Ok(())
    }

    fn push_bigram(
        &self,
        s: &str,
        symbols: &[Symbol],
        left: Option<usize>,
        right: Option<usize>,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (symbols[left], symbols[right]);
        let text = &s[l.start..r.start + r.len];
        if let Some(&id) = self.ids.get(text) {
            queue.push(Bigram {
                score: self.vocab.tokens[id as usize].score,
                left,
                right,
                size: text.len(),
            });
        }
    }

    /// The text of `ids` (bytes that do not form UTF-8 become U+FFFD).
    pub(super) fn decode(&self, ids: &[u32]) -> Result<String, KernelError> {
        let mut out = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let token = self.vocab.get(id)?;
            let start = out.len();
            match token.kind {
                TokenType::Normal => {
                    let text = token.text.replace(SPACE, " ");
                    out.extend_from_slice(text.as_bytes());
                }
                TokenType::Byte(b) => out.push(b),
                TokenType::Control | TokenType::UserDefined | TokenType::Unknown => {
                    out.extend_from_slice(token.text.as_bytes());
                }
                TokenType::Unused => {}
            }
            if i == 0 && self.add_space_prefix && out.get(start) == Some(&b' ') {
                out.remove(start);
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}
