//! AVX-512 inner loops of the fused products: R weight rows against B activation vectors,
//! decoding codes in registers and never writing dequantised weights anywhere (`gemv` for
//! B = 1, `tile` for B = 2..4 per pass, `q8act` for int8 activations with VNNI). The formats
//! they take and the header readers are in `crate::plan`.
//!
//! 16 bytes of codes → 16 × u32 (`vpmovzxbd`, the one shuffle), then for each of the n = 8/b
//! codes in a byte a shift and a mask (integer ALU) and `vcvtdq2ps`. A first version mapped
//! nibbles to values with two `vpermps` table lookups; on Zen 4, where 512-bit shuffles are
//! double-pumped, shift-and-mask measured no slower and needs no table.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The B = 1 kernel (GEMV).
pub mod gemv;
/// The packed-tile kernel with VNNI (16-row interleaved tiles, int8 activations).
pub mod packed;
/// The Q4_K, Q5_K and Q6_K packed-tile kernels with VNNI (Q8_K activations).
pub mod packed_k;
/// The int8-activation GEMV (llama.cpp's CPU path): integer dot products with VNNI.
pub mod q8act;
/// The B ≤ 4 register-tile kernel (small-batch GEMM) and its dense f32/f16 twin.
pub mod tile;

/// 16 bytes of codes widened to 16 × i32 lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn widen<const SIGNED: bool>(p: *const u8) -> __m512i {
    let b = _mm_loadu_si128(p as *const __m128i);
    if SIGNED {
        _mm512_cvtepi8_epi32(b)
    } else {
        _mm512_cvtepu8_epi32(b)
    }
}

/// Codes k of each byte (bits b·k ..) as f32 lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn codes<const BITS: u32>(wide: __m512i, k: u32) -> __m512 {
    if BITS == 8 {
        return _mm512_cvtepi32_ps(wide);
    }
    let shifted = _mm512_srl_epi32(wide, _mm_cvtsi32_si128((BITS * k) as i32));
    let masked = _mm512_and_si512(shifted, _mm512_set1_epi32((1 << BITS) - 1));
    _mm512_cvtepi32_ps(masked)
}
