//! The one form every ggml block added here decodes through (Q5_0, Q5_1, IQ4_NL and the
//! K-quants Q2_K..Q8_K): its codes as signed bytes with the format's offset or table already
//! applied, per 16-value sub-block j an integer scale sc[j] and minimum mn[j], and the block's
//! two f32 factors d and dmin, so that value v is `a(j)·q[v] + b(j)` with `a(j) = d·sc[j]` and
//! `b(j) = −(dmin·mn[j])` (j = v / 16). This is exactly how llama.cpp's `dequantize_row_*`
//! forms its per-sub-block factors (`d * sc`, `dmin * m`), so the decode is bit-exact with
//! ggml's: x − y and x + (−y) are the same IEEE operation, and a product of one factor pair
//! is commutative. Formats without sub-block scales have sc = 1 (Q5_1's minimum m is
//! dmin = −m with mn = 1). The int8-activation products keep sc and mn integer, as llama.cpp's
//! dot products do; the f32 ones use a and b.

use crate::codec_kernels::prims::{Plain, Prims};
use crate::format::WeightFormat;

/// Values of the largest block (a K-quant super-block).
pub const MAX_VALUES: usize = 256;
/// Sub-blocks of 16 values in the largest block.
pub const MAX_SUBS: usize = MAX_VALUES / 16;

/// A block's codes and per-16 factors; blocks of 32 values use the first 32 codes and 2
/// sub-blocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unpacked {
    pub q: [i8; MAX_VALUES],
    pub sc: [i16; MAX_SUBS],
    pub mn: [i16; MAX_SUBS],
    pub d: f32,
    pub dmin: f32,
}

impl Default for Unpacked {
    fn default() -> Self {
        Unpacked {
            q: [0; MAX_VALUES],
            sc: [1; MAX_SUBS],
            mn: [0; MAX_SUBS],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

impl Unpacked {
    /// The multiplier of sub-block j's codes: d·sc[j].
    #[inline(always)]
    pub fn a(&self, j: usize) -> f32 {
        self.d * self.sc[j] as f32
    }

    /// The addend of sub-block j: −(dmin·mn[j]).
    #[inline(always)]
    pub fn b(&self, j: usize) -> f32 {
        -(self.dmin * self.mn[j] as f32)
    }
}

/// A ggml block format: its encoder (llama.cpp's reference quantiser) and its unpacking.
pub trait Codec {
    /// The format this codec stores.
    const FORMAT: WeightFormat;
    /// Values per block (32 or 256).
    const VALUES: usize = Self::FORMAT.block_values();
    /// Bytes per block.
    const BYTES: usize = Self::FORMAT.block_bytes();
    /// Sub-blocks of 16 per block.
    const SUBS: usize = Self::VALUES / 16;
    /// Whether values carry the additive b (a minimum).
    const HAS_B: bool;

    /// Writes one block of `x` (`VALUES` finite values) into `out` (`BYTES` bytes). `Err(s)`:
    /// a scale `s` that the block's f16 field cannot hold (|s| > 65504 or not finite).
    fn encode(x: &[f32], out: &mut [u8]) -> Result<(), f32>;

    /// Reads the codes and factors of block `b` (`BYTES` bytes; any bytes are accepted).
    /// Written as fixed-length loops over the block's bytes, inlined into each ISA tier's
    /// kernels; `P` gives the tier's table lookup (IQ4_NL).
    fn unpack<P: Prims>(b: &[u8], u: &mut Unpacked);
}

/// Decodes one block of codec `C` into `out` (`C::VALUES` values), bit-exact with ggml.
pub fn decode<C: Codec>(b: &[u8], out: &mut [f32]) {
    let mut u = Unpacked::default();
    C::unpack::<Plain>(b, &mut u);
    for (v, o) in out[..C::VALUES].iter_mut().enumerate() {
        let w = u.a(v / 16) * u.q[v] as f32;
        *o = if C::HAS_B { w + u.b(v / 16) } else { w };
    }
}
