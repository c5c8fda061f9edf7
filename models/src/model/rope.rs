//! Rotary position embeddings (RoFormer, Su et al. 2021) and the context-extension schemes
//! checkpoints ship, computed as transformers' `modeling_rope_utils.py` does (same formulas,
//! the same f32 tensors where it uses them): the default inverse frequencies base^(−2i/d),
//! `linear` (position interpolation, Chen et al. 2023: every frequency / factor), `llama3`
//! (Llama-3.1: low frequencies / factor, high ones kept, a smooth ramp between), `yarn` (Peng et
//! al. 2023: a ramp between interpolated and extrapolated frequencies over the correction range
//! of β_fast..β_slow rotations, cos/sin scaled by 0.1·ln(factor) + 1), Phi-3's `longrope`
//! (per-pair rescale factors, the short set while a pass stays within the original context and
//! the long set beyond it, cos/sin scaled by √(1 + ln(factor)/ln(original))), and llama.cpp's
//! per-pair frequency divisors (`rope_freqs.weight`, how GGUF Llama-3 files carry llama3).
//! A `RopeSpec` is per layer kind: Gemma-3's local layers use their own base and no scaling.

use kernel_common::{error::Result, KernelError};

/// How the frequencies of a rotary embedding are scaled.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Default,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max: f64,
    },
    Yarn {
        factor: f64,
        original_max: f64,
        attention_factor: Option<f64>,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        beta_fast: f64,
        beta_slow: f64,
        truncate: bool,
    },
    LongRope {
        short: Vec<f64>,
        long: Vec<f64>,
        original_max: usize,
        /// Scale of cos and sin (√(1 + ln(factor)/ln(original)) unless the config gives one).
        attention_factor: f64,
    },
    /// Divisors of each pair's frequency (llama.cpp's `rope_freqs` tensor).
    FreqFactors(Vec<f32>),
}

/// One layer kind's rotary embedding: base, rotated dimensions (the first `dim` of each head,
/// pairs split in halves or interleaved as the model's layout says), scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    pub base: f64,
    pub dim: usize,
    pub scaling: RopeScaling,
}

impl RopeSpec {
    /// Unscaled RoPE over all `dim` dimensions.
    pub fn plain(base: f64, dim: usize) -> RopeSpec {
        RopeSpec {
            base,
            dim,
            scaling: RopeScaling::Default,
        }
    }
}

/// The inverse frequencies of a spec, ready for tables.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    /// Rotated dimensions of a head (even).
    pub dim: usize,
    inv_freq: Vec<f32>,
    /// longrope: the long set and the original context past which a pass uses it.
    long: Option<(Vec<f32>, usize)>,
    /// cos and sin are multiplied by this (yarn, longrope).
    attention: f32,
}

/// base^(2i/dim) for i < dim/2, in f32 as `base ** (torch.arange(0, dim, 2).float() / dim)`.
fn powers(base: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| (base as f32).powf((2 * i) as f32 / dim as f32))
        .collect()
}

fn default_inv_freq(base: f64, dim: usize) -> Vec<f32> {
    powers(base, dim).iter().map(|p| 1.0 / p).collect()
}

/// transformers' `_compute_llama3_parameters`.
fn llama3(inv: &[f32], factor: f64, low: f64, high: f64, original: f64) -> Vec<f32> {
    let (factor, low, high, old) = (factor as f32, low as f32, high as f32, original as f32);
    let low_wavelen = old / low;
    let high_wavelen = old / high;
    inv.iter()
        .map(|&f| {
            let wavelen = 2.0 * std::f32::consts::PI / f;
            let scaled = if wavelen > low_wavelen { f / factor } else { f };
            if wavelen < high_wavelen || wavelen > low_wavelen {
                scaled
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 - smooth) * scaled / factor + smooth * scaled
            }
        })
        .collect()
}

