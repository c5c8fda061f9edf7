//! The portable tier's bodies of the packed tiles (`crate::packed`: Q4_0, Q4_1, Q5_0, Q5_1,
//! IQ4_NL, Q8_0, Q4_K, Q5_K, Q6_K): llama.cpp's integer arithmetic on the same layout as the
//! AVX2 / AVX-512 bodies, with no instruction beyond the baseline ISA, for up to 4 activations
//! a pass. The integer cores (`cores`) give Σc·q per row of one tile-block piece — a 32-value
//! block, a K-quant sub-block, a Q6_K half of 16 + 16 values — for every activation of the pass,
//! exactly: on x86-64 in SSE2 (part of every x86-64; `pmaddwd` over codes widened to i16 once
//! for the pass, so nothing overflows), elsewhere in plain loops (`plain`, which a test holds
//! equal to the SSE2 cores on arbitrary bytes). The bodies then take the format's code offset
//! off with Σq, apply the f32 scales per row (the same steps whatever the pass, so each
//! activation gets the bits it gets alone), and prefetch the next tile-blocks. The scalar
//! per-row loops these replace ran 10–33× slower than the AVX2 bodies; these run 1.1–2.4×
//! (isa_gemv, 4096×4096 and 4096×11008, batch 1, 2 threads). The per-row f32 epilogue widens a
//! tile's 16 f16 scales in one vectorised loop (`f16x16`): per-row conversions took half of
//! Q4_0's time (perf), and in cache Q4_0 went 9.0 → 13.1 GMAC/s, Q4_1 4.6–7.2 → 11.1, Q8_0
//! 8.7 → 12.1, Q6_K 8.5 → 10.7 (`tile_rate`, one thread, AVX-512 machine capped to portable).
//! Passes of 4 (the code widening paid once per pass) with the SSE2 activation quantiser
//! (`act_q8_simd::chunk_sse2`), same tool, 4–8 activations, best of 3 alternated runs: Q4_0
//! 13.2 → 17.9 GMAC/s, Q4_1 11.3 → 16.5, Q5_0 9.7 → 19.5, Q8_0 12.2 → 21.3, Q4_K 15.5 → 17.4,
//! Q6_K 10.6 → 12.8 (one activation: within ±6% of before).

use crate::act_q8::Q8Activation;
use crate::act_q8k::Q8KActivation;
use crate::ggml::fp16_to_fp32;
use crate::packed_layout::{
    code_bytes, scale_bytes, BLOCK, Q4K_MN, Q4K_SC, Q5K_SUB, Q6K_SC, Q6K_SUB, SUPER, TILE,
};
use crate::WeightFormat;

/// How far ahead of the tile-block in use the 32-value formats' codes are prefetched (the
/// K-quants fetch the next super-block, 2–3 KB ahead).
const AHEAD_BYTES: usize = 2048;

#[cfg(not(target_arch = "x86_64"))]
use plain as cores;
/// The integer cores: Σ code·q per row of one tile-block piece, SSE2 on x86-64 (part of
/// every x86-64, as `codec_kernels::prims::Plain` uses it), plain loops elsewhere; a test
/// holds the two equal on arbitrary bytes.
#[cfg(target_arch = "x86_64")]
use sse2 as cores;

/// Plain loops over the layout (the cores of non-x86 CPUs, and the SSE2 cores' oracle).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
mod plain {
    use crate::packed_layout::{Q5_HI, Q6K_HI, TILE};

    /// Unsigned code of row r, k-step s, lane byte b of a Q4_0-style nibble block.
    fn nibble(codes: &[u8], r: usize, s: usize, b: usize) -> i32 {
        let byte = codes[64 * (s / 2) + 4 * r + b];
        (if s.is_multiple_of(2) {
            byte & 0x0F
        } else {
            byte >> 4
        }) as i32
    }

    fn dots(
        steps: std::ops::Range<usize>,
        code: impl Fn(usize, usize, usize) -> i32,
        q: &[i8],
    ) -> [i32; TILE] {
        std::array::from_fn(|r| {
            let mut dot = 0;
            for s in steps.clone() {
                for b in 0..4 {
                    dot += code(r, s, b) * q[4 * s + b] as i32;
                }
            }
            dot
        })
    }

    /// No prefetch hint without the SSE instruction.
    pub fn prefetch(_codes: &[u8], _at: usize, _len: usize) {}

