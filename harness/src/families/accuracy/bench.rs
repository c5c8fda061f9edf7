//! What every accuracy point measures on one model and text: a model loaded with some
//! weight formats, evaluated over the text's windows (`quality::run`: perplexity with its
//! interval, KL divergence and top-1 agreement against the f32 model's log-probabilities,
//! computed once per run and kept in memory, llama.cpp's `--kl-divergence` statistics), and
//! its batch-1 decode speed (median step after a prompt, as `llama-bench`'s tg test).

use crate::error::{HarnessError, Result};
use crate::quality::{run, RefLogits, RefMeta};
use indicatif::ProgressBar;
use models::eval::perplexity::{KlStats, PplStats, Window};
use models::{load, Llama, LoadOptions, Session, WeightOverride};
use quant_kernels::{MatVecVariant, WeightFormat};
use std::collections::HashMap;
use std::time::Instant;

/// The formats of one model load: every matrix in `weights`, then the overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct Formats {
    pub weights: WeightFormat,
    pub overrides: Vec<WeightOverride>,
}

impl Formats {
    /// Every matrix in `f`.
    pub fn uniform(f: WeightFormat) -> Formats {
        Formats {
            weights: f,
            overrides: vec![],
        }
    }
}

/// Which windows a measurement scores: the long ones of the formats study and the plan, or
/// the short ones of the sensitivity sweeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Windows {
    Long,
    Short,
}

/// One evaluation against the f32 reference.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub ppl: PplStats,
    /// The f32 model's perplexity on the same windows.
    pub ref_ppl: f64,
    pub kl: KlStats,
    pub weight_bytes: usize,
    /// Bits per weight of the projection matrices (the ones formats and overrides change).
    pub projection_bits: f64,
}

/// The model, its text's tokens, the windows, the product, and what the run computes once.
pub struct Bench {
    pub model_path: String,
    pub text_sha256: String,
    pub tokens: Vec<u32>,
    pub long: Vec<Window>,
    pub short: Vec<Window>,
    pub matmul: MatVecVariant,
    pub decode_context: usize,
    pub decode_steps: usize,
    references: HashMap<Windows, (RefLogits, f64)>,
    f32_decode: Option<f64>,
}

impl Bench {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model_path: String,
        text_sha256: String,
        tokens: Vec<u32>,
        long: Vec<Window>,
        short: Vec<Window>,
        matmul: MatVecVariant,
        decode: (usize, usize),
    ) -> Bench {
        Bench {
            model_path,
            text_sha256,
            tokens,
            long,
            short,
            matmul,
            decode_context: decode.0,
            decode_steps: decode.1,
            references: HashMap::new(),
            f32_decode: None,
        }
    }

    fn windows(&self, w: Windows) -> &[Window] {
        match w {
            Windows::Long => &self.long,
            Windows::Short => &self.short,
        }
    }

    /// Windows of a kind, for the progress bar.
    pub fn window_count(&self, w: Windows) -> usize {
        self.windows(w).len()
    }

    /// The model with these formats, on this run's product.
    pub fn load(&self, f: &Formats) -> Result<Llama> {
        let opts = LoadOptions {
            attention: "paged".into(),
            weights: Some(f.weights),
            matmul: self.matmul,
            overrides: f.overrides.clone(),
            ..LoadOptions::default()
        };
        Ok(load(&self.model_path, &opts)?.model)
    }

    /// The f32 model's log-probabilities over windows `w`, computed on first use.
    fn reference(&mut self, w: Windows, bar: &ProgressBar) -> Result<()> {
        if !self.references.contains_key(&w) {
            bar.set_message(format!(
                "f32 reference over {} windows",
                self.windows(w).len()
            ));
            let m = self.load(&Formats::uniform(WeightFormat::F32))?;
            let out = run(
                &m,
                &self.tokens,
                self.windows(w),
                None,
                true,
                &ProgressBar::hidden(),
            )?;
            let meta = RefMeta {
                model: self.model_path.clone(),
                text_sha256: self.text_sha256.clone(),
                ctx: self.windows(w)[0].len,
                stride: self.windows(w)[0].len,
                windows: self.windows(w).len(),
                vocab: m.cfg.vocab,
            };
            let logprobs = out.kept.ok_or_else(|| {
                HarnessError::Usage("the reference run kept no log-probabilities".into())
            })?;
            let ppl = out.stats.ppl();
            self.references
                .insert(w, (RefLogits { meta, logprobs }, ppl));
        }
        Ok(())
    }

    /// `m` over windows `w` against the f32 reference.
    pub fn measure(&mut self, m: &Llama, w: Windows, bar: &ProgressBar) -> Result<Measured> {
        self.reference(w, bar)?;
        let (reference, ref_ppl) = &self.references[&w];
        let hidden = ProgressBar::hidden();
        let out = run(
            m,
            &self.tokens,
            self.windows(w),
            Some(reference),
            false,
            &hidden,
        )?;
        Ok(Measured {
            ppl: out.stats,
            ref_ppl: *ref_ppl,
            kl: out.kl.unwrap_or_default(),
            weight_bytes: m.weight_bytes(),
            projection_bits: projection_bits(m),
        })
    }

    /// Batch-1 decode tokens/s of `m`: the median of `decode_steps` steps after a
    /// `decode_context`-token prompt of the text.
    pub fn decode_tokens_per_s(&self, m: &Llama) -> Result<f64> {
        let prompt = &self.tokens[..self.decode_context];
        let mut s = Session::new(m, self.decode_context + self.decode_steps + 1, 16)?;
        let mut next = models::argmax(&s.forward(prompt)?);
        let mut samples = Vec::with_capacity(self.decode_steps);
        for _ in 0..self.decode_steps {
            let t0 = Instant::now();
            let logits = s.forward(&[next])?;
            samples.push(t0.elapsed().as_secs_f64());
            next = models::argmax(&logits);
        }
        let t = crate::measure::Timing { samples };
        Ok(1.0 / t.median())
    }

    /// The f32 model's decode tokens/s, measured on first use: the speed-ups' baseline.
    pub fn f32_decode(&mut self) -> Result<f64> {
        if let Some(v) = self.f32_decode {
            return Ok(v);
        }
        let m = self.load(&Formats::uniform(WeightFormat::F32))?;
        let v = self.decode_tokens_per_s(&m)?;
        self.f32_decode = Some(v);
        Ok(v)
    }
}

/// Stored bits per weight over the projection matrices of `m` (Q/K/V, O, gate/up, down of
/// every layer): what a per-layer plan changes.
pub fn projection_bits(m: &Llama) -> f64 {
    let (mut bits, mut params) = (0.0, 0.0);
    let mut add = |p: &quant_kernels::Prepared| {
        let n = (p.rows() * p.cols()) as f64;
        bits += 8.0 * p.byte_len() as f64;
        params += n;
    };
    for l in &m.layers {
        add(&l.wqkv);
        add(&l.wo);
        match &l.ffn {
            models::model::llama::Ffn::Dense(e) => {
                add(&e.gate_up);
                add(&e.down);
            }
            models::model::llama::Ffn::Moe { experts, .. } => {
                for e in experts {
                    add(&e.gate_up);
                    add(&e.down);
                }
            }
        }
    }
    bits / params.max(1.0)
}
