//! `TextTokenizer`: text to token ids and back for a model, as llama.cpp's `llama_vocab`
//! tokenizes (`tokenize(text, add_special, parse_special = true)`): the tokenizer is chosen
//! from `tokenizer.ggml.model` (`gpt2`: byte-level BPE, `bpe.rs`; `llama`: SentencePiece,
//! `spm.rs`) and `tokenizer.ggml.pre`; the special tokens in the text are cut out first
//! (`special.rs`) and the plain text between them is tokenized. A Hugging Face checkpoint's
//! `tokenizer.json` is the `tokenizers` crate's own, as the checkpoint ships it.

use crate::model::gguf::{Gguf, Result, Value};
use crate::model::tokenizer::bpe::{bpe, PRE};
use crate::model::tokenizer::special::{Fragment, Specials};
use crate::model::tokenizer::spm::{Spm, SPACE};
use crate::model::tokenizer::vocab::{err, Vocab};
use kernel_common::KernelError;
use tokenizers::Tokenizer;

/// How plain text becomes ids.
enum Kind {
    /// The `tokenizers` crate: byte-level BPE from a GGUF file, or a `tokenizer.json`.
    Crate(Box<Tokenizer>),
    SentencePiece(Spm),
}

/// A tokenizer and the ids generation needs.
pub struct TextTokenizer {
    kind: Kind,
    /// The specials cut out before tokenizing (none for a `tokenizer.json`, whose added tokens
    /// the crate matches itself).
    specials: Specials,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub vocab_size: usize,
    /// `encode` refuses a text whose ids would not decode back to it: byte-level BPE without
    /// a normaliser loses a byte its vocabulary has no token for (SmolLM2's lacks 21 of the
    /// 256, control characters and the lead bytes above U+3FFFF among them), SentencePiece
    /// turns a U+2581 into a space. False where decoding may differ anyway (a `tokenizer.json`
    /// with its normaliser, SentencePiece's `add_space_prefix`).
    pub lossless: bool,
    /// The model expects BOS before the prompt: `tokenizer.ggml.add_bos_token`, else
    /// llama.cpp's default (SentencePiece yes, byte-level BPE no). `encode` never adds it;
    /// `prompt_ids` does.
    pub add_bos: bool,
}

/// The optional id `key`.
fn id(g: &Gguf, key: &str) -> Result<Option<u32>> {
    match g.meta.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(g.uint(key)? as u32)),
    }
}

impl TextTokenizer {
    /// The tokenizer of `g`: `tokenizer.ggml.model` `gpt2` with `tokenizer.ggml.pre` `smollm`,
    /// `qwen2` or `default` (or none), or `llama` (SentencePiece). Anything else is one error
    /// naming the key and its value.
    pub fn from_gguf(g: &Gguf) -> Result<TextTokenizer> {
        let model = g.string("tokenizer.ggml.model")?;
        let pre = match g.meta.get("tokenizer.ggml.pre") {
            None => None,
            Some(_) => Some(g.string("tokenizer.ggml.pre")?),
        };
        let flag = |key: &str| match g.meta.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(err(g, format!("metadata {key} is {other:?}, not a bool"))),
        };
        let sentencepiece = match model {
            "gpt2" => false,
            "llama" => true,
            other => {
                return Err(err(
                    g,
                    format!(
                        "tokenizer.ggml.model = {other:?} is not a tokenizer this reader \
                         knows (gpt2: byte-level BPE, llama: SentencePiece)"
                    ),
                ))
            }
        };
        if let Some(p) = pre.filter(|p| sentencepiece && *p != "default") {
            return Err(err(
                g,
                format!(
                    "tokenizer.ggml.pre = {p:?} with tokenizer.ggml.model = llama \
                     (SentencePiece takes only default)"
                ),
            ));
        }
        let vocab = Vocab::from_gguf(g)?;
        let specials = Specials::new(vocab.specials());
        let vocab_size = vocab.len();
        let (kind, add_bos, bos, eos, lossless) = if sentencepiece {
            let prefix = flag("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
            let add_bos = flag("tokenizer.ggml.add_bos_token")?.unwrap_or(true);
            let bos = id(g, "tokenizer.ggml.bos_token_id")?.unwrap_or(1);
            let eos = id(g, "tokenizer.ggml.eos_token_id")?.unwrap_or(2);
            let spm = Spm::new(vocab, prefix);
            let lossless = !prefix;
            (
                Kind::SentencePiece(spm),
                add_bos,
                Some(bos),
                Some(eos),
                lossless,
            )
        } else {
            let inner = bpe(g, pre, &vocab)?.ok_or_else(|| {
                err(
                    g,
                    format!(
                        "tokenizer.ggml.pre = {:?} is not a pre-tokenizer this reader knows \
                         ({PRE}) for tokenizer.ggml.model = gpt2",
                        pre.unwrap_or_default()
                    ),
                )
            })?;
            let add_bos = flag("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
            let bos = id(g, "tokenizer.ggml.bos_token_id")?;
            let eos = id(g, "tokenizer.ggml.eos_token_id")?;
            (Kind::Crate(Box::new(inner)), add_bos, bos, eos, true)
        };
        for (name, id) in [("bos", bos), ("eos", eos)] {
            if let Some(id) = id.filter(|&i| i as usize >= vocab_size) {
                return Err(err(
                    g,
                    format!(
                        "tokenizer.ggml.{name}_token_id = {id} is outside the vocabulary of \
                         {vocab_size}"
                    ),
                ));
            }
        }
        if add_bos && bos.is_none() {
            return Err(err(
                g,
                "tokenizer.ggml.add_bos_token is true but there is no tokenizer.ggml.bos_token_id",
            ));
        }
        Ok(TextTokenizer {
            kind,
            specials,
            bos,
            eos,
            vocab_size,
            lossless,
            add_bos,
        })
    }

    /// A tokenizer the `tokenizers` crate built (a checkpoint's `tokenizer.json`): its added
    /// tokens are its specials, and no BOS is added (`add_bos` false).
    pub fn from_tokenizers(
        inner: Tokenizer,
        vocab_size: usize,
        bos: Option<u32>,
        eos: Option<u32>,
        lossless: bool,
    ) -> TextTokenizer {
        TextTokenizer {
            kind: Kind::Crate(Box::new(inner)),
            specials: Specials::new(vec![]),
            bos,
            eos,
            vocab_size,
            lossless,
            add_bos: false,
        }
    }

    /// The id of the vocabulary entry spelled `piece` (a token's text as the vocabulary
    /// stores it: `Ġ` for a byte-level space, `▁` for a SentencePiece one).
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        match &self.kind {
            Kind::Crate(t) => t.token_to_id(piece),
            Kind::SentencePiece(s) => s.token_id(piece),
        }
    }