    /// Σ nibble·q per row of a Q4_0-style block (256 bytes), for each activation of `qs`.
    pub fn q4_block<const B: usize>(codes: &[u8], qs: [&[i8]; B]) -> [[i32; TILE]; B] {
        qs.map(|q| dots(0..8, |r, s, b| nibble(codes, r, s, b), q))
    }

    /// Σ (nibble + 16·5th bit)·q per row of a Q5_0 tile-block.
    pub fn q5_block<const B: usize>(codes: &[u8], qs: [&[i8]; B]) -> [[i32; TILE]; B] {
        let code =
            |r, s, b| nibble(codes, r, s, b) + 16 * ((codes[Q5_HI + 4 * r + b] >> s) & 1) as i32;
        qs.map(|q| dots(0..8, code, q))
    }

    /// Σ c·q per row of a Q8_0 tile-block (signed codes, group s = k-step s).
    pub fn q8_block<const B: usize>(codes: &[u8], qs: [&[i8]; B]) -> [[i32; TILE]; B] {
        qs.map(|q| dots(0..8, |r, s, b| codes[64 * s + 4 * r + b] as i8 as i32, q))
    }

    /// Σ (nibble + 16·top 2 bits)·q per row over k-steps 4g..4g + 4 of a Q6_K sub-block.
    pub fn q6_half<const B: usize>(sub: &[u8], qs: [&[i8]; B], g: usize) -> [[i32; TILE]; B] {
        assert!(g < 2);
        let code = |r, s: usize, b| {
            let t = s - 4 * g;
            nibble(sub, r, s, b) + 16 * ((sub[Q6K_HI + 64 * g + 4 * r + b] >> (2 * t)) & 3) as i32
        };
        qs.map(|q| dots(4 * g..4 * g + 4, code, q))
    }
}

/// The cores in SSE2: one 16-byte load holds 4 rows × 4 lane bytes; the codes are widened to
/// i16 once and `pmaddwd` against each activation's k-step (its 4 bytes, repeated, widened
/// once per call) gives each row's pair sums in i32, so nothing can overflow; the pairs are
/// added at the end. One group of 4 rows at a time, so B activations hold 2·B accumulators
/// (8 at B = 4) beside the 4 widened code vectors: the 16 xmm registers take a pass of 4 with
/// the code unpacking paid once per pass instead of once per activation.
#[cfg(target_arch = "x86_64")]
mod sse2 {
    use crate::packed_layout::{Q5_HI, Q6K_HI, TILE};
    use std::arch::x86_64::*;

    /// Asks for the cache lines of `codes[at..at + len]` (`prefetcht0`; addresses past the end
    /// are only hinted, never read). The 16-row tiles stream several KB per row group, and
    /// these cores keep too few loads in flight for the hardware prefetcher alone: without the
    /// hint a 4096×4096 Q4_K GEMV streamed 4.3 GB/s, half the in-cache rate.
    #[inline(always)]
    pub fn prefetch(codes: &[u8], at: usize, len: usize) {
        let base = codes.as_ptr();
        for off in (at..at + len).step_by(64) {
            // SAFETY: a prefetch is a hint: it never faults and reads nothing into the program.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(off) as *const i8) };
        }
    }

    /// Every activation's k-steps `first..first + S` as 8 i16 each (q[4s..4s + 4] twice),
    /// entry [b][s − first].
    #[inline(always)]
    unsafe fn steps<const B: usize, const S: usize>(
        qs: [&[i8; 32]; B],
        first: usize,
    ) -> [[__m128i; S]; B] {
        assert!(first + S <= 8);
        std::array::from_fn(|b| {
            std::array::from_fn(|t| {
                let at = qs[b].as_ptr().add(4 * (first + t)) as *const i32;
                let x = _mm_set1_epi32(std::ptr::read_unaligned(at));
                _mm_srai_epi16::<8>(_mm_unpacklo_epi8(x, x))
            })
        })
    }

    /// 16 bytes at `at`.
    ///
    /// # Safety
    /// `at + 16 <= N` (every caller's offsets are constants within its array).
    #[inline(always)]
    unsafe fn load<const N: usize>(bytes: &[u8; N], at: usize) -> __m128i {
        debug_assert!(at + 16 <= N);
        _mm_loadu_si128(bytes.as_ptr().add(at) as *const __m128i)
    }

