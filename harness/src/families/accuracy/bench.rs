//! What every accuracy point measures on one model and text: a model loaded with some
//! weight formats, evaluated over the text's windows (`quality::run`: perplexity with its
//! interval, KL divergence and top-1 agreement against the f32 model's log-probabilities,
//! computed once per run and kept in memory, llama.cpp's `--kl-divergence` statistics), and
//! its batch-1 decode speed (median step after a prompt, as `llama-bench`'s tg test).

use crate::error::{HarnessError, Result};
use crate::quality::{run, RefLogits, RefMeta};
use indicatif::ProgressBar;
use kernel_quant::{MatVecVariant, WeightFormat};
use models::eval::perplexity::{KlStats, PplStats, Window};
use models::{load, Llama, LoadOptions, Session, WeightOverride};
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
    /// The f32 model, loaded on first use (the references and the speed baseline).
    f32_model: Option<Llama>,
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
            f32_model: None,
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

    /// Loads the f32 model unless it is loaded.
    fn ensure_f32(&mut self) -> Result<()> {
        if self.f32_model.is_none() {
            self.f32_model = Some(self.load(&Formats::uniform(WeightFormat::F32))?);
        }
        Ok(())
    }

    /// The f32 model's log-probabilities over windows `w`, computed on first use.
    fn reference(&mut self, w: Windows, bar: &ProgressBar) -> Result<()> {
        if !self.references.contains_key(&w) {
            bar.set_message(format!(
                "f32 reference over {} windows",
                self.windows(w).len()
            ));
            self.ensure_f32()?;
            let m = self.f32_model.as_ref().expect("loaded");
            let out = run(
                m,
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
        self.ensure_f32()?;
        let v = self.decode_tokens_per_s(self.f32_model.as_ref().expect("loaded"))?;
        self.f32_decode = Some(v);
        Ok(v)
    }
}

/// Stored bits per weight over the projection matrices of `m` (Q/K/V, O, gate/up, down of
/// every layer, every expert's): what a per-layer plan changes.
pub fn projection_bits(m: &Llama) -> f64 {
    let (mut bits, mut params) = (0.0, 0.0);
    for l in &m.layers {
        for p in l.projections() {
            for w in &p.parts {
                bits += 8.0 * w.byte_len() as f64;
                params += (w.rows() * w.cols()) as f64;
            }
        }
    }
    bits / params.max(1.0)
}

#[cfg(test)]
mod tests {
    use super::super::plan::{mixed, one_layer, rank_by_kl};
    use super::*;
    use models::eval::perplexity::windows;

    /// tiny-gqa (4 layers, d 256, vocab 512, seeded random weights) over a fixed token
    /// stream: 2 long windows and 1 short one of 32 tokens, 15 rows scored in each.
    fn bench() -> Bench {
        let tokens: Vec<u32> = (0..160u32).map(|i| (i * 7919 + 13) % 512).collect();
        let long = windows(tokens.len(), 32, 32, Some(2)).unwrap();
        let short = windows(tokens.len(), 32, 32, Some(1)).unwrap();
        Bench::new(
            "tiny-gqa".into(),
            "a fixed stream".into(),
            tokens,
            long,
            short,
            MatVecVariant::FUSED,
            (16, 4),
        )
    }

    fn fmt(s: &str) -> WeightFormat {
        WeightFormat::parse(s).unwrap()
    }

    #[test]
    fn an_f32_override_adds_no_kl_and_a_real_one_does() {
        let mut b = bench();
        let bar = ProgressBar::hidden();
        for layer in 0..4 {
            let m = b.load(&one_layer(layer, WeightFormat::F32)).unwrap();
            let got = b.measure(&m, Windows::Short, &bar).unwrap();
            assert_eq!(got.kl.kl.mean(), 0.0, "layer {layer}");
            assert_eq!(got.kl.top1_agreement(), 1.0);
            assert_eq!(got.ppl.ppl(), got.ref_ppl);
            assert_eq!(got.ppl.nll.count, 15);
        }
        let m = b.load(&one_layer(1, fmt("sym3g32"))).unwrap();
        let got = b.measure(&m, Windows::Short, &bar).unwrap();
        assert!(got.kl.kl.mean() > 0.0);
        assert!(got.ppl.ppl().is_finite());
    }

    #[test]
    fn a_planted_sensitive_layer_ranks_first() {
        let mut b = bench();
        let bar = ProgressBar::hidden();
        for planted in [0, 2] {
            let kls: Vec<f64> = (0..4)
                .map(|l| {
                    let f = if l == planted { "sym2g32" } else { "sym8g32" };
                    let m = b.load(&one_layer(l, fmt(f))).unwrap();
                    b.measure(&m, Windows::Short, &bar).unwrap().kl.kl.mean()
                })
                .collect();
            assert_eq!(rank_by_kl(&kls)[0], planted, "{kls:?}");
            assert!(kls.iter().all(|&k| k > 0.0), "{kls:?}");
        }
    }

    #[test]
    fn the_mixed_plan_sits_between_uniform_low_and_high() {
        let mut b = bench();
        let bar = ProgressBar::hidden();
        let (low, high) = (fmt("sym4g32"), fmt("sym8g32"));
        let mut measure = |f: &Formats| {
            let m = b.load(f).unwrap();
            let got = b.measure(&m, Windows::Long, &bar).unwrap();
            let tps = b.decode_tokens_per_s(&m).unwrap();
            assert!(tps.is_finite() && tps > 0.0);
            got
        };
        let lo = measure(&Formats::uniform(low));
        let hi = measure(&Formats::uniform(high));
        let (plan, kept) = mixed(&[3, 1, 0, 2], 1, low, high);
        assert_eq!(kept, vec![3]);
        let mid = measure(&plan);
        // One of four equal layers in 8.5 bits, three in 4.5.
        assert!((lo.projection_bits - 4.5).abs() < 1e-9);
        assert!((hi.projection_bits - 8.5).abs() < 1e-9);
        assert!(
            (mid.projection_bits - 5.5).abs() < 1e-9,
            "{}",
            mid.projection_bits
        );
        assert!(lo.weight_bytes < mid.weight_bytes && mid.weight_bytes < hi.weight_bytes);
        assert!(hi.kl.kl.mean() < lo.kl.kl.mean());
        assert_eq!(mid.ppl.nll.count, 30);
        assert!(b.f32_decode().unwrap() > 0.0);
    }
}
