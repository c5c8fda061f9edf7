//! What the in-register kernels of every ISA need to know about a weight format (`BlockPlan`:
//! block sizes, code width, offset, packing), how they read a block header (`Affine`: scale,
//! minimum or zero point, f16 converted in registers by F16C), and the `dispatch!` macro that
//! monomorphises a kernel per header kind and code width.
//!
//! Codes of b ∈ {2, 4, 8} bits are read 16 bytes (one chunk) at a time: vector k of a chunk
//! holds lane j = the code in bits b·k.. of byte j (AVX-512: 16 lanes; AVX2: two halves of 8).
//! Which value that is depends on the packing (ggml's Q4 halves: value k·16 + j; our LSB-first
//! streams: value n·j + k), so the activation is permuted once per call into the same order
//! instead of shuffling weights (`BlockPlan::permute_activation`).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::format::{ScaleType, WeightFormat};

/// How a block header gives (a, b) with w = a·(c − offset) + b for code c.
#[derive(Debug, Clone, Copy)]
pub enum Header {
    /// a = scale, b = 0.
    Scale(ScaleType),
    /// Q4_1: a = f16 d, b = f16 m.
    ScaleMin,
    /// Asymmetric: a = scale, b = −a·zero, zero the byte after the scale.
    ScaleZero(ScaleType),
}

/// What the in-register kernels need to know about a format.
#[derive(Debug, Clone, Copy)]
pub struct BlockPlan {
    pub values: usize,
    pub bytes: usize,
    pub header_bytes: usize,
    pub header: Header,
    /// Code bits: 2, 4 or 8.
    pub bits: u32,
    /// Code offset: 8 for Q4_0 and symmetric int4, 2 / 128 for symmetric int2 / int8, else 0.
    pub offset: f32,
    /// 8-bit codes are two's complement (Q8_0) rather than unsigned.
    pub signed8: bool,
    /// Codes packed LSB-first (value n·j + k in bits b·k of byte j) rather than ggml's halves.
    pub interleaved: bool,
}

impl BlockPlan {
    /// The plan for `format`, when its blocks suit these kernels (blocks of whole 16-byte
    /// chunks: groups a multiple of 64 / 32 / 16 values for 2 / 4 / 8 bits).
    pub fn for_format(format: WeightFormat) -> Option<BlockPlan> {
        let base = |header, bits: u32, offset: f32, signed8, interleaved| BlockPlan {
            values: format.block_values(),
            bytes: format.block_bytes(),
            header_bytes: format.header_bytes(),
            header,
            bits,
            offset,
            signed8,
            interleaved,
        };
        let f16 = ScaleType::F16;
        match format {
            WeightFormat::Q4_0 => Some(base(Header::Scale(f16), 4, 8.0, false, false)),
            WeightFormat::Q4_1 => Some(base(Header::ScaleMin, 4, 0.0, false, false)),
            WeightFormat::Q8_0 => Some(base(Header::Scale(f16), 8, 0.0, true, false)),
            WeightFormat::Sym { bits, group, scale }
                if matches!(bits, 2 | 4 | 8) && group % (128 / bits as usize) == 0 =>
            {
                let offset = (1u32 << (bits - 1)) as f32;
                Some(base(Header::Scale(scale), bits as u32, offset, false, true))
            }
            WeightFormat::Asym { bits, group, scale }
                if matches!(bits, 2 | 4 | 8) && group % (128 / bits as usize) == 0 =>
            {
                Some(base(
                    Header::ScaleZero(scale),
                    bits as u32,
                    0.0,
                    false,
                    true,
                ))
            }
            _ => None,
        }
    }

    /// Values per 16-byte chunk of codes.
    pub fn chunk_values(&self) -> usize {
        128 / self.bits as usize
    }

    /// `x` in the order the kernels meet codes: per chunk, vector k lane j.
    pub fn permute_activation(&self, x: &[f32]) -> Vec<f32> {
        if !self.interleaved {
            return x.to_vec();
        }
        let per_byte = 8 / self.bits as usize;
        let cv = self.chunk_values();
        x.chunks(cv)
            .flat_map(|c| (0..cv).map(move |i| c[interleaved_source(i, per_byte)]))
            .collect()
    }
}

/// For LSB-first codes with `per_byte` codes per byte: the value of a chunk that kernel
/// position i (vector i / 16, lane i mod 16) meets.
#[inline(always)]
pub(crate) const fn interleaved_source(i: usize, per_byte: usize) -> usize {
    (i % 16) * per_byte + i / 16
}

