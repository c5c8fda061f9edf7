//! Weight storage formats and their byte layouts: dense f32/f16/bf16, symmetric and asymmetric
//! group quantisation with 2..=8-bit codes (the scheme of claim C16 and of AWQ/GPTQ), and the
//! ggml blocks that GGUF checkpoints store, as `ggml-common.h` lays them out (llama.cpp): the
//! 32-value blocks Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and the 256-value K-quant super-blocks
//! Q2_K..Q6_K and Q8_K. The ggml type ids and names are in `ggml_types`.
//!
//! Every format stores a matrix row by row, each row a sequence of equal blocks:
//!
//! | format | values/block | block bytes (in order) |
//! |---|---|---|
//! | `f32` / `f16` / `bf16` | 1 | 4 / 2 / 2 (little-endian) |
//! | `sym{b}g{g}[s32]` | g | scale (f16, or f32 with `s32`) + ⌈g·b/8⌉ code bytes |
//! | `asym{b}g{g}[s32]` | g | scale + 1 zero-point byte + ⌈g·b/8⌉ code bytes |
//! | `q8_0` | 32 | f16 d + 32 × i8 = 34 |
//! | `q4_0` | 32 | f16 d + 16 nibble bytes = 18 |
//! | `q4_1` | 32 | f16 d + f16 m + 16 nibble bytes = 20 |
//! | `q5_0` | 32 | f16 d + 4 bytes of 5th bits + 16 nibble bytes = 22 |
//! | `q5_1` | 32 | f16 d + f16 m + 4 + 16 = 24 |
//! | `iq4_nl` | 32 | f16 d + 16 nibble bytes (indices into `kvalues_iq4nl`) = 18 |
//! | `q2_k` | 256 | 16 scale/min nibble bytes + 64 code bytes + f16 d + f16 dmin = 84 |
//! | `q3_k` | 256 | 32 high-bit bytes + 64 code bytes + 12 bytes of 6-bit scales + f16 d = 110 |
//! | `q4_k` | 256 | f16 d + f16 dmin + 12 bytes of 6-bit scales and mins + 128 nibble bytes = 144 |
//! | `q5_k` | 256 | f16 d + f16 dmin + 12 + 32 high-bit bytes + 128 nibble bytes = 176 |
//! | `q6_k` | 256 | 128 low-nibble bytes + 64 high-2-bit bytes + 16 × i8 scales + f16 d = 210 |
//! | `q8_k` | 256 | f32 d + 256 × i8 + 16 × i16 sums of 16 = 292 |
//!
//! A block is its codes (`code_bytes`, contiguous from `codes_at`) and its scale fields
//! (`header_bytes`: the rest). Only the formats whose scales all come first
//! (`header_first`) have their codes at `header_bytes`; the K-quants put some or all of their
//! scales after the codes, so nothing may read their codes at `header_bytes`.
//!
//! Codes of `sym`/`asym` are unsigned b-bit integers packed LSB-first as one bit stream per
//! group (value i occupies bits i·b .. i·b+b of the group's code bytes, byte 0 bit 0 first):
//! for b = 4 this is the tight nibble packing, value 2j in the low nibble of byte j and value
//! 2j+1 in the high nibble; for b = 8 one byte per value. A symmetric code c stands for
//! q = c − 2^(b−1); an asymmetric one for q = c − zero.

use kernel_common::{error::Result, KernelError};
use std::fmt;

/// Storage type of a group's scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleType {
    F16,
    F32,
}

impl ScaleType {
    /// Bytes of one stored scale.
    pub const fn bytes(self) -> usize {
        match self {
            ScaleType::F16 => 2,
            ScaleType::F32 => 4,
        }
    }
}