    /// The first N bytes of `b` and the first 32 activation codes of each of `qs`, as arrays
    /// (one bounds check each).
    #[inline(always)]
    fn arrays<'a, const N: usize, const B: usize>(
        b: &'a [u8],
        qs: [&'a [i8]; B],
    ) -> (&'a [u8; N], [&'a [i8; 32]; B]) {
        (
            b[..N].try_into().expect("a tile-block piece"),
            std::array::from_fn(|b| qs[b][..32].try_into().expect("32 activation codes")),
        )
    }

    /// Rows 4i..4i + 4 of every activation's pair sums `acc[b]` (rows 4i, 4i + 1 in the
    /// first vector, 4i + 2, 4i + 3 in the second) added into `out[b]`.
    #[inline(always)]
    unsafe fn reduce_quad<const B: usize>(
        acc: &[[__m128i; 2]; B],
        i: usize,
        out: &mut [[i32; TILE]; B],
    ) {
        for b in 0..B {
            let (x, y) = (_mm_castsi128_ps(acc[b][0]), _mm_castsi128_ps(acc[b][1]));
            let even = _mm_castps_si128(_mm_shuffle_ps::<0x88>(x, y));
            let odd = _mm_castps_si128(_mm_shuffle_ps::<0xDD>(x, y));
            _mm_storeu_si128(
                out[b].as_mut_ptr().add(4 * i) as *mut __m128i,
                _mm_add_epi32(even, odd),
            );
        }
    }

    /// Bit `from` of every byte of `v` moved to bit 4 (`width` bits, then masked).
    #[inline(always)]
    unsafe fn bits_to_4(v: __m128i, from: i32, mask: i8) -> __m128i {
        let moved = if from <= 4 {
            _mm_sll_epi16(v, _mm_cvtsi32_si128(4 - from))
        } else {
            _mm_srl_epi16(v, _mm_cvtsi32_si128(from - 4))
        };
        _mm_and_si128(moved, _mm_set1_epi8(mask))
    }

    /// The S / 2 nibble groups from `first_group` of `codes` (group first_group + n holding
    /// k-steps first_step + 2n, low nibbles, and first_step + 2n + 1, high), with
    /// `upper(n, i, hi)` ORed into the codes of rows 4i..4i + 4, against every activation of
    /// `qs`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // b indexes the accumulators and steps in step
    unsafe fn nibbles<const N: usize, const B: usize, const S: usize>(
        codes: &[u8; N],
        qs: [&[i8; 32]; B],
        first_group: usize,
        first_step: usize,
        upper: impl Fn(usize, usize, bool) -> __m128i,
    ) -> [[i32; TILE]; B] {
        let q = steps::<B, S>(qs, first_step);
        let (m, z) = (_mm_set1_epi8(0x0F), _mm_setzero_si128());
        let mut out = [[0i32; TILE]; B];
        for i in 0..4 {
            let mut acc = [[z; 2]; B];
            for n in 0..S / 2 {
                let v = load(codes, 64 * (first_group + n) + 16 * i);
                let lo = _mm_or_si128(_mm_and_si128(v, m), upper(n, i, false));
                let hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16::<4>(v), m), upper(n, i, true));
                let (lo_l, lo_h) = (_mm_unpacklo_epi8(lo, z), _mm_unpackhi_epi8(lo, z));
                let (hi_l, hi_h) = (_mm_unpacklo_epi8(hi, z), _mm_unpackhi_epi8(hi, z));
                for b in 0..B {
                    let (ql, qh) = (q[b][2 * n], q[b][2 * n + 1]);
                    let l = _mm_add_epi32(_mm_madd_epi16(lo_l, ql), _mm_madd_epi16(hi_l, qh));
                    let h = _mm_add_epi32(_mm_madd_epi16(lo_h, ql), _mm_madd_epi16(hi_h, qh));
                    acc[b][0] = _mm_add_epi32(acc[b][0], l);
                    acc[b][1] = _mm_add_epi32(acc[b][1], h);
                }
            }
            reduce_quad(&acc, i, &mut out);
        }
        out
    }

    #[inline(always)]
    pub fn q4_block<const B: usize>(codes: &[u8], qs: [&[i8]; B]) -> [[i32; TILE]; B] {
        let (codes, qs) = arrays::<256, B>(codes, qs);
        // SAFETY: SSE2 is part of every x86-64; every load lies inside the arrays.
        unsafe { nibbles::<256, B, 8>(codes, qs, 0, 0, |_, _, _| _mm_setzero_si128()) }
    }

    #[inline(always)]
    pub fn q5_block<const B: usize>(codes: &[u8], qs: [&[i8]; B]) -> [[i32; TILE]; B] {
        let (codes, qs) = arrays::<{ Q5_HI + 64 }, B>(codes, qs);
        // SAFETY: as `q4_block`. Group n holds k-steps 2n (low) and 2n + 1 (high).
        unsafe {
            let plane: [__m128i; 4] = std::array::from_fn(|i| load(codes, Q5_HI + 16 * i));
            nibbles::<{ Q5_HI + 64 }, B, 8>(codes, qs, 0, 0, |n, i, hi| {
                bits_to_4(plane[i], (2 * n + hi as usize) as i32, 0x10)
            })
        }
    }

    #[inline(always)]
    pub fn q6_half<const B: usize>(sub: &[u8], qs: [&[i8]; B], g: usize) -> [[i32; TILE]; B] {
        assert!(g < 2);
        let (sub, qs) = arrays::<{ Q6K_HI + 128 }, B>(sub, qs);
        // SAFETY: as `q4_block`. Nibble group 2g + n holds k-steps 4g + 2n, 4g + 2n + 1, whose
        // top bits are bits 2t..2t + 2 (t = 2n, 2n + 1) of plane group g.
        unsafe {
            let plane: [__m128i; 4] = std::array::from_fn(|i| load(sub, Q6K_HI + 64 * g + 16 * i));
            nibbles::<{ Q6K_HI + 128 }, B, 4>(sub, qs, 2 * g, 4 * g, |n, i, hi| {
                bits_to_4(plane[i], 2 * (2 * n + hi as usize) as i32, 0x30)
            })
        }
    }

    #[allow(clippy::needless_range_loop)] // b indexes the accumulators and steps in step
    #[inline(always)]
    pub fn q8_block<const B: usize>(codes: &[u8], qs: [&[i8]; B]) -> [[i32; TILE]; B] {
        let (codes, qs) = arrays::<512, B>(codes, qs);
        // SAFETY: as `q4_block`; the codes are sign-extended bytes.
        unsafe {
            let q = steps::<B, 8>(qs, 0);
            let z = _mm_setzero_si128();
            let mut out = [[0i32; TILE]; B];
            for i in 0..4 {
                let mut acc = [[z; 2]; B];
                for s in 0..8 {
                    let v = load(codes, 64 * s + 16 * i);
                    let l = _mm_srai_epi16::<8>(_mm_unpacklo_epi8(v, v));
                    let h = _mm_srai_epi16::<8>(_mm_unpackhi_epi8(v, v));
                    for b in 0..B {
                        acc[b][0] = _mm_add_epi32(acc[b][0], _mm_madd_epi16(l, q[b][s]));
                        acc[b][1] = _mm_add_epi32(acc[b][1], _mm_madd_epi16(h, q[b][s]));
                    }
                }
                reduce_quad(&acc, i, &mut out);
            }
            out
        }
    }
}

