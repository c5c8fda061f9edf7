//! AVX2 + FMA + F16C inner loops of the fused products (the x86-64-v3 tier: most laptops,
//! desktops and cloud VMs), the 8-lane twins of `crate::avx512`: `gemv` (B = 1, f32
//! activations), `tile` (B = 2..4 per pass) and `q8act` (int8 activations, `vpmaddubsw` +
//! `vpmaddwd` as llama.cpp's AVX2 path). They read the same formats (`crate::plan`) and the same
//! permuted activation: a 16-byte chunk of codes is read as two halves of 8 bytes, half h
//! giving lanes 8h..8h+8 of each 16-lane vector k of the AVX-512 order.
//!
//! AVX2 has 16 vector registers (AVX-512: 32), so the loops keep fewer values live: the GEMV
//! widens one row's half-chunk at a time against the activation vectors loaded once for all R
//! rows, and the tile kernel holds 2 rows × 4 activations.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The B = 1 kernel (GEMV), f32 activations.
pub mod gemv;
/// The packed-tile kernel (16-row interleaved tiles, int8 activations).
pub mod packed;
/// The Q4_K and Q5_K packed-tile kernel (Q8_K activations).
pub mod packed_q4k;
/// The Q6_K packed-tile kernel (Q8_K activations).
pub mod packed_q6k;
/// The int8-activation GEMV (llama.cpp's AVX2 path).
pub mod q8act;
/// The B ≤ 4 register-tile kernel (small-batch GEMM) and its dense f32/f16 twin.
pub mod tile;

/// 8 bytes of codes widened to 8 × i32 lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn widen8<const SIGNED: bool>(p: *const u8) -> __m256i {
    let b = _mm_loadl_epi64(p as *const __m128i);
    if SIGNED {
        _mm256_cvtepi8_epi32(b)
    } else {
        _mm256_cvtepu8_epi32(b)
    }
}

/// Codes k of each byte (bits b·k ..) as f32 lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn codes8<const BITS: u32>(wide: __m256i, k: u32) -> __m256 {
    if BITS == 8 {
        return _mm256_cvtepi32_ps(wide);
    }
    let shifted = _mm256_srl_epi32(wide, _mm_cvtsi32_si128((BITS * k) as i32));
    let masked = _mm256_and_si256(shifted, _mm256_set1_epi32((1 << BITS) - 1));
    _mm256_cvtepi32_ps(masked)
}

/// Sum of the 8 lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}
