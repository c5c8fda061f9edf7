//! Model shapes: the published configurations of Llama-2-7B/13B/70B and Mixtral-8x7B (from
//! their Hugging Face config.json files) and SmolLM2-135M, for calculators such as the KV-cache
//! one, plus the same numbers read from a loaded GGUF. Shape-only: no weights.

/// The shape of a decoder-only transformer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelShape {
    pub name: &'static str,
    pub layers: usize,
    pub d_model: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub d_ff: usize,
    pub vocab: usize,
    /// 1 for a dense FFN.
    pub experts: usize,
    pub top_k: usize,
}

/// The presets, by name.
pub const PRESETS: &[ModelShape] = &[
    ModelShape {
        name: "llama-2-7b",
        layers: 32,
        d_model: 4096,
        q_heads: 32,
        kv_heads: 32,
        head_dim: 128,
        d_ff: 11008,
        vocab: 32000,
        experts: 1,
        top_k: 1,
    },
    ModelShape {
        name: "llama-2-13b",
        layers: 40,
        d_model: 5120,
        q_heads: 40,
        kv_heads: 40,
        head_dim: 128,
        d_ff: 13824,
        vocab: 32000,
        experts: 1,
        top_k: 1,
    },
    ModelShape {
        name: "llama-2-70b",
        layers: 80,
        d_model: 8192,
        q_heads: 64,
        kv_heads: 8,
        head_dim: 128,
        d_ff: 28672,
        vocab: 32000,
        experts: 1,
        top_k: 1,
    },
    ModelShape {
        name: "mixtral-8x7b",
        layers: 32,
        d_model: 4096,
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        d_ff: 14336,
        vocab: 32000,
        experts: 8,
        top_k: 2,
    },
    ModelShape {
        name: "smollm2-135m",
        layers: 30,
        d_model: 576,
        q_heads: 9,
        kv_heads: 3,
        head_dim: 64,
        d_ff: 1536,
        vocab: 49152,
        experts: 1,
        top_k: 1,
    },
];

/// The preset called `name`.
pub fn preset(name: &str) -> Option<ModelShape> {
    PRESETS.iter().copied().find(|p| p.name == name)
}

impl ModelShape {
    /// Bytes of K and V for one token: 2 × layers × kv_heads × head_dim × bytes per element.
    pub fn kv_bytes_per_token(&self, bytes_per_element: f64) -> f64 {
        2.0 * (self.layers * self.kv_heads * self.head_dim) as f64 * bytes_per_element
    }

    /// Parameters of the weights (embeddings, attention, FFN or experts, norms; untied head).
    pub fn params(&self) -> u64 {
        let (d, l) = (self.d_model as u64, self.layers as u64);
        let attn = d * (self.q_heads * self.head_dim) as u64 * 2
            + d * (self.kv_heads * self.head_dim) as u64 * 2;
        let ffn = 3 * d * self.d_ff as u64 * self.experts as u64
            + if self.experts > 1 {
                d * self.experts as u64
            } else {
                0
            };
        2 * self.vocab as u64 * d + l * (attn + ffn + 2 * d) + d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_sizes() {
        // Parameter counts within 1% of the published 6.74B, 13.0B, 69.0B, 46.7B.
        for (name, billions) in [
            ("llama-2-7b", 6.74),
            ("llama-2-13b", 13.02),
            ("llama-2-70b", 68.98),
            ("mixtral-8x7b", 46.70),
        ] {
            let p = preset(name).unwrap().params() as f64 / 1e9;
            assert!((p / billions - 1.0).abs() < 0.01, "{name}: {p}");
        }
        // 2 × 32 × 32 × 128 × 2 bytes = 512 KiB per token for Llama-2-7B in f16.
        assert_eq!(
            preset("llama-2-7b").unwrap().kv_bytes_per_token(2.0),
            524_288.0
        );
        assert!(preset("gpt-5").is_none());
    }
}