/// out[b][r] += row r of the tile whose tile-blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL or Q8_0)
/// are `codes` / `scales` · activation b of `acts`, over the tile-blocks `blocks`: the sums
/// run on from `out`, so a tile taken in pieces gives the bits of one walk, and each
/// activation's sums are the bits it gets alone (the integer dots are exact; the f32 steps per
/// row are the same whatever B is).
pub(crate) fn tile_dot_q8<const B: usize>(
    format: WeightFormat,
    codes: &[u8],
    scales: &[u8],
    blocks: std::ops::Range<usize>,
    acts: [&Q8Activation; B],
    out: &mut [[f32; TILE]; B],
) {
    let (cb, sb) = (code_bytes(format), scale_bytes(format));
    for k in blocks {
        cores::prefetch(codes, (k + AHEAD_BYTES / cb) * cb, cb);
        let (tb, sc) = (&codes[k * cb..(k + 1) * cb], &scales[k * sb..(k + 1) * sb]);
        let qs: [&[i8]; B] = std::array::from_fn(|b| &acts[b].q[k * BLOCK..(k + 1) * BLOCK]);
        let (dots, offset) = match format {
            WeightFormat::Q8_0 => (cores::q8_block(tb, qs), 0),
            WeightFormat::Q4_0 => (cores::q4_block(tb, qs), 8),
            WeightFormat::Q5_0 => (cores::q5_block(tb, qs), 16),
            WeightFormat::Q5_1 => (cores::q5_block(tb, qs), 0),
            WeightFormat::IQ4_NL => (cores::q8_block(&iq4_values(tb), qs), 0),
            _ => (cores::q4_block(tb, qs), 0),
        };
        // The 16 rows' scales widened in one loop over a fixed array and the sums updated in
        // another, each element as before (so every result is the same bits): both loops
        // vectorise, where the per-row f16 conversions did not.
        let d = f16x16(&sc[..2 * TILE]);
        let with_min = matches!(format, WeightFormat::Q4_1 | WeightFormat::Q5_1);
        let m = with_min.then(|| f16x16(&sc[2 * TILE..4 * TILE]));
        for b in 0..B {
            let (acc, dots) = (&mut out[b], &dots[b]);
            let (dx, off) = (acts[b].d[k], offset * acts[b].qsum[k]);
            for r in 0..TILE {
                acc[r] += d[r] * dx * (dots[r] - off) as f32;
            }
            if let Some(m) = &m {
                let sx = acts[b].sum[k];
                for r in 0..TILE {
                    acc[r] += m[r] * sx;
                }
            }
        }
    }
}

