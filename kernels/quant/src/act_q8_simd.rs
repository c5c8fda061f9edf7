//! The vector loops of the activation chunk quantiser on AVX-512, AVX2 and SSE2 (llama.cpp's
//! `quantize_row_q8_0` AVX paths: max|x| by `vmaxps`, codes by a convert and a narrowing
//! pack), bit-identical to the scalar definition: the same exact max, the same `chunk_scale`
//! (here, shared with the scalar loop),
//! rounding half away from zero as `f32::round` does (truncate |v|, add 1 where the dropped
//! fraction is ≥ 0.5 — exact, as |v| ≤ 127 leaves the subtraction no rounding — then the sign
//! back). The auto-vectorised loop these replace compiled to scalar `maxss` / `cvttss2si`
//! per value (~1 ns a value: 7% of a SmolLM2 8-token verification step, on the leader thread
//! while the others waited).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The scale of a 32-value chunk whose largest magnitude is `amax`, and its inverse: max|x| / 127
/// (NaN when the chunk holds a NaN or ±Inf, with inverse 0, so every code is 0 and the NaN
/// reaches the output through the scale). A chunk so small that 1 / scale overflows
/// (max|x| < 127 / f32::MAX ≈ 3.7e-37) gets scale 0 and inverse 0, as an all-zero chunk does:
/// an infinite inverse would send every code to the i32 saturation value (-1 as an i8) and
/// overflow the chunk's code sum. Its products are then 0, where the f32 ones are below
/// 3.7e-37 · Σ|w|.
pub(crate) fn chunk_scale(amax: f32, finite: bool) -> (f32, f32) {
    if !finite {
        return (f32::NAN, 0.0);
    }
    let scale = amax / 127.0;
    let inv = 1.0 / scale;
    if scale > 0.0 && inv.is_finite() {
        (scale, inv)
    } else {
        (0.0, 0.0)
    }
}

/// One chunk quantised: its 32 codes, scale and code sum.
pub(crate) struct Chunk {
    pub q: [i8; 32],
    pub scale: f32,
    pub total: i32,
}

/// The codes of a chunk with a NaN or ±Inf (NaN scale, zero codes: `chunk_scale`).
fn non_finite() -> Chunk {
    Chunk {
        q: [0; 32],
        scale: f32::NAN,
        total: 0,
    }
}

/// `v` (32 values) quantised with AVX-512.
///
/// # Safety
/// The CPU must have AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn chunk_avx512(v: &[f32; 32]) -> Chunk {
    let x = [
        _mm512_loadu_ps(v.as_ptr()),
        _mm512_loadu_ps(v.as_ptr().add(16)),
    ];
    let abs = x.map(|x| _mm512_abs_ps(x));
    let big = _mm512_set1_ps(f32::MAX);
    // Ordered ≤ f32::MAX is false for NaN and ±Inf.
    let finite = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(abs[0], big)
        & _mm512_cmp_ps_mask::<_CMP_LE_OQ>(abs[1], big);
    if finite != 0xFFFF {
        return non_finite();
    }
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(abs[0], abs[1]));
    let (scale, inv) = chunk_scale(amax, true);
    let (inv, half, one) = (
        _mm512_set1_ps(inv),
        _mm512_set1_ps(0.5),
        _mm512_set1_ps(1.0),
    );
    let mut q = [0i8; 32];
    let mut total = _mm512_setzero_si512();
    for (h, x) in x.into_iter().enumerate() {
        let s = _mm512_mul_ps(x, inv);
        let a = _mm512_abs_ps(s);
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(a);
        let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_sub_ps(a, t), half);
        let r = _mm512_mask_add_ps(t, up, t, one);
        // The sign of s back on the rounded magnitude (−0.0 converts to 0, as in `round`).
        let sign = _mm512_and_si512(_mm512_castps_si512(s), _mm512_set1_epi32(i32::MIN));
        let r = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign));
        let codes = _mm512_cvttps_epi32(r);
        total = _mm512_add_epi32(total, codes);
        _mm_storeu_si128(
            q.as_mut_ptr().add(16 * h) as *mut __m128i,
            _mm512_cvtepi32_epi8(codes),
        );
    }
    Chunk {
        q,
        scale,
        total: _mm512_reduce_add_epi32(total),
    }
}