/// How a weight matrix is stored. The ggml variants carry ggml's own type names (`Q4_K`,
/// `IQ4_NL`), hence the lint allowance.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Dense f32 (the baseline).
    F32,
    /// Dense IEEE half (the f16-weight baseline).
    F16,
    /// Dense bfloat16 (the top 16 bits of an f32; stored round-to-nearest-even as ggml's
    /// `GGML_FP32_TO_BF16`).
    BF16,
    /// Symmetric: scale = max|x| / (2^(b−1) − 1), q = clamp(round(x / scale), −2^(b−1), 2^(b−1) − 1).
    Sym {
        bits: u8,
        group: usize,
        scale: ScaleType,
    },
    /// Asymmetric: scale = (max − min) / (2^b − 1) over a range widened to include 0,
    /// zero = round(−min / scale), c = clamp(round(x / scale) + zero, 0, 2^b − 1).
    Asym {
        bits: u8,
        group: usize,
        scale: ScaleType,
    },
    /// ggml Q8_0.
    Q8_0,
    /// ggml Q4_0.
    Q4_0,
    /// ggml Q4_1.
    Q4_1,
    /// ggml Q5_0: (c − 16)·d, 5-bit codes.
    Q5_0,
    /// ggml Q5_1: c·d + m, 5-bit codes.
    Q5_1,
    /// ggml IQ4_NL: d · kvalues_iq4nl[c], 4-bit indices into a non-linear table.
    IQ4_NL,
    /// ggml Q2_K: 16 sub-blocks of 16, d·s·c − dmin·m with 4-bit s and m, 2-bit codes.
    Q2_K,
    /// ggml Q3_K: 16 sub-blocks of 16, d·(s − 32)·(c − 4) with 6-bit s, 3-bit codes.
    Q3_K,
    /// ggml Q4_K: 8 sub-blocks of 32, d·s·c − dmin·m with 6-bit s and m, 4-bit codes.
    Q4_K,
    /// ggml Q5_K: as Q4_K with 5-bit codes.
    Q5_K,
    /// ggml Q6_K: 16 sub-blocks of 16, d·s·(c − 32) with i8 s, 6-bit codes.
    Q6_K,
    /// ggml Q8_K: f32 d · i8 code (the K-quants' activation type, also storable).
    Q8_K,
}

/// Values per ggml 32-value block.
pub const GGML_BLOCK: usize = 32;
/// Values per K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;

/// The fixed-name formats, as `parse` and `Display` spell them.
const NAMED: [(&str, WeightFormat); 15] = [
    ("f32", WeightFormat::F32),
    ("f16", WeightFormat::F16),
    ("bf16", WeightFormat::BF16),
    ("q8_0", WeightFormat::Q8_0),
    ("q4_0", WeightFormat::Q4_0),
    ("q4_1", WeightFormat::Q4_1),
    ("q5_0", WeightFormat::Q5_0),
    ("q5_1", WeightFormat::Q5_1),
    ("iq4_nl", WeightFormat::IQ4_NL),
    ("q2_k", WeightFormat::Q2_K),
    ("q3_k", WeightFormat::Q3_K),
    ("q4_k", WeightFormat::Q4_K),
    ("q5_k", WeightFormat::Q5_K),
    ("q6_k", WeightFormat::Q6_K),
    ("q8_k", WeightFormat::Q8_K),
];

impl WeightFormat {
    /// Parses `f32`, `f16`, `bf16`, the ggml names (`q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`,
    /// `iq4_nl`, `q2_k`, `q3_k`, `q4_k`, `q5_k`, `q6_k`, `q8_k`), `sym4g32`, `asym3g128`,
    /// `sym8g64s32`.
    pub fn parse(text: &str) -> Result<WeightFormat> {
        let bad = || {
            let names: Vec<&str> = NAMED.iter().map(|(n, _)| *n).collect();
            KernelError::Unsupported(format!(
                "weight format '{text}' is not one of {}, sym<bits>g<group>[s32] or asym<bits>g<group>[s32] (e.g. sym4g32)",
                names.join(", ")
            ))
        };
        if let Some((_, f)) = NAMED.iter().find(|(n, _)| *n == text) {
            return Ok(*f);
        }
        let (asym, rest) = if let Some(r) = text.strip_prefix("asym") {
            (true, r)
        } else if let Some(r) = text.strip_prefix("sym") {
            (false, r)
        } else {
            return Err(bad());
        };
        let (rest, scale) = match rest.strip_suffix("s32") {
            Some(r) => (r, ScaleType::F32),
            None => (rest, ScaleType::F16),
        };
        let (bits, group) = rest.split_once('g').ok_or_else(bad)?;
        let bits: u8 = bits.parse().map_err(|_| bad())?;
        let group: usize = group.parse().map_err(|_| bad())?;
        let f = if asym {
            WeightFormat::Asym { bits, group, scale }
        } else {
            WeightFormat::Sym { bits, group, scale }
        };
        f.validate_params()?;
        Ok(f)
    }

