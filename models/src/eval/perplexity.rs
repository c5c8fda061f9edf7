//! Perplexity of a model over a token stream, in the two conventions users compare against:
//!
//! - `stride == ctx` (the default): llama.cpp's `llama-perplexity` — the stream is cut into
//!   chunks of `ctx` tokens, each evaluated from an empty cache, and only the second half of
//!   each chunk is scored (logit rows `ctx/2 .. ctx-1`, each predicting the next token with at
//!   least `ctx/2` tokens of context); where the file asks for BOS (`add_bos_token`, Gemma's
//!   files) each chunk's first token is replaced by it, as llama-perplexity does
//!   (`with_bos_per_chunk`), none otherwise (SmolLM's and Qwen2's files);
//! - `stride < ctx`: transformers' sliding window (the "perplexity of fixed-length models"
//!   recipe) — windows of `ctx` tokens start every `stride` tokens; the first scores every
//!   row, each later one its last `stride` rows, so every token after the first is scored once.
//!
//! Reports the mean negative log-likelihood, the perplexity and llama.cpp's standard error
//! (`ppl · sqrt((E[nll²] − E[nll]²) / (n − 1))`), and hands every scored row's
//! log-probabilities to the caller, for KL divergence and top-1 agreement against a
//! reference run (`KlStats`) or to save them.

use crate::model::llama::{Llama, Result};
use crate::serve::session::Session;
use kernel_common::KernelError;

/// One window of the stream: tokens `start .. start + len`, logit rows `first .. len - 1`
/// scored (row j predicts token `start + j + 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: usize,
    pub len: usize,
    pub first: usize,
}

/// `tokens` with each window's first token replaced by `bos`, llama-perplexity's convention
/// for a model that expects BOS (`tokens[batch_start] = bos` per chunk): the replaced tokens
/// are never scored, since a chunk scores only its second half. Only for the llama.cpp
/// convention (windows that do not overlap); `None` leaves the stream as it is.
pub fn with_bos_per_chunk(mut tokens: Vec<u32>, windows: &[Window], bos: Option<u32>) -> Vec<u32> {
    if let Some(b) = bos {
        for w in windows {
            debug_assert!(w.first >= 1, "the chunk's first token is not scored");
            tokens[w.start] = b;
        }
    }
    tokens
}

impl Window {
    /// Rows it scores.
    pub fn scored(&self) -> usize {
        self.len - 1 - self.first
    }
}

/// The windows of a stream of `n_tokens` for `ctx` and `stride`, at most `max_windows` of
/// them; a stream shorter than one window, a `ctx` below 4 or a stride of 0 or above `ctx`
/// is an error naming the numbers.
pub fn windows(
    n_tokens: usize,
    ctx: usize,
    stride: usize,
    max_windows: Option<usize>,
) -> std::result::Result<Vec<Window>, String> {
    if ctx < 4 {
        return Err(format!("--ctx {ctx} is too small (at least 4 tokens)"));
    }
    if stride == 0 || stride > ctx {
        return Err(format!(
            "--stride {stride} must be in 1..={ctx} (the --ctx)"
        ));
    }
    if n_tokens < ctx {
        return Err(format!(
            "the text has {n_tokens} tokens, shorter than one window of --ctx {ctx}"
        ));
    }
    let mut out = vec![];
    if stride == ctx {
        for k in 0..n_tokens / ctx {
            out.push(Window {
                start: k * ctx,
                len: ctx,
                first: ctx / 2,
            });
        }
    } else {
        out.push(Window {
            start: 0,
            len: ctx,
            first: 0,
        });
        let mut start = stride;
        while start + ctx <= n_tokens {
            out.push(Window {
                start,
                len: ctx,
                first: ctx - 1 - stride,
            });
            start += stride;
        }
    }
    if let Some(m) = max_windows {
        out.truncate(m.max(1));
    }
    Ok(out)
}

