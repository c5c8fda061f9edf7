//! `harness eval perplexity`: the token-level negative log-likelihood of a model over a text,
//! in llama.cpp's `llama-perplexity` convention (chunks of `--ctx` tokens, the second half of
//! each scored) or transformers' sliding window (`--stride`), with the perplexity and its
//! standard error, the KL divergence and top-1 agreement against a reference run's
//! log-probabilities (`--reference-logits`, written by an earlier run's `--save-logits`), and
//! the tokens per second of the evaluation.

use crate::error::{HarnessError, Result};
use crate::model_source::resolve_model;
use crate::quality::{run, RefLogits, RefMeta};
use crate::texts::{sha256_hex, Text};
use crate::Format;
use models::eval::perplexity::windows;
use models::load;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The flags of `harness eval perplexity`.
#[derive(Debug, Clone, clap::Args)]
pub struct PerplexityArgs {
    /// A GGUF file or Hugging Face checkpoint directory of any architecture `harness generate`
    /// runs, smollm2 / qwen2.5-0.5b / gemma3-270m (the fetched GGUFs), or a preset (random
    /// weights: for trying the command only).
    #[arg(long)]
    pub model: String,
    /// The text: gpl3 (/usr/share/common-licenses/GPL-3), licenses (every Debian licence
    /// text), rust (this checkout's kernel sources), seeds (the claims' source documents,
    /// Chinese), or a path to a UTF-8 file.
    #[arg(long)]
    pub text: String,
    /// Convert every weight matrix to this format (f32, f16, q8_0, q4_0, q5_0, q4_k, q6_k,
    /// sym4g32, ...; a K-quant on rows that are not a multiple of 256 falls back as
    /// llama-quantize's does); default: keep the checkpoint's.
    #[arg(long)]
    pub weights: Option<String>,
    /// The product of every projection: packed (default; llama.cpp's int8-activation
    /// arithmetic for q4_0/q4_1/q8_0), fused:act=q8, fused (f32 activations: transformers'
    /// float32 arithmetic).
    #[arg(long, default_value = "packed")]
    pub matmul: String,
    /// What the KV cache stores (as `harness generate --kv-cache`): f32, f16, bf16, fp8,
    /// int8, fp8:per_head, int8:per_head, progressive:window=N,old=FORMAT[,recent=FORMAT].
    /// Each window is one prefill chunk, so a progressive cache has aged the window's blocks
    /// past N tokens before the chunk's attention reads them.
    #[arg(long, default_value = "f32")]
    pub kv_cache: String,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Tokens between window starts: --ctx (default) is llama.cpp's chunks, each scoring its
    /// second half; smaller is transformers' sliding window, each scoring its last STRIDE.
    #[arg(long)]
    pub stride: Option<usize>,
    /// Evaluate at most this many windows (default: every window of the text).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Save this run's log-probabilities (f32, scored rows × vocabulary: ~200 KB per scored
    /// token for SmolLM2) as a reference for --reference-logits.
    #[arg(long, value_name = "FILE")]
    pub save_logits: Option<PathBuf>,
    /// A reference run's --save-logits file (same model file, text and windows): the KL
    /// divergence and top-1 agreement of this run against it.
    #[arg(long, value_name = "FILE")]
    pub reference_logits: Option<PathBuf>,
    /// Write the text's token ids (a JSON array) here, to score the same tokens elsewhere
    /// (BOS first where the file asks for one, as llama-perplexity tokenizes the text).
    #[arg(long, value_name = "FILE")]
    pub save_tokens: Option<PathBuf>,
    /// Score these token ids (a JSON array, as --save-tokens or `llama-tokenize --ids` write
    /// them) instead of the text's tokenization by the model's tokenizer: the same tokens
    /// llama-perplexity scores, or a model whose tokenizer is not built here. --text still
    /// names the text they came from.
    #[arg(long, value_name = "FILE", conflicts_with = "save_tokens")]
    pub tokens: Option<PathBuf>,
    /// Worker threads (default: all logical cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// table: a few lines; json: one object.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

/// What `eval perplexity --format json` prints.
#[derive(Debug, Serialize)]
pub struct PerplexityReport {
    pub model: String,
    pub model_id: String,
    pub weights: String,
    pub matmul: String,
    pub kv_cache: String,
    pub text: String,
    pub text_origin: String,
    pub text_sha256: String,
    pub text_tokens: usize,
    /// sha256 of the token ids as little-endian u32: another tokenizer's ids compare by it.
    pub tokens_sha256: String,
    pub ctx: usize,
    pub stride: usize,
    pub windows: usize,
    pub scored_tokens: usize,
    pub nll_mean: f64,
    pub ppl: f64,
    /// llama.cpp's "+/-": the perplexity times the standard error of the mean NLL.
    pub ppl_stderr: f64,
    pub ppl_ci95: (f64, f64),
    pub kl_mean: Option<f64>,
    pub kl_stderr: Option<f64>,
    pub top1_agreement: Option<f64>,
    pub tokens_per_s: f64,
    pub seconds: f64,
    pub threads: usize,
    /// Bytes of the loaded weights per stored type, and its one-line summary.
    pub weight_bytes: std::collections::BTreeMap<String, usize>,
    pub weights_line: String,
}

/// The model's identity for reference files: the file's sha256, a directory's files' hashed
/// in name order, or the preset's name. Files are hashed as they are read, never held whole
/// (a 0.5B model's file beside its loaded weights would double the run's memory).
pub fn model_id(model: &str) -> Result<String> {
    use sha2::{Digest, Sha256};
    let path = Path::new(model);
    let io = |e: std::io::Error| HarnessError::Usage(format!("--model {model}: {e}"));
    let files: Vec<PathBuf> = if path.is_file() {
        vec![path.to_path_buf()]
    } else if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(io)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        files
    } else {
        return Ok(format!("preset {model}"));
    };
    let mut hash = Sha256::new();
    for f in files {
        let mut file = std::fs::File::open(&f).map_err(io)?;
        std::io::copy(&mut file, &mut hash).map_err(io)?;
    }
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

/// Token ids from a JSON array file, each inside the vocabulary.
fn read_tokens(path: &Path, vocab: usize) -> Result<Vec<u32>> {
    let bad = |m: String| HarnessError::Usage(format!("--tokens {}: {m}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let ids: Vec<u32> = serde_json::from_str(&text)
        .map_err(|e| bad(format!("not a JSON array of token ids ({e})")))?;
    if let Some(t) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(bad(format!(
            "token id {t} is outside the vocabulary of {vocab}"
        )));
    }
    Ok(ids)
}

/// Runs `harness eval perplexity`; the report is printed by the caller.
pub fn perplexity(a: &PerplexityArgs, root: Option<&Path>) -> Result<PerplexityReport> {
    let text = Text::resolve(&a.text, root)?;
    let path = resolve_model(&a.model)?;
    let opts = crate::load_flags::LoadFlags {
        attention: Some("paged".into()),
        weights: a.weights.clone(),
        matmul: Some(a.matmul.clone()),
        kv_cache: Some(a.kv_cache.clone()),
        ..Default::default()
    }
    .options()?;
    let loaded = load(&path, &opts)?;
    let model = loaded.model;
    let bos = loaded.tokenizer.as_ref().and_then(|t| t.bos_to_add());
    let tokens = match &a.tokens {
        Some(p) => read_tokens(p, model.cfg.vocab)?,
        None => {
            let tokenizer = loaded.tokenizer.ok_or_else(|| {
                HarnessError::Usage(format!(
                    "--model {}: it has no tokenizer ({}); perplexity needs a real model's, or --tokens",
                    a.model,
                    loaded.tokenizer_note.as_deref().unwrap_or("a preset")
                ))
            })?;
            // The stream as llama-perplexity tokenizes it: BOS first where the file asks.
            tokenizer.prompt_ids(&text.content)?
        }
    };
    let weights_line = crate::model_source::weights_line(&model);
    let weight_bytes = crate::model_source::weight_bytes_by_type(&model);
    if let Some(p) = &a.save_tokens {
        std::fs::write(p, serde_json::to_string(&tokens).expect("serialisable"))
            .map_err(|e| HarnessError::Usage(format!("--save-tokens {}: {e}", p.display())))?;
    }
    let ctx = a.ctx;
    if ctx > model.cfg.context {
        return Err(HarnessError::Usage(format!(
            "--ctx {ctx} is beyond the model's context of {}",
            model.cfg.context
        )));
    }
    let stride = a.stride.unwrap_or(ctx);
    let wins = windows(tokens.len(), ctx, stride, a.chunks).map_err(HarnessError::Usage)?;
    // llama-perplexity's chunks start with BOS where the file asks for one (Gemma's).
    let tokens = if stride == ctx {
        models::eval::perplexity::with_bos_per_chunk(tokens, &wins, bos)
    } else {
        tokens
    };
    let meta = RefMeta {
        model: model_id(&path)?,
        text_sha256: text.sha256.clone(),
        ctx,
        stride,
        windows: wins.len(),
        vocab: model.cfg.vocab,
    };
    let reference = match &a.reference_logits {
        Some(p) => {
            let r = RefLogits::load(p)?;
            r.check(&meta, p)?;
            Some(r)
        }
        None => None,
    };
    let bar = crate::run_files::progress_bar(wins.len());
    bar.set_message(format!("{} windows of {ctx} tokens", wins.len()));
    let out = run(
        &model,
        &tokens,
        &wins,
        reference.as_ref(),
        a.save_logits.is_some(),
        &bar,
    )?;
    bar.finish_and_clear();
    if let (Some(p), Some(kept)) = (&a.save_logits, out.kept.as_ref()) {
        RefLogits {
            meta: meta.clone(),
            logprobs: kept.clone(),
        }
        .save(p)?;
    }
    Ok(PerplexityReport {
        model: a.model.clone(),
        model_id: meta.model,
        weights: a.weights.clone().unwrap_or_else(|| "native".into()),
        matmul: a.matmul.clone(),
        kv_cache: opts.kv_cache.to_string(),
        text: text.name,
        text_origin: text.origin,
        text_sha256: text.sha256,
        text_tokens: tokens.len(),
        tokens_sha256: sha256_hex(
            &tokens
                .iter()
                .flat_map(|t| t.to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
        ctx,
        stride,
        windows: wins.len(),
        scored_tokens: out.stats.nll.count,
        nll_mean: out.stats.nll.mean(),
        ppl: out.stats.ppl(),
        ppl_stderr: out.stats.ppl_stderr(),
        ppl_ci95: out.stats.ppl_ci95(),
        kl_mean: out.kl.map(|k| k.kl.mean()),
        kl_stderr: out.kl.map(|k| k.kl.stderr()),
        top1_agreement: out.kl.map(|k| k.top1_agreement()),
        tokens_per_s: out.tokens_per_s(),
        seconds: out.seconds,
        threads: rayon::current_num_threads(),
        weight_bytes,
        weights_line,
    })
}

impl PerplexityReport {
    /// The table form: a few lines.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{} ({}) weights {} matmul {} kv-cache {}\n{}\ntext {} ({}, sha256 {}…): {} tokens, {} windows of {} (stride {}), {} scored\nPPL = {:.4} +/- {:.5} (95% CI {:.4}–{:.4}), mean NLL {:.5}\n",
            self.model,
            self.model_id,
            self.weights,
            self.matmul,
            self.kv_cache,
            self.weights_line,
            self.text,
            self.text_origin,
            &self.text_sha256[..12],
            self.text_tokens,
            self.windows,
            self.ctx,
            self.stride,
            self.scored_tokens,
            self.ppl,
            self.ppl_stderr,
            self.ppl_ci95.0,
            self.ppl_ci95.1,
            self.nll_mean
        );
        if let (Some(kl), Some(e), Some(t)) = (self.kl_mean, self.kl_stderr, self.top1_agreement) {
            s.push_str(&format!(
                "KL divergence from the reference {kl:.6} +/- {e:.6} nats, top-1 agreement {:.2}%\n",
                100.0 * t
            ));
        }
        s.push_str(&format!(
            "{:.1} tokens/s ({} threads, {:.1} s)",
            self.tokens_per_s, self.threads, self.seconds
        ));
        s
    }
}