/// transformers' `get_mscale` of `_compute_yarn_parameters`.
fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// transformers' `_compute_yarn_parameters`: (inverse frequencies, attention factor).
#[allow(clippy::too_many_arguments)]
fn yarn(
    base: f64,
    dim: usize,
    factor: f64,
    original: f64,
    beta_fast: f64,
    beta_slow: f64,
    truncate: bool,
    attention: Option<f64>,
    mscale: Option<f64>,
    mscale_all_dim: Option<f64>,
) -> (Vec<f32>, f64) {
    let attention = attention.unwrap_or(match (mscale, mscale_all_dim) {
        (Some(m), Some(a)) if m != 0.0 && a != 0.0 => {
            yarn_mscale(factor, m) / yarn_mscale(factor, a)
        }
        _ => yarn_mscale(factor, 1.0),
    });
    let correction = |rotations: f64| {
        (dim as f64 * (original / (rotations * 2.0 * std::f64::consts::PI)).ln())
            / (2.0 * base.ln())
    };
    let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let low = low.max(0.0);
    let mut high = high.min(dim as f64 - 1.0);
    if low == high {
        high += 0.001;
    }
    let pos = powers(base, dim);
    let inv = pos
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let ramp = ((i as f32 - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
            let extrapolation = 1.0 - ramp;
            let interpolated = 1.0 / (factor as f32 * p);
            interpolated * (1.0 - extrapolation) + (1.0 / p) * extrapolation
        })
        .collect();
    (inv, attention)
}