/// Reads (a, b) of a block header inside the kernels (F16C conversion in registers).
#[cfg(target_arch = "x86_64")]
pub(crate) trait Affine {
    /// Whether b can be non-zero (Q4_1's min, an asymmetric zero point).
    const HAS_B: bool;
    /// # Safety
    /// `p` points at a block header of this kind; F16C is available.
    unsafe fn affine(p: *const u8) -> (f32, f32);
    /// The block's zero point as a code (asymmetric formats), else 0.
    ///
    /// # Safety
    /// As `affine`.
    #[inline(always)]
    unsafe fn zero(_p: *const u8) -> i32 {
        0
    }
    /// (a, b) of R ≤ 8 rows' block headers as the lanes of two vectors (lanes ≥ R are 0).
    /// The f16 formats gather the rows' 16-bit scales in general-purpose registers and convert
    /// them with one `vcvtph2ps`: reading them one by one (`vpinsrw` per row, then shuffles to
    /// combine) kept the shuffle port busy longer than the dot products themselves.
    ///
    /// # Safety
    /// As `affine`, for every pointer; F16C and AVX are available.
    #[inline(always)]
    unsafe fn affine8<const R: usize>(p: [*const u8; R]) -> (__m256, __m256) {
        let mut a = [0.0f32; 8];
        let mut b = [0.0f32; 8];
        for r in 0..R {
            (a[r], b[r]) = Self::affine(p[r]);
        }
        (_mm256_loadu_ps(a.as_ptr()), _mm256_loadu_ps(b.as_ptr()))
    }
}

/// The 16-bit values at `p[r] + at` for R ≤ 8 rows, converted from f16 as the lanes of one
/// vector (lanes ≥ R are 0).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn f16_lanes<const R: usize>(p: [*const u8; R], at: usize) -> __m256 {
    let mut packed = [0u64; 2];
    for r in 0..R {
        let bits = (p[r].add(at) as *const u16).read_unaligned() as u64;
        packed[r / 4] |= bits << (16 * (r % 4));
    }
    let v = _mm_set_epi64x(packed[1] as i64, packed[0] as i64);
    _mm256_cvtph_ps(v)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scale_at<const F32: bool>(p: *const u8) -> f32 {
    if F32 {
        (p as *const f32).read_unaligned()
    } else {
        let bits = (p as *const u16).read_unaligned() as i32;
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) struct ScaleOnly<const F32: bool>;
#[cfg(target_arch = "x86_64")]
impl<const F32: bool> Affine for ScaleOnly<F32> {
    const HAS_B: bool = false;
    #[inline(always)]
    unsafe fn affine(p: *const u8) -> (f32, f32) {
        (scale_at::<F32>(p), 0.0)
    }
    #[inline(always)]
    unsafe fn affine8<const R: usize>(p: [*const u8; R]) -> (__m256, __m256) {
        if F32 {
            let mut a = [0.0f32; 8];
            for r in 0..R {
                a[r] = scale_at::<true>(p[r]);
            }
            return (_mm256_loadu_ps(a.as_ptr()), _mm256_setzero_ps());
        }
        (f16_lanes(p, 0), _mm256_setzero_ps())
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) struct ScaleMinF16;
#[cfg(target_arch = "x86_64")]
impl Affine for ScaleMinF16 {
    const HAS_B: bool = true;
    #[inline(always)]
    unsafe fn affine(p: *const u8) -> (f32, f32) {
        (scale_at::<false>(p), scale_at::<false>(p.add(2)))
    }
    #[inline(always)]
    unsafe fn affine8<const R: usize>(p: [*const u8; R]) -> (__m256, __m256) {
        (f16_lanes(p, 0), f16_lanes(p, 2))
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) struct ScaleZeroByte<const F32: bool>;
#[cfg(target_arch = "x86_64")]
impl<const F32: bool> Affine for ScaleZeroByte<F32> {
    const HAS_B: bool = true;
    #[inline(always)]
    unsafe fn affine(p: *const u8) -> (f32, f32) {
        let a = scale_at::<F32>(p);
        (a, -a * *p.add(if F32 { 4 } else { 2 }) as f32)
    }
    #[inline(always)]
    unsafe fn zero(p: *const u8) -> i32 {
        *p.add(if F32 { 4 } else { 2 }) as i32
    }
}

/// Calls `$call::<H, BITS, SIGNED, extra generics...>(args)` for a plan's header kind and code
/// width, so each combination is one monomorphised loop with nothing decided per block.
macro_rules! dispatch {
    ($plan:expr, $call:ident, [$($g:tt),*], $($arg:expr),*) => {{
        use crate::plan::{ScaleMinF16, ScaleOnly, ScaleZeroByte, Header};
        use crate::format::ScaleType;
        macro_rules! bits {
            ($h:ty) => {
                match ($plan.bits, $plan.signed8) {
                    (2, _) => $call::<$h, 2, false, $($g),*>($($arg),*),
                    (4, _) => $call::<$h, 4, false, $($g),*>($($arg),*),
                    (_, true) => $call::<$h, 8, true, $($g),*>($($arg),*),
                    _ => $call::<$h, 8, false, $($g),*>($($arg),*),
                }
            };
        }
        match $plan.header {
            Header::Scale(ScaleType::F16) => bits!(ScaleOnly<false>),
            Header::Scale(ScaleType::F32) => bits!(ScaleOnly<true>),
            Header::ScaleMin => bits!(ScaleMinF16),
            Header::ScaleZero(ScaleType::F16) => bits!(ScaleZeroByte<false>),
            Header::ScaleZero(ScaleType::F32) => bits!(ScaleZeroByte<true>),
        }
    }};
}
pub(crate) use dispatch;