/// An IQ4_NL tile-block's table values (`kvalues_iq4nl[nibble]`, as i8 bytes) in Q8_0's
/// tile-block layout: Q4_0-style group j's low nibbles are k-step 2j, its high ones 2j + 1.
/// Looked up once per pass (baseline x86-64 has no byte shuffle) and multiplied as Q8_0's
/// codes.
fn iq4_values(codes: &[u8]) -> [u8; 512] {
    let codes: &[u8; 256] = codes[..256].try_into().expect("an IQ4_NL tile-block");
    let table = crate::iq4nl::KVALUES.map(|v| v as u8);
    let mut out = [0u8; 512];
    for j in 0..4 {
        for i in 0..64 {
            let byte = codes[64 * j + i];
            out[128 * j + i] = table[(byte & 0x0F) as usize];
            out[128 * j + 64 + i] = table[(byte >> 4) as usize];
        }
    }
    out
}

/// The 16 little-endian f16 values of `b` (32 bytes) as f32, by `fp16_to_fp32` (branch-free,
/// so the loop vectorises).
#[inline(always)]
fn f16x16(b: &[u8]) -> [f32; TILE] {
    let b: &[u8; 2 * TILE] = b.try_into().expect("16 f16 scales");
    // SAFETY: `b` is exactly 32 bytes, the size of [u16; 16], read unaligned.
    let words: [u16; TILE] = unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) };
    let mut out = [0.0f32; TILE];
    for (o, w) in out.iter_mut().zip(words) {
        *o = fp16_to_fp32(u16::from_le(w));
    }
    out
}

/// Walks the super-blocks `blocks` of one K-quant tile: prefetches the next one and hands
/// `body` super-block k's codes, scales and index with the tile's sums for every activation.
fn for_each_super<const B: usize>(
    format: WeightFormat,
    codes: &[u8],
    scales: &[u8],
    blocks: std::ops::Range<usize>,
    out: &mut [[f32; TILE]; B],
    mut body: impl FnMut(&[u8], &[u8], usize, &mut [[f32; TILE]; B]),
) {
    let (cb, sb) = (code_bytes(format), scale_bytes(format));
    for k in blocks {
        cores::prefetch(codes, (k + 1) * cb, cb);
        let (codes, sc) = (&codes[k * cb..(k + 1) * cb], &scales[k * sb..(k + 1) * sb]);
        body(codes, sc, k, out);
    }
}

/// out[b] += the 16 rows of a Q4_K tile (Q5_K with `FIVE`: each sub-block a Q5_0-style
/// sub-tile) · Q8_K activation b of `acts` over the super-blocks `blocks` (the sums run on
/// from `out`, each activation's the bits it gets alone).
pub(crate) fn tile_dot_q4k<const FIVE: bool, const B: usize>(
    codes: &[u8],
    scales: &[u8],
    blocks: std::ops::Range<usize>,
    acts: [&Q8KActivation; B],
    out: &mut [[f32; TILE]; B],
) {
    let format = if FIVE {
        WeightFormat::Q5_K
    } else {
        WeightFormat::Q4_K
    };
    for_each_super(format, codes, scales, blocks, out, |codes, sc, k, out| {
        let (mut isum, mut imin) = ([[0i32; TILE]; B], [[0i32; TILE]; B]);
        for j in 0..8 {
            let at = k * SUPER + BLOCK * j;
            let qs: [&[i8]; B] = std::array::from_fn(|b| &acts[b].q[at..at + BLOCK]);
            let dots = if FIVE {
                cores::q5_block(&codes[Q5K_SUB * j..], qs)
            } else {
                cores::q4_block(&codes[256 * j..], qs)
            };
            for b in 0..B {
                let bsum = acts[b].bsum[8 * k + j] as i32;
                for r in 0..TILE {
                    isum[b][r] += sc[Q4K_SC + TILE * j + r] as i32 * dots[b][r];
                    imin[b][r] += sc[Q4K_MN + TILE * j + r] as i32 * bsum;
                }
            }
        }
        let (d, m) = (f16x16(&sc[..32]), f16x16(&sc[32..64]));
        for b in 0..B {
            let dx = acts[b].d[k];
            for r in 0..TILE {
                out[b][r] += d[r] * dx * isum[b][r] as f32;
                out[b][r] -= m[r] * dx * imin[b][r] as f32;
            }
        }
    })
}