impl Rope {
    /// The frequencies of `spec`; an error names a factor list of the wrong length or a
    /// non-positive value.
    pub fn new(spec: &RopeSpec) -> Result<Rope> {
        let bad = |m: String| KernelError::InvalidShape(format!("rope: {m}"));
        let dim = spec.dim;
        if dim == 0 || !dim.is_multiple_of(2) {
            return Err(bad(format!(
                "{dim} rotary dimensions (must be even and > 0)"
            )));
        }
        if !(spec.base.is_finite() && spec.base > 0.0) {
            return Err(bad(format!("base {} must be a positive number", spec.base)));
        }
        let half = dim / 2;
        let check = |name: &str, v: &[f64]| -> Result<()> {
            if v.len() != half {
                return Err(bad(format!(
                    "{name} has {} values for {half} pairs",
                    v.len()
                )));
            }
            if let Some(x) = v.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
                return Err(bad(format!("{name} holds {x}, not a positive number")));
            }
            Ok(())
        };
        let plain = default_inv_freq(spec.base, dim);
        let positive = |name: &str, v: f64| -> Result<()> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(bad(format!("{name} {v} must be a positive number")))
            }
        };
        let (inv_freq, long, attention) = match &spec.scaling {
            RopeScaling::Default => (plain, None, 1.0),
            RopeScaling::Linear { factor } => {
                positive("factor", *factor)?;
                let f = *factor as f32;
                (plain.iter().map(|v| v / f).collect(), None, 1.0)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max,
            } => {
                for (n, v) in [
                    ("factor", factor),
                    ("low_freq_factor", low_freq_factor),
                    ("high_freq_factor", high_freq_factor),
                    ("original_max_position_embeddings", original_max),
                ] {
                    positive(n, *v)?;
                }
                if low_freq_factor == high_freq_factor {
                    return Err(bad("llama3 low_freq_factor equals high_freq_factor".into()));
                }
                let inv = llama3(
                    &plain,
                    *factor,
                    *low_freq_factor,
                    *high_freq_factor,
                    *original_max,
                );
                (inv, None, 1.0)
            }
            RopeScaling::Yarn {
                factor,
                original_max,
                attention_factor,
                mscale,
                mscale_all_dim,
                beta_fast,
                beta_slow,
                truncate,
            } => {
                positive("factor", *factor)?;
                positive("original_max_position_embeddings", *original_max)?;
                let (inv, a) = yarn(
                    spec.base,
                    dim,
                    *factor,
                    *original_max,
                    *beta_fast,
                    *beta_slow,
                    *truncate,
                    *attention_factor,
                    *mscale,
                    *mscale_all_dim,
                );
                (inv, None, a)
            }
            RopeScaling::LongRope {
                short,
                long,
                original_max,
                attention_factor,
            } => {
                check("short_factor", short)?;
                check("long_factor", long)?;
                let pw = powers(spec.base, dim);
                let by = |ext: &[f64]| -> Vec<f32> {
                    ext.iter()
                        .zip(&pw)
                        .map(|(e, p)| 1.0 / (*e as f32 * p))
                        .collect()
                };
                (
                    by(short),
                    Some((by(long), *original_max)),
                    *attention_factor,
                )
            }
            RopeScaling::FreqFactors(ff) => {
                let as64: Vec<f64> = ff.iter().map(|&v| v as f64).collect();
                check("rope_freqs", &as64)?;
                (
                    plain.iter().zip(ff).map(|(v, f)| v / f).collect(),
                    None,
                    1.0,
                )
            }
        };
        Ok(Rope {
            dim,
            inv_freq,
            long,
            attention: attention as f32,
        })
    }

    /// longrope's original context (a pass longer than it uses the long factors).
    pub fn long_from(&self) -> Option<usize> {
        self.long.as_ref().map(|(_, o)| *o)
    }

    /// cos and sin for `positions` (rows of dim/2), scaled by the attention factor. `extent` is
    /// the largest position + 1 of the pass the positions belong to: longrope rotates the whole
    /// pass with its long factors when it exceeds the original context (transformers'
    /// `longrope_frequency_update`, which decides per forward call).
    pub fn table(&self, positions: &[usize], extent: usize) -> (Vec<f32>, Vec<f32>) {
        let inv = match &self.long {
            Some((long, original)) if extent > *original => long,
            _ => &self.inv_freq,
        };
        let (mut cos, mut sin) = kernel_cpu::ops::rope_table(inv, positions);
        if self.attention != 1.0 {
            cos.iter_mut().for_each(|c| *c *= self.attention);
            sin.iter_mut().for_each(|s| *s *= self.attention);
        }
        (cos, sin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(scaling: RopeScaling) -> RopeSpec {
        RopeSpec {
            base: 10000.0,
            dim: 8,
            scaling,
        }
    }

    #[test]
    fn frequencies_follow_the_published_formulas() {
        let plain = Rope::new(&spec(RopeScaling::Default)).unwrap();
        let want = [1.0, 0.1, 0.01, 0.001];
        for (a, b) in plain.inv_freq.iter().zip(want) {
            assert!((a - b).abs() <= 1e-6 * b, "{a} vs {b}");
        }
        let lin = Rope::new(&spec(RopeScaling::Linear { factor: 4.0 })).unwrap();
        for (a, b) in lin.inv_freq.iter().zip(&plain.inv_freq) {
            assert_eq!(*a, b / 4.0);
        }
        // llama3 with an old context of 64: wavelengths 6.3 (kept, < 16), 63 (smoothed), 628
        // and 6283 (divided by the factor).
        let l3 = Rope::new(&spec(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max: 64.0,
        }))
        .unwrap();
        assert_eq!(l3.inv_freq[0], plain.inv_freq[0]);
        assert_eq!(l3.inv_freq[2], plain.inv_freq[2] / 8.0);
        let wavelen = 2.0 * std::f32::consts::PI / plain.inv_freq[1];
        let s = (64.0 / wavelen - 1.0) / 3.0;
        let mid = (1.0 - s) * plain.inv_freq[1] / 8.0 + s * plain.inv_freq[1];
        assert!((l3.inv_freq[1] - mid).abs() < 1e-9);
        // yarn's attention factor 0.1·ln(4) + 1, and every frequency between the interpolated
        // and the extrapolated one.
        let y = Rope::new(&spec(RopeScaling::Yarn {
            factor: 4.0,
            original_max: 16.0,
            attention_factor: None,
            mscale: None,
            mscale_all_dim: None,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
        }))
        .unwrap();
        assert!((y.attention - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
        for (a, p) in y.inv_freq.iter().zip(&plain.inv_freq) {
            assert!(*a <= *p * 1.000001 && *a >= p / 4.0 * 0.999999, "{a} {p}");
        }
        // longrope: the short set within the original context, the long set beyond it.
        let lr = Rope::new(&spec(RopeScaling::LongRope {
            short: vec![1.0, 2.0, 3.0, 4.0],
            long: vec![2.0, 4.0, 6.0, 8.0],
            original_max: 16,
            attention_factor: 1.5,
        }))
        .unwrap();
        let (c_short, _) = lr.table(&[3], 16);
        let (c_long, _) = lr.table(&[3], 17);
        assert!((c_short[1] - 1.5 * (3.0 * 0.1f32 / 2.0).cos()).abs() < 1e-6);
        assert!((c_long[1] - 1.5 * (3.0 * 0.1f32 / 4.0).cos()).abs() < 1e-6);
    }

    #[test]
    fn bad_specs_are_one_error() {
        let e = Rope::new(&spec(RopeScaling::LongRope {
            short: vec![1.0; 3],
            long: vec![1.0; 4],
            original_max: 16,
            attention_factor: 1.0,
        }))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("short_factor has 3 values for 4 pairs"),
            "{e}"
        );
        let e = Rope::new(&spec(RopeScaling::Linear { factor: 0.0 })).unwrap_err();
        assert!(e.to_string().contains("factor 0"), "{e}");
        let e = Rope::new(&RopeSpec::plain(10000.0, 7)).unwrap_err();
        assert!(e.to_string().contains("7 rotary dimensions"), "{e}");
    }
}