    fn validate_params(self) -> Result<()> {
        if let WeightFormat::Sym { bits, group, .. } | WeightFormat::Asym { bits, group, .. } = self
        {
            if !(2..=8).contains(&bits) {
                return Err(KernelError::Unsupported(format!(
                    "{self}: bits must be in 2..=8, got {bits}"
                )));
            }
            if group == 0 {
                return Err(KernelError::Unsupported(format!(
                    "{self}: group size must be at least 1"
                )));
            }
        }
        Ok(())
    }

    /// Checks the format's parameters and that it can store rows of `cols` values.
    pub fn validate(self, cols: usize) -> Result<()> {
        self.validate_params()?;
        let block = self.block_values();
        if cols == 0 || !cols.is_multiple_of(block) {
            return Err(KernelError::InvalidShape(format!(
                "{self}: row length {cols} is not a positive multiple of the block/group size {block}"
            )));
        }
        Ok(())
    }

    /// Code bits per value (16/32 for the dense formats; the K-quants' scales not counted).
    pub const fn bits(self) -> u8 {
        match self {
            WeightFormat::F32 => 32,
            WeightFormat::F16 | WeightFormat::BF16 => 16,
            WeightFormat::Sym { bits, .. } | WeightFormat::Asym { bits, .. } => bits,
            WeightFormat::Q8_0 | WeightFormat::Q8_K => 8,
            WeightFormat::Q6_K => 6,
            WeightFormat::Q5_0 | WeightFormat::Q5_1 | WeightFormat::Q5_K => 5,
            WeightFormat::Q4_0 | WeightFormat::Q4_1 | WeightFormat::IQ4_NL | WeightFormat::Q4_K => {
                4
            }
            WeightFormat::Q3_K => 3,
            WeightFormat::Q2_K => 2,
        }
    }

    /// Values per block (the quantisation group; a super-block for the K-quants).
    pub const fn block_values(self) -> usize {
        match self {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => 1,
            WeightFormat::Sym { group, .. } | WeightFormat::Asym { group, .. } => group,
            WeightFormat::Q8_0
            | WeightFormat::Q4_0
            | WeightFormat::Q4_1
            | WeightFormat::Q5_0
            | WeightFormat::Q5_1
            | WeightFormat::IQ4_NL => GGML_BLOCK,
            WeightFormat::Q2_K
            | WeightFormat::Q3_K
            | WeightFormat::Q4_K
            | WeightFormat::Q5_K
            | WeightFormat::Q6_K
            | WeightFormat::Q8_K => QK_K,
        }
    }