/// Running sums of a per-token statistic: mean and its standard error.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Moments {
    pub count: usize,
    pub sum: f64,
    pub sum2: f64,
}

impl Moments {
    pub fn add(&mut self, v: f64) {
        self.count += 1;
        self.sum += v;
        self.sum2 += v * v;
    }

    pub fn mean(&self) -> f64 {
        self.sum / self.count.max(1) as f64
    }

    /// Standard error of the mean (0 for fewer than 2 values).
    pub fn stderr(&self) -> f64 {
        if self.count < 2 {
            return 0.0;
        }
        let m = self.mean();
        let var = (self.sum2 / self.count as f64 - m * m).max(0.0);
        (var / (self.count - 1) as f64).sqrt()
    }
}

/// Negative log-likelihood of the scored tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PplStats {
    pub nll: Moments,
}

impl PplStats {
    pub fn ppl(&self) -> f64 {
        self.nll.mean().exp()
    }

    /// llama.cpp's "PPL = x +/- y": the perplexity times the standard error of the mean NLL.
    pub fn ppl_stderr(&self) -> f64 {
        self.ppl() * self.nll.stderr()
    }

    /// A 95% interval: exp(mean NLL ± 1.96 standard errors).
    pub fn ppl_ci95(&self) -> (f64, f64) {
        let (m, e) = (self.nll.mean(), self.nll.stderr());
        ((m - 1.96 * e).exp(), (m + 1.96 * e).exp())
    }
}

/// Divergence of a run's next-token distributions from a reference run's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KlStats {
    /// KL(reference ‖ run) per scored token, in nats.
    pub kl: Moments,
    /// Tokens whose most likely next token is the reference's.
    pub top1_same: usize,
}

impl KlStats {
    /// Adds one scored row: both as log-probabilities over the vocabulary.
    pub fn add(&mut self, reference: &[f32], run: &[f32]) {
        let kl: f64 = reference
            .iter()
            .zip(run)
            .map(|(&r, &q)| {
                let p = (r as f64).exp();
                if p > 0.0 {
                    p * (r as f64 - q as f64)
                } else {
                    0.0
                }
            })
            .sum();
        self.kl.add(kl.max(0.0));
        self.top1_same += usize::from(argmax(reference) == argmax(run));
    }

    pub fn top1_agreement(&self) -> f64 {
        self.top1_same as f64 / self.kl.count.max(1) as f64
    }
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0
}

/// Log-softmax of one row of logits, accumulated in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let z: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    let lz = max + z.ln();
    logits.iter().map(|&x| (x as f64 - lz) as f32).collect()
}

/// One scored row as the caller sees it: its position in the stream (the index of the token
/// it predicts), that token, and the row's log-probabilities.
pub struct ScoredRow<'a> {
    pub predicts: usize,
    pub target: u32,
    pub logprobs: &'a [f32],
}

/// Evaluates `windows` of `tokens`, each from an empty cache (blocks of `block_size`); calls
/// `on_row` for every scored row in stream order and `on_window` after each window.
pub fn evaluate(
    model: &Llama,
    tokens: &[u32],
    windows: &[Window],
    block_size: usize,
    on_row: impl FnMut(ScoredRow),
    on_window: impl FnMut(usize),
) -> Result<PplStats> {
    evaluate_chunked(
        model,
        tokens,
        windows,
        block_size,
        usize::MAX,
        on_row,
        on_window,
    )
}