/// out[b] += the 16 rows of a Q6_K tile · Q8_K activation b of `acts` over the super-blocks
/// `blocks` (as `tile_dot_q4k`).
pub(crate) fn tile_dot_q6k<const B: usize>(
    codes: &[u8],
    scales: &[u8],
    blocks: std::ops::Range<usize>,
    acts: [&Q8KActivation; B],
    out: &mut [[f32; TILE]; B],
) {
    for_each_super(
        WeightFormat::Q6_K,
        codes,
        scales,
        blocks,
        out,
        |codes, sc, k, out| {
            let (mut isum, mut ioff) = ([[0i32; TILE]; B], [[0i32; TILE]; B]);
            for j in 0..8 {
                let sub = &codes[Q6K_SUB * j..Q6K_SUB * (j + 1)];
                let at = k * SUPER + BLOCK * j;
                let qs: [&[i8]; B] = std::array::from_fn(|b| &acts[b].q[at..at + BLOCK]);
                // Half g: k-steps 4g..4g + 4 (one scale), nibble groups 2g and 2g + 1, plane group g.
                for g in 0..2 {
                    let dots = cores::q6_half(sub, qs, g);
                    let group = 2 * j + g;
                    for b in 0..B {
                        let bsum = acts[b].bsum16[16 * k + group] as i32;
                        for r in 0..TILE {
                            let s = sc[Q6K_SC + TILE * group + r] as i8 as i32;
                            isum[b][r] += s * dots[b][r];
                            ioff[b][r] += s * bsum;
                        }
                    }
                }
            }
            let d = f16x16(&sc[..32]);
            for b in 0..B {
                for r in 0..TILE {
                    out[b][r] += d[r] * acts[b].d[k] * (isum[b][r] - 32 * ioff[b][r]) as f32;
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_scales_widen_as_one_at_a_time_for_every_f16() {
        // Every f16 bit pattern once (normals, subnormals, ±0, ±inf, NaNs).
        for base in (0..=u16::MAX as u32).step_by(TILE) {
            let bytes: Vec<u8> = (0..TILE as u32)
                .flat_map(|r| ((base + r) as u16).to_le_bytes())
                .collect();
            let wide = f16x16(&bytes);
            for (r, w) in wide.iter().enumerate() {
                let h = u16::from_le_bytes([bytes[2 * r], bytes[2 * r + 1]]);
                assert_eq!(w.to_bits(), fp16_to_fp32(h).to_bits(), "f16 {h:#06x}");
            }
        }
    }

    /// xorshift bytes: arbitrary codes, every bit pattern of the planes.
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    #[test]
    fn the_cores_equal_the_plain_loops_on_arbitrary_bytes() {
        fn check<const B: usize>(codes: &[u8], qs: [&[i8]; B]) {
            assert_eq!(cores::q4_block(codes, qs), plain::q4_block(codes, qs));
            assert_eq!(cores::q5_block(codes, qs), plain::q5_block(codes, qs));
            assert_eq!(cores::q8_block(codes, qs), plain::q8_block(codes, qs));
            for g in 0..2 {
                assert_eq!(cores::q6_half(codes, qs, g), plain::q6_half(codes, qs, g));
            }
        }
        for seed in 1..100u64 {
            let codes = bytes(512, seed);
            // Four activations, each its own arbitrary codes (−127..127, as quantised).
            let q: Vec<i8> = bytes(128, seed + 1000)
                .into_iter()
                .map(|b| (b as i8).max(-127))
                .collect();
            let act = |b: usize| &q[32 * b..32 * (b + 1)];
            check(&codes, [act(0)]);
            check(&codes, [act(1), act(2)]);
            check(&codes, [act(3), act(0), act(2)]);
            check(&codes, [act(0), act(1), act(2), act(3)]);
        }
    }
}