    /// Bytes of the codes of one block (Q5's 5th bits, the K-quants' high-bit planes
    /// included); they are contiguous, from `codes_at`.
    pub const fn code_bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::F16 | WeightFormat::BF16 => 2,
            WeightFormat::Sym { bits, group, .. } | WeightFormat::Asym { bits, group, .. } => {
                (group * bits as usize).div_ceil(8)
            }
            WeightFormat::Q8_0 => 32,
            WeightFormat::Q4_0 | WeightFormat::Q4_1 | WeightFormat::IQ4_NL => 16,
            WeightFormat::Q5_0 | WeightFormat::Q5_1 => 4 + 16,
            WeightFormat::Q2_K => 64,
            WeightFormat::Q3_K => 32 + 64,
            WeightFormat::Q4_K => 128,
            WeightFormat::Q5_K => 32 + 128,
            WeightFormat::Q6_K => 128 + 64,
            WeightFormat::Q8_K => 256,
        }
    }

    /// Bytes of a block that are not codes: scales, minimums, zero points (and Q8_K's sums),
    /// wherever they sit in the block — before the codes only when `header_first`.
    pub const fn header_bytes(self) -> usize {
        match self {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => 0,
            WeightFormat::Sym { scale, .. } => scale.bytes(),
            WeightFormat::Asym { scale, .. } => scale.bytes() + 1,
            WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q5_0 | WeightFormat::IQ4_NL => {
                2
            }
            WeightFormat::Q4_1 | WeightFormat::Q5_1 => 4,
            // 16 scale/min bytes first, f16 d and dmin after the codes.
            WeightFormat::Q2_K => 16 + 4,
            // 12 scale bytes and f16 d after the codes.
            WeightFormat::Q3_K => 12 + 2,
            WeightFormat::Q4_K | WeightFormat::Q5_K => 4 + 12,
            // 16 i8 scales and f16 d after the codes.
            WeightFormat::Q6_K => 16 + 2,
            // f32 d first, 16 i16 sums after the codes.
            WeightFormat::Q8_K => 4 + 32,
        }
    }

    /// Whether every non-code byte of a block precedes its codes, so the codes start at
    /// `header_bytes` (every format but Q2_K, Q3_K, Q6_K and Q8_K).
    pub const fn header_first(self) -> bool {
        !matches!(
            self,
            WeightFormat::Q2_K | WeightFormat::Q3_K | WeightFormat::Q6_K | WeightFormat::Q8_K
        )
    }

    /// Offset of the codes within a block.
    pub const fn codes_at(self) -> usize {
        match self {
            WeightFormat::Q3_K | WeightFormat::Q6_K => 0,
            WeightFormat::Q2_K => 16,
            WeightFormat::Q8_K => 4,
            f => f.header_bytes(),
        }
    }

    /// Bytes of one block.
    pub const fn block_bytes(self) -> usize {
        self.header_bytes() + self.code_bytes()
    }

    /// Stored bits per weight, scales and zero points included (Q4_0: 4.5, Q8_0: 8.5).
    pub fn bits_per_weight(self) -> f64 {
        self.block_bytes() as f64 * 8.0 / self.block_values() as f64
    }

    /// Bytes of a row of `cols` values.
    pub const fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_values() * self.block_bytes()
    }

    /// Bytes of a `rows` × `cols` matrix, or `None` when that overflows `usize` (sizes read
    /// from a file are not trusted).
    pub fn matrix_bytes(self, rows: usize, cols: usize) -> Option<usize> {
        (cols / self.block_values())
            .checked_mul(self.block_bytes())?
            .checked_mul(rows)
    }

    /// Whether the format is quantised (not a dense float).
    pub const fn is_quantised(self) -> bool {
        !matches!(
            self,
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16
        )
    }

    /// Whether this is one of the ggml block formats (the 32-value blocks and the K-quants).
    pub const fn is_ggml(self) -> bool {
        self.is_quantised() && !matches!(self, WeightFormat::Sym { .. } | WeightFormat::Asym { .. })
    }

    /// Whether this is a K-quant (256-value super-blocks of sub-blocks, `ggml-quants.c`'s
    /// "2-6 bit quantization in super-blocks", and Q8_K).
    pub const fn is_k_quant(self) -> bool {
        self.block_values() == QK_K && self.is_ggml()
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WeightFormat::Sym { bits, group, scale }
            | WeightFormat::Asym { bits, group, scale } => {
                let kind = if matches!(self, WeightFormat::Sym { .. }) {
                    "sym"
                } else {
                    "asym"
                };
                let s = if scale == ScaleType::F32 { "s32" } else { "" };
                write!(f, "{kind}{bits}g{group}{s}")
            }
            fixed => {
                let (name, _) = NAMED
                    .iter()
                    .find(|(_, g)| *g == fixed)
                    .expect("every fixed format is named");
                f.write_str(name)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes() {
        for name in [
            "f32",
            "f16",
            "bf16",
            "q8_0",
            "q4_0",
            "q4_1",
            "sym4g32",
            "asym3g128",
            "sym8g64s32",
            "sym2g7",
        ] {
            assert_eq!(WeightFormat::parse(name).unwrap().to_string(), name);
        }
        assert_eq!(WeightFormat::Q4_0.bits_per_weight(), 4.5);
        assert_eq!(WeightFormat::Q4_1.bits_per_weight(), 5.0);
        assert_eq!(WeightFormat::Q8_0.bits_per_weight(), 8.5);
        assert_eq!(
            WeightFormat::parse("sym4g32").unwrap().bits_per_weight(),
            4.5
        );
        assert_eq!(
            WeightFormat::parse("asym4g128").unwrap().block_bytes(),
            2 + 1 + 64
        );
        assert_eq!(WeightFormat::parse("sym3g32").unwrap().code_bytes(), 12);
        assert_eq!(WeightFormat::parse("sym3g7").unwrap().code_bytes(), 3);
    }

    #[test]
    fn bad_formats_are_errors() {
        for bad in [
            "int4", "sym1g32", "sym9g32", "asym4g0", "sym4", "symxg32", "q7_k", "iq2_xxs", "Q4_K",
        ] {
            assert!(WeightFormat::parse(bad).is_err(), "{bad}");
        }
        let f = WeightFormat::parse("sym4g64").unwrap();
        assert!(f.validate(128).is_ok());
        assert!(f.validate(96).unwrap_err().to_string().contains("multiple"));
        assert!(WeightFormat::Q4_0.validate(48).is_err());
        let e = WeightFormat::Q4_K.validate(576).unwrap_err().to_string();
        assert!(e.contains("576") && e.contains("256"), "{e}");
        assert!(WeightFormat::Q4_K.validate(1536).is_ok());
    }

    #[test]
    fn ggml_block_sizes_are_ggml_commons() {
        // (name, values per block, bytes per block) as ggml-common.h's static_asserts.
        for (name, values, bytes) in [
            ("bf16", 1, 2),
            ("q5_0", 32, 22),
            ("q5_1", 32, 24),
            ("iq4_nl", 32, 18),
            ("q2_k", 256, 84),
            ("q3_k", 256, 110),
            ("q4_k", 256, 144),
            ("q5_k", 256, 176),
            ("q6_k", 256, 210),
            ("q8_k", 256, 292),
        ] {
            let f = WeightFormat::parse(name).unwrap();
            assert_eq!(f.to_string(), name);
            assert_eq!(
                (f.block_values(), f.block_bytes()),
                (values, bytes),
                "{name}"
            );
            assert!(f.codes_at() + f.code_bytes() <= f.block_bytes(), "{name}");
            assert_eq!(f.header_first(), f.codes_at() == f.header_bytes(), "{name}");
            assert_eq!(f.is_ggml(), name != "bf16", "{name}");
            assert_eq!(f.is_k_quant(), values == 256, "{name}");
            assert_eq!(f.row_bytes(1536), 1536 / values * bytes);
        }
        assert_eq!(WeightFormat::Q4_K.bits_per_weight(), 4.5);
        assert_eq!(WeightFormat::Q6_K.bits_per_weight(), 6.5625);
        assert_eq!(WeightFormat::Q2_K.bits_per_weight(), 2.625);
        assert_eq!(WeightFormat::Q3_K.bits_per_weight(), 3.4375);
        assert_eq!(WeightFormat::Q5_K.bits_per_weight(), 5.5);
        assert!(!WeightFormat::parse("sym4g32").unwrap().is_ggml());
        assert_eq!(WeightFormat::Q6_K.matrix_bytes(usize::MAX, 256), None);
    }
}