    /// Token ids of `text`, special tokens in it included, without BOS; for a lossless
    /// tokenizer, an error naming the first character that would not come back.
    pub fn encode(&self, text: &str) -> std::result::Result<Vec<u32>, KernelError> {
        let mut ids = Vec::new();
        let mut after_special = true;
        for piece in self.specials.partition(text) {
            let range = match piece {
                Fragment::Token(id) => {
                    ids.push(id);
                    after_special = true;
                    continue;
                }
                Fragment::Text(range) => range,
            };
            let plain = &text[range];
            match &self.kind {
                Kind::Crate(t) => ids.extend(
                    t.encode(plain, false)
                        .map_err(|e| KernelError::BadBuffer(format!("tokenizing: {e}")))?
                        .get_ids(),
                ),
                Kind::SentencePiece(s) => s.encode_into(plain, after_special, &mut ids)?,
            }
            after_special = false;
        }
        if self.lossless {
            self.check_round_trip(text, &ids)?;
        }
        Ok(ids)
    }

    /// The BOS token where the model expects one before its text (`add_bos`), else `None`.
    pub fn bos_to_add(&self) -> Option<u32> {
        self.bos.filter(|_| self.add_bos)
    }

    /// `encode(text)` after BOS where the model expects one (`add_bos`): the prompt as
    /// llama.cpp feeds it (`llama_tokenize(.., add_special = true, parse_special = true)`).
    pub fn prompt_ids(&self, text: &str) -> std::result::Result<Vec<u32>, KernelError> {
        let mut ids: Vec<u32> = self.bos_to_add().into_iter().collect();
        ids.extend(self.encode(text)?);
        Ok(ids)
    }

    fn check_round_trip(&self, text: &str, ids: &[u32]) -> std::result::Result<(), KernelError> {
        let back = self.decode(ids)?;
        if back == text {
            return Ok(());
        }
        let at = text
            .char_indices()
            .zip(back.chars().map(Some).chain(std::iter::repeat(None)))
            .find(|((_, a), b)| Some(*a) != *b)
            .map_or(text.len(), |((i, _), _)| i);
        let c = text[at..].chars().next().unwrap_or('?');
        let why = match (&self.kind, c) {
            (Kind::SentencePiece(_), SPACE) => {
                "SentencePiece writes spaces as U+2581, so it would come back as a space"
            }
            _ => "the vocabulary has no token for it",
        };
        Err(KernelError::BadBuffer(format!(
            "tokenizing: {c:?} (U+{:04X}) at byte {at} of the text would not come back from its ids: {why}",
            c as u32
        )))
    }

    /// Text of `ids`, special tokens written out.
    pub fn decode(&self, ids: &[u32]) -> std::result::Result<String, KernelError> {
        match &self.kind {
            Kind::Crate(t) => t
                .decode(ids, false)
                .map_err(|e| KernelError::BadBuffer(format!("detokenizing: {e}"))),
            Kind::SentencePiece(s) => s.decode(ids),
        }
    }
}