/// `v` (32 values) quantised with AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn chunk_avx2(v: &[f32; 32]) -> Chunk {
    let x: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(v.as_ptr().add(8 * i)));
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let abs = x.map(|x| _mm256_and_ps(x, magnitude));
    let big = _mm256_set1_ps(f32::MAX);
    let mut finite = _mm256_set1_ps(f32::from_bits(u32::MAX));
    for a in abs {
        finite = _mm256_and_ps(finite, _mm256_cmp_ps::<_CMP_LE_OQ>(a, big));
    }
    if _mm256_movemask_ps(finite) != 0xFF {
        return non_finite();
    }
    let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    let (scale, inv) = chunk_scale(_mm_cvtss_f32(m), true);
    let (inv, half, one) = (
        _mm256_set1_ps(inv),
        _mm256_set1_ps(0.5),
        _mm256_set1_ps(1.0),
    );
    let sign_bit = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    let codes = x.map(|x| {
        let s = _mm256_mul_ps(x, inv);
        let a = _mm256_and_ps(s, magnitude);
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(a);
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_sub_ps(a, t), half);
        let r = _mm256_add_ps(t, _mm256_and_ps(up, one));
        _mm256_cvttps_epi32(_mm256_or_ps(r, _mm256_and_ps(s, sign_bit)))
    });
    let sum = _mm256_add_epi32(
        _mm256_add_epi32(codes[0], codes[1]),
        _mm256_add_epi32(codes[2], codes[3]),
    );
    let sum = _mm_add_epi32(
        _mm256_castsi256_si128(sum),
        _mm256_extracti128_si256::<1>(sum),
    );
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01_00_11_10>(sum));
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b10_11_00_01>(sum));
    // i32 → i16 → i8 packs work per 128-bit lane; one dword permute puts the bytes in order.
    let w01 = _mm256_packs_epi32(codes[0], codes[1]);
    let w23 = _mm256_packs_epi32(codes[2], codes[3]);
    let b = _mm256_packs_epi16(w01, w23);
    let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let mut q = [0i8; 32];
    _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, b);
    Chunk {
        q,
        scale,
        total: _mm_cvtsi128_si32(sum),
    }
}

/// `v` (32 values) quantised with SSE2 (part of every x86-64; the portable tier's loop, where
/// the scalar one called `roundf` per value: ~20% of a 256-row portable product at batch 4).
/// Truncation is `cvttps2dq` (exact: |v| ≤ 127 here, finite chunks only).
#[cfg(target_arch = "x86_64")]
pub(crate) fn chunk_sse2(v: &[f32; 32]) -> Chunk {
    // SAFETY: SSE2 is part of every x86-64; every load lies inside `v`, the store inside `q`.
    unsafe {
        let x: [__m128; 8] = std::array::from_fn(|i| _mm_loadu_ps(v.as_ptr().add(4 * i)));
        let magnitude = _mm_castsi128_ps(_mm_set1_epi32(i32::MAX));
        let abs: [__m128; 8] = std::array::from_fn(|i| _mm_and_ps(x[i], magnitude));
        let big = _mm_set1_ps(f32::MAX);
        let mut finite = _mm_castsi128_ps(_mm_set1_epi32(-1));
        let mut m = _mm_setzero_ps();
        for a in abs {
            // Ordered ≤: false for a NaN.
            finite = _mm_and_ps(finite, _mm_cmple_ps(a, big));
            m = _mm_max_ps(m, a);
        }
        if _mm_movemask_ps(finite) != 0xF {
            return non_finite();
        }
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m));
        let (scale, inv) = chunk_scale(_mm_cvtss_f32(m), true);
        let (inv, half, one) = (_mm_set1_ps(inv), _mm_set1_ps(0.5), _mm_set1_ps(1.0));
        let sign_bit = _mm_castsi128_ps(_mm_set1_epi32(i32::MIN));
        let codes: [__m128i; 8] = std::array::from_fn(|i| {
            let s = _mm_mul_ps(x[i], inv);
            let a = _mm_and_ps(s, magnitude);
            let t = _mm_cvtepi32_ps(_mm_cvttps_epi32(a));
            let up = _mm_cmpge_ps(_mm_sub_ps(a, t), half);
            let r = _mm_add_ps(t, _mm_and_ps(up, one));
            _mm_cvttps_epi32(_mm_or_ps(r, _mm_and_ps(s, sign_bit)))
        });
        let mut sum = _mm_setzero_si128();
        for c in codes {
            sum = _mm_add_epi32(sum, c);
        }
        let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01_00_11_10>(sum));
        let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b10_11_00_01>(sum));
        let mut q = [0i8; 32];
        for h in 0..2 {
            let w0 = _mm_packs_epi32(codes[4 * h], codes[4 * h + 1]);
            let w1 = _mm_packs_epi32(codes[4 * h + 2], codes[4 * h + 3]);
            let b = _mm_packs_epi16(w0, w1);
            _mm_storeu_si128(q.as_mut_ptr().add(16 * h) as *mut __m128i, b);
        }
        Chunk {
            q,
            scale,
            total: _mm_cvtsi128_si32(sum),
        }
    }
}
