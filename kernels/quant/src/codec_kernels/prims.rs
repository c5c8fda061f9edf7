//! The two operations the codec kernels do not leave to LLVM's vectoriser, one
//! implementation per tier behind `Prims`: the i16 pair dot product (`pmaddwd`: 16 products
//! summed in adjacent pairs into 8 i32 lanes) and the 16-entry byte table lookup of IQ4_NL
//! (`pshufb`). Written as plain loops, LLVM scalarised both in the short, fully unrolled
//! loops of the 32-value blocks (measured: Q5_1's int8 product 7× slower than Q5_0's with
//! the same bytes per block, its products rebuilt one `imul` at a time). Every kernel body
//! stays one source, generic over `P: Prims`: `Avx2` (used by the AVX2 and the AVX-512
//! wrappers, the AVX-512 tier including AVX2; private to `codec_kernels`, whose wrappers run
//! only under a detected tier's token) and `Plain` (the portable tier: SSE2's
//! `pmaddwd`, which every x86-64 has, and a scalar lookup; plain loops elsewhere). The
//! results are exact integers, the same on every tier.

/// Per-tier primitives; `#[inline(always)]` so they compile into each tier's wrapper.
pub trait Prims {
    /// out[l] = w[2l]·x[2l] + w[2l+1]·x[2l+1] (exact: |w|, |x| ≤ 2^15, no pair overflows
    /// i32 unless both are −2^15).
    fn madd(w: &[i16; 16], x: &[i16; 16]) -> [i32; 8];
    /// out[i] = table[idx[i] & 15].
    fn lut(table: &[i8; 16], idx: &[u8; 16]) -> [i8; 16];
}

/// AVX2 (`vpmaddwd` on 16 lanes, `vpshufb`): only inside a wrapper with AVX2 enabled. Its
/// `Prims` methods are safe functions that execute AVX2, so it is private to `codec_kernels`:
/// public, any caller could run them (through `Avx2::madd` or a public body generic over
/// `P: Prims`) on a CPU without AVX2.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx2;

/// The portable tier.
pub struct Plain;

#[cfg(target_arch = "x86_64")]
impl Prims for Avx2 {
    #[inline(always)]
    fn madd(w: &[i16; 16], x: &[i16; 16]) -> [i32; 8] {
        use std::arch::x86_64::*;
        // SAFETY: `Avx2` is only named by the AVX2 and AVX-512 wrappers of `codec_kernels`,
        // whose `#[target_feature]` includes AVX2; the loads read 32 bytes of each array.
        unsafe {
            let a = _mm256_loadu_si256(w.as_ptr() as *const __m256i);
            let b = _mm256_loadu_si256(x.as_ptr() as *const __m256i);
            std::mem::transmute::<__m256i, [i32; 8]>(_mm256_madd_epi16(a, b))
        }
    }

    #[inline(always)]
    fn lut(table: &[i8; 16], idx: &[u8; 16]) -> [i8; 16] {
        use std::arch::x86_64::*;
        // SAFETY: as `madd` (SSSE3 is part of AVX2's tier); 16-byte loads of 16-byte arrays.
        unsafe {
            let t = _mm_loadu_si128(table.as_ptr() as *const __m128i);
            let i = _mm_and_si128(
                _mm_loadu_si128(idx.as_ptr() as *const __m128i),
                _mm_set1_epi8(15),
            );
            std::mem::transmute::<__m128i, [i8; 16]>(_mm_shuffle_epi8(t, i))
        }
    }
}

impl Prims for Plain {
    #[inline(always)]
    fn madd(w: &[i16; 16], x: &[i16; 16]) -> [i32; 8] {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::*;
            // SAFETY: SSE2 is part of every x86-64; 16-byte loads inside the arrays.
            unsafe {
                let lo = _mm_madd_epi16(
                    _mm_loadu_si128(w.as_ptr() as *const __m128i),
                    _mm_loadu_si128(x.as_ptr() as *const __m128i),
                );
                let hi = _mm_madd_epi16(
                    _mm_loadu_si128(w.as_ptr().add(8) as *const __m128i),
                    _mm_loadu_si128(x.as_ptr().add(8) as *const __m128i),
                );
                std::mem::transmute::<[__m128i; 2], [i32; 8]>([lo, hi])
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let mut out = [0i32; 8];
            for (l, o) in out.iter_mut().enumerate() {
                *o = w[2 * l] as i32 * x[2 * l] as i32 + w[2 * l + 1] as i32 * x[2 * l + 1] as i32;
            }
            out
        }
    }

    #[inline(always)]
    fn lut(table: &[i8; 16], idx: &[u8; 16]) -> [i8; 16] {
        let mut out = [0i8; 16];
        for (o, &i) in out.iter_mut().zip(idx) {
            *o = table[(i & 15) as usize];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_agree_with_the_definition() {
        let w: [i16; 16] = std::array::from_fn(|i| (i as i16 * 977 - 7000) * 3);
        let x: [i16; 16] = std::array::from_fn(|i| 127 - 17 * i as i16);
        let want: [i32; 8] = std::array::from_fn(|l| {
            w[2 * l] as i32 * x[2 * l] as i32 + w[2 * l + 1] as i32 * x[2 * l + 1] as i32
        });
        assert_eq!(Plain::madd(&w, &x), want);
        let t: [i8; 16] = std::array::from_fn(|i| (i as i8 - 8) * 9);
        let idx: [u8; 16] = std::array::from_fn(|i| (i * 7 + 16 * (i % 3)) as u8);
        let want: [i8; 16] = std::array::from_fn(|i| t[idx[i] as usize & 15]);
        assert_eq!(Plain::lut(&t, &idx), want);
        #[cfg(target_arch = "x86_64")]
        if kernel_cpu::Isa::Avx2.supported() {
            #[target_feature(enable = "avx2")]
            unsafe fn both(
                w: &[i16; 16],
                x: &[i16; 16],
                t: &[i8; 16],
                i: &[u8; 16],
            ) -> ([i32; 8], [i8; 16]) {
                (Avx2::madd(w, x), Avx2::lut(t, i))
            }
            // SAFETY: the CPU has AVX2 (checked above).
            let (m, l) = unsafe { both(&w, &x, &t, &idx) };
            assert_eq!((m, l), (Plain::madd(&w, &x), want));
        }
    }
}
