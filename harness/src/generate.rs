//! `harness generate`: generation with a real checkpoint (a GGUF llama file, e.g.
//! SmolLM2-135M-Instruct from scripts/fetch-models.sh) on the kernel crates, greedy or sampled
//! (temperature, top-k, top-p, seeded): text streams to
//! the terminal as tokens are produced, or one JSON object with the ids, the text and the
//! timings (time to first token, time per output token, tokens/s).

use crate::error::{HarnessError, Result};
use crate::Format;
use models::{Gguf, Llama, Sampler, SamplerConfig, TextTokenizer};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// What `harness generate` was asked to do.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub model: PathBuf,
    pub prompt: Option<String>,
    pub prompt_ids: Option<Vec<u32>>,
    pub max_new_tokens: usize,
    pub ignore_eos: bool,
    pub sampler: SamplerConfig,
    pub attention: String,
    pub format: Format,
}

/// The JSON `--format json` prints.
#[derive(Debug, Serialize)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    pub text: String,
    pub ttft_ms: f64,
    pub tpot_ms: Option<f64>,
    pub tokens_per_s: Option<f64>,
}

/// Runs the generation; returns the exit code.
pub fn run(opts: &GenerateOptions) -> Result<i32> {
    let mut sampler = Sampler::new(opts.sampler)?;
    if opts.max_new_tokens == 0 {
        return Err(HarnessError::Usage(
            "--max-new-tokens must be at least 1".into(),
        ));
    }
    if opts.model.extension().is_none_or(|e| e != "gguf") {
        return Err(HarnessError::Usage(format!(
            "--model {}: only GGUF llama files are supported so far (presets and HF directories come later)",
            opts.model.display()
        )));
    }
    let g = Gguf::open(&opts.model)?;
    let tok = TextTokenizer::from_gguf(&g)?;
    let mut model = Llama::from_gguf(&g, &opts.attention)?;
    let prompt_ids = match (&opts.prompt, &opts.prompt_ids) {
        (Some(p), None) => tok.encode(p)?,
        (None, Some(ids)) => ids.clone(),
        _ => {
            return Err(HarnessError::Usage(
                "give exactly one of --prompt TEXT and --prompt-ids 1,2,3".into(),
            ))
        }
    };
    if prompt_ids.is_empty() {
        return Err(HarnessError::Usage("the prompt has no tokens".into()));
    }
    if let Some(bad) = prompt_ids.iter().find(|&&t| t as usize >= tok.vocab_size) {
        return Err(HarnessError::Usage(format!(
            "prompt id {bad} is outside the vocabulary of {}",
            tok.vocab_size
        )));
    }
    if prompt_ids.len() + opts.max_new_tokens > model.cfg.context {
        return Err(HarnessError::Usage(format!(
            "{} prompt tokens + {} new tokens exceed the model's context of {}",
            prompt_ids.len(),
            opts.max_new_tokens,
            model.cfg.context
        )));
    }
    let eos = if opts.ignore_eos { None } else { tok.eos };
    let stream = opts.format == Format::Table;
    let started = Instant::now();
    let mut logits = model.forward(&prompt_ids)?;
    let mut generated = vec![];
    let mut ttft = 0.0;
    let mut printed = 0;
    loop {
        let next = sampler.sample(&logits);
        generated.push(next);
        if generated.len() == 1 {
            ttft = started.elapsed().as_secs_f64();
        }
        if stream {
            let text = tok.decode(&generated)?;
            // Print only complete characters: a partial UTF-8 sequence decodes to U+FFFD.
            if !text.ends_with('\u{FFFD}') && text.len() > printed {
                print!("{}", &text[printed..]);
                let _ = std::io::stdout().flush();
                printed = text.len();
            }
        }
        if Some(next) == eos || generated.len() == opts.max_new_tokens {
            break;
        }
        logits = model.forward(&[next])?;
    }
    let total = started.elapsed().as_secs_f64();
    let decode_steps = generated.len() - 1;
    let tpot = (decode_steps > 0).then(|| (total - ttft) / decode_steps as f64);
    let out = Generation {
        text: tok.decode(&generated)?,
        prompt_ids,
        ttft_ms: ttft * 1e3,
        tpot_ms: tpot.map(|t| t * 1e3),
        tokens_per_s: tpot.map(|t| 1.0 / t),
        generated_ids: generated,
    };
    match opts.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&out)?),
        Format::Table => {
            println!();
            eprintln!(
                "{} prompt + {} generated tokens; time to first token {:.1} ms, {} per output token",
                out.prompt_ids.len(),
                out.generated_ids.len(),
                out.ttft_ms,
                out.tpot_ms
                    .map_or("–".into(), |t| format!("{t:.2} ms ({:.1} tokens/s)", 1e3 / t))
            );
        }
    }
    Ok(0)
}
