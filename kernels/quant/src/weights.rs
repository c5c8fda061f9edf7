//! Random weight matrices for checks and experiments: Gaussian N(0, 1/cols), or Gaussian
//! with a few outlier input channels (columns scaled up, the pattern LLM.int8() and AWQ
//! describe in real checkpoints), seeded and independent of the thread count.

use kernel_common::{error::Result, inputs::normal_buffer_par, DType, KernelError};

/// How weights are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WeightDist {
    Gaussian,
    /// `channels` columns (evenly spread) multiplied by `scale`.
    Outliers {
        channels: usize,
        scale: f32,
    },
}

impl WeightDist {
    /// `gaussian` or `outliers` (8 channels × 50) or `outliers:N:S`.
    pub fn parse(text: &str) -> Result<WeightDist> {
        let bad = || {
            KernelError::Unsupported(format!(
                "weights '{text}' is not gaussian, outliers or outliers:CHANNELS:SCALE"
            ))
        };
        match text {
            "gaussian" => Ok(WeightDist::Gaussian),
            "outliers" => Ok(WeightDist::Outliers {
                channels: 8,
                scale: 50.0,
            }),
            _ => {
                let mut it = text.split(':');
                if it.next() != Some("outliers") {
                    return Err(bad());
                }
                let channels = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
                let scale: f32 = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
                if it.next().is_some() || !scale.is_finite() {
                    return Err(bad());
                }
                Ok(WeightDist::Outliers { channels, scale })
            }
        }
    }

    /// The name `parse` reads back.
    pub fn name(&self) -> String {
        match self {
            WeightDist::Gaussian => "gaussian".into(),
            WeightDist::Outliers { channels: 8, scale } if *scale == 50.0 => "outliers".into(),
            WeightDist::Outliers { channels, scale } => format!("outliers:{channels}:{scale}"),
        }
    }

    /// A seeded `rows` × `cols` matrix.
    pub fn sample(&self, rows: usize, cols: usize, seed: u64) -> Vec<f32> {
        let mut w = normal_buffer_par(seed, DType::F32, rows * cols).to_f32();
        let sd = 1.0 / (cols as f32).sqrt();
        w.iter_mut().for_each(|v| *v *= sd);
        if let WeightDist::Outliers { channels, scale } = *self {
            let n = channels.min(cols);
            for i in 0..n {
                let c = (2 * i + 1) * cols / (2 * n);
                for r in 0..rows {
                    w[r * cols + c] *= scale;
                }
            }
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_outliers() {
        for n in ["gaussian", "outliers", "outliers:4:20"] {
            assert_eq!(WeightDist::parse(n).unwrap().name(), n);
        }
        assert!(WeightDist::parse("uniform").is_err());
        assert!(WeightDist::parse("outliers:4").is_err());
        let g = WeightDist::Gaussian.sample(4, 64, 1);
        let o = WeightDist::parse("outliers:2:100")
            .unwrap()
            .sample(4, 64, 1);
        assert_eq!(g[0], o[0]);
        assert_eq!(o[16], g[16] * 100.0);
        assert!(g.iter().all(|v| *v != 0.0));
    }
}
