//! Weight storage formats and their byte layouts: dense f32/f16, symmetric and asymmetric
//! group quantisation with 2..=8-bit codes (the scheme of claim C16 and of AWQ/GPTQ), and the
//! ggml blocks Q8_0, Q4_0 and Q4_1 that GGUF checkpoints store (llama.cpp `ggml-quants.c`).
//!
//! Every format stores a matrix row by row, each row a sequence of equal blocks:
//!
//! | format | values/block | block bytes |
//! |---|---|---|
//! | `f32` / `f16` | 1 | 4 / 2 (little-endian) |
//! | `sym{b}g{g}[s32]` | g | scale (f16, or f32 with `s32`) + ⌈g·b/8⌉ code bytes |
//! | `asym{b}g{g}[s32]` | g | scale + 1 zero-point byte + ⌈g·b/8⌉ code bytes |
//! | `q8_0` | 32 | f16 d + 32 × i8 = 34 |
//! | `q4_0` | 32 | f16 d + 16 nibble bytes = 18 |
//! | `q4_1` | 32 | f16 d + f16 m + 16 nibble bytes = 20 |
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

/// How a weight matrix is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Dense f32 (the baseline).
    F32,
    /// Dense IEEE half (the f16-weight baseline).
    F16,
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
}

/// Values per ggml block.
pub const GGML_BLOCK: usize = 32;

impl WeightFormat {
    /// Parses `f32`, `f16`, `q8_0`, `q4_0`, `q4_1`, `sym4g32`, `asym3g128`, `sym8g64s32`.
    pub fn parse(text: &str) -> Result<WeightFormat> {
        let bad = || {
            KernelError::Unsupported(format!(
                "weight format '{text}' is not f32, f16, q8_0, q4_0, q4_1, sym<bits>g<group>[s32] or asym<bits>g<group>[s32] (e.g. sym4g32)"
            ))
        };
        let fixed = match text {
            "f32" => Some(WeightFormat::F32),
            "f16" => Some(WeightFormat::F16),
            "q8_0" => Some(WeightFormat::Q8_0),
            "q4_0" => Some(WeightFormat::Q4_0),
            "q4_1" => Some(WeightFormat::Q4_1),
            _ => None,
        };
        if let Some(f) = fixed {
            return Ok(f);
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

    /// Code bits per value (16/32 for the dense formats).
    pub const fn bits(self) -> u8 {
        match self {
            WeightFormat::F32 => 32,
            WeightFormat::F16 => 16,
            WeightFormat::Sym { bits, .. } | WeightFormat::Asym { bits, .. } => bits,
            WeightFormat::Q8_0 => 8,
            WeightFormat::Q4_0 | WeightFormat::Q4_1 => 4,
        }
    }

    /// Values per block (the quantisation group).
    pub const fn block_values(self) -> usize {
        match self {
            WeightFormat::F32 | WeightFormat::F16 => 1,
            WeightFormat::Sym { group, .. } | WeightFormat::Asym { group, .. } => group,
            WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q4_1 => GGML_BLOCK,
        }
    }

    /// Bytes of the packed codes of one block.
    pub const fn code_bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::F16 => 2,
            WeightFormat::Sym { bits, group, .. } | WeightFormat::Asym { bits, group, .. } => {
                (group * bits as usize).div_ceil(8)
            }
            WeightFormat::Q8_0 => 32,
            WeightFormat::Q4_0 | WeightFormat::Q4_1 => 16,
        }
    }

    /// Bytes before the codes in a block (scales, zero point).
    pub const fn header_bytes(self) -> usize {
        match self {
            WeightFormat::F32 | WeightFormat::F16 => 0,
            WeightFormat::Sym { scale, .. } => scale.bytes(),
            WeightFormat::Asym { scale, .. } => scale.bytes() + 1,
            WeightFormat::Q8_0 | WeightFormat::Q4_0 => 2,
            WeightFormat::Q4_1 => 4,
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
        !matches!(self, WeightFormat::F32 | WeightFormat::F16)
    }

    /// Whether this is one of the ggml block formats.
    pub const fn is_ggml(self) -> bool {
        matches!(
            self,
            WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q4_1
        )
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WeightFormat::F32 => f.write_str("f32"),
            WeightFormat::F16 => f.write_str("f16"),
            WeightFormat::Q8_0 => f.write_str("q8_0"),
            WeightFormat::Q4_0 => f.write_str("q4_0"),
            WeightFormat::Q4_1 => f.write_str("q4_1"),
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
            "int4", "sym1g32", "sym9g32", "asym4g0", "sym4", "symxg32", "q5_0",
        ] {
            assert!(WeightFormat::parse(bad).is_err(), "{bad}");
        }
        let f = WeightFormat::parse("sym4g64").unwrap();
        assert!(f.validate(128).is_ok());
        assert!(f.validate(96).unwrap_err().to_string().contains("multiple"));
        assert!(WeightFormat::Q4_0.validate(48).is_err());
    }
}