/// `evaluate` with each window run through the model in pieces of `prefill_chunk` tokens, as
/// a server's chunked prefill fills the cache: each piece's attention reads the cache as it
/// stands after the piece is written (what a progressive KV cache has aged by then depends on
/// the piece's end).
pub fn evaluate_chunked(
    model: &Llama,
    tokens: &[u32],
    windows: &[Window],
    block_size: usize,
    prefill_chunk: usize,
    mut on_row: impl FnMut(ScoredRow),
    mut on_window: impl FnMut(usize),
) -> Result<PplStats> {
    let vocab = model.cfg.vocab;
    let mut stats = PplStats::default();
    for (k, w) in windows.iter().enumerate() {
        let slice = tokens.get(w.start..w.start + w.len).ok_or_else(|| {
            KernelError::InvalidShape(format!(
                "window {k} ({}..{}) is past the {} tokens",
                w.start,
                w.start + w.len,
                tokens.len()
            ))
        })?;
        if let Some(&t) = slice.iter().find(|&&t| t as usize >= vocab) {
            return Err(KernelError::InvalidShape(format!(
                "token id {t} is outside the vocabulary of {vocab}"
            )));
        }
        let mut session = Session::new(model, w.len, block_size)?;
        let mut logits = Vec::with_capacity(w.len * vocab);
        for piece in slice.chunks(prefill_chunk.max(1)) {
            logits.extend(session.forward_all(piece)?);
        }
        for j in w.first..w.len - 1 {
            let lp = log_softmax(&logits[j * vocab..(j + 1) * vocab]);
            let target = slice[j + 1];
            stats.nll.add(-(lp[target as usize] as f64));
            on_row(ScoredRow {
                predicts: w.start + j + 1,
                target,
                logprobs: &lp,
            });
        }
        on_window(k);
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_chunks_score_their_second_halves() {
        let w = windows(1000, 256, 256, None).unwrap();
        assert_eq!(w.len(), 3);
        assert_eq!(
            w[1],
            Window {
                start: 256,
                len: 256,
                first: 128
            }
        );
        assert_eq!(w[0].scored(), 127);
        assert_eq!(windows(1000, 256, 256, Some(2)).unwrap().len(), 2);
    }

    #[test]
    fn sliding_windows_score_every_token_once() {
        let ctx = 16;
        for stride in [1, 3, 8, 15] {
            let w = windows(100, ctx, stride, None).unwrap();
            let mut predicted = vec![];
            for x in &w {
                predicted.extend((x.first..x.len - 1).map(|j| x.start + j + 1));
            }
            let want: Vec<usize> = (1..predicted.len() + 1).collect();
            assert_eq!(predicted, want, "stride {stride}");
            assert!(*predicted.last().unwrap() < 100);
        }
    }

    #[test]
    fn bad_windows_name_the_numbers() {
        assert!(windows(100, 256, 256, None)
            .unwrap_err()
            .contains("100 tokens"));
        assert!(windows(1000, 256, 0, None)
            .unwrap_err()
            .contains("--stride 0"));
        assert!(windows(1000, 256, 300, None)
            .unwrap_err()
            .contains("1..=256"));
        assert!(windows(1000, 2, 2, None).unwrap_err().contains("too small"));
    }

    #[test]
    fn moments_and_kl_match_hand_computed_values() {
        let mut m = Moments::default();
        for v in [1.0, 2.0, 3.0, 4.0] {
            m.add(v);
        }
        assert_eq!(m.mean(), 2.5);
        // Sample variance 5/3 over 4 values: stderr sqrt(1.25 / 3).
        assert!((m.stderr() - (1.25f64 / 3.0).sqrt()).abs() < 1e-12);
        let p = log_softmax(&[1.0, 2.0, 3.0]);
        let q = log_softmax(&[3.0, 2.0, 1.0]);
        let mut kl = KlStats::default();
        kl.add(&p, &p);
        assert!(kl.kl.mean().abs() < 1e-7);
        kl.add(&p, &q);
        let want: f64 = p
            .iter()
            .zip(&q)
            .map(|(&a, &b)| (a as f64).exp() * (a as f64 - b as f64))
            .sum();
        assert!((kl.kl.sum - want).abs() < 1e-6, "{} vs {want}", kl.kl.sum);
        assert_eq!(kl.top1_same, 1);
        assert_eq!(kl.top1_agreement(), 0.5);
    }
}
