//! The portable tier's bodies of the packed tiles (`crate::packed`: Q4_0, Q4_1, Q5_0, Q8_0,
//! Q4_K, Q6_K): llama.cpp's integer arithmetic on the same layout as the AVX2 / AVX-512
//! bodies, with no instruction beyond the baseline ISA. The integer cores (`cores`) give Σc·q
//! per row of one tile-block piece — a 32-value block, a K-quant sub-block, a Q6_K half of
//! 16 + 16 values — exactly: on x86-64 in SSE2 (part of every x86-64; `pmaddwd` over codes
//! widened to i16, so nothing overflows), elsewhere in plain loops (`plain`, which a test holds
//! equal to the SSE2 cores on arbitrary bytes). The bodies then take the format's code offset
//! off with Σq, apply the f32 scales, and prefetch the next tile-blocks. The scalar per-row
//! loops these replace ran 10–33× slower than the AVX2 bodies; these run 1.1–2.4× (isa_gemv,
//! 4096×4096 and 4096×11008, batch 1, 2 threads). The per-row f32 epilogue widens a tile's 16
//! f16 scales in one vectorised loop (`f16x16`): per-row conversions took half of Q4_0's time
//! (perf), and in cache Q4_0 went 9.0 → 13.1 GMAC/s, Q4_1 4.6–7.2 → 11.1, Q8_0 8.7 → 12.1, Q6_K
//! 8.5 → 10.7 (`tile_rate`, one thread, AVX-512 machine capped to portable).

use crate::act_q8::Q8Activation;
use crate::act_q8k::Q8KActivation;
use crate::ggml::fp16_to_fp32;
use crate::packed_layout::{
    code_bytes, scale_bytes, BLOCK, Q4K_MN, Q4K_SC, Q6K_SC, Q6K_SUB, SUPER, TILE,
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

    /// Σ nibble·q per row of a Q4_0-style block (256 bytes).
    pub fn q4_block(codes: &[u8], q: &[i8]) -> [i32; TILE] {
        dots(0..8, |r, s, b| nibble(codes, r, s, b), q)
    }

    /// Σ (nibble + 16·5th bit)·q per row of a Q5_0 tile-block.
    pub fn q5_block(codes: &[u8], q: &[i8]) -> [i32; TILE] {
        let code =
            |r, s, b| nibble(codes, r, s, b) + 16 * ((codes[Q5_HI + 4 * r + b] >> s) & 1) as i32;
        dots(0..8, code, q)
    }

    /// Σ c·q per row of a Q8_0 tile-block (signed codes, group s = k-step s).
    pub fn q8_block(codes: &[u8], q: &[i8]) -> [i32; TILE] {
        dots(0..8, |r, s, b| codes[64 * s + 4 * r + b] as i8 as i32, q)
    }

    /// Σ (nibble + 16·top 2 bits)·q per row over k-steps 4g..4g + 4 of a Q6_K sub-block.
    pub fn q6_half(sub: &[u8], q: &[i8], g: usize) -> [i32; TILE] {
        assert!(g < 2);
        let code = |r, s: usize, b| {
            let t = s - 4 * g;
            nibble(sub, r, s, b) + 16 * ((sub[Q6K_HI + 64 * g + 4 * r + b] >> (2 * t)) & 3) as i32
        };
        dots(4 * g..4 * g + 4, code, q)
    }
}

/// The cores in SSE2: one 16-byte load holds 4 rows × 4 lane bytes; the codes are widened to
/// i16 and `pmaddwd` against the k-step's 4 activation bytes (repeated) gives each row's pair
/// sums in i32, so nothing can overflow; the pairs are added at the end.
#[cfg(target_arch = "x86_64")]
mod sse2 {
    use crate::packed_layout::{Q5_HI, Q6K_HI, TILE};
    use std::arch::x86_64::*;

    /// acc[2i] (rows 4i, 4i + 1) and acc[2i + 1] (rows 4i + 2, 4i + 3): pair sums.
    type Acc = [__m128i; 8];

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

    /// The activation's k-step s as 8 i16: q[4s..4s + 4] twice.
    #[inline(always)]
    unsafe fn step(q: &[i8; 32], s: usize) -> __m128i {
        debug_assert!(s < 8);
        let x = _mm_set1_epi32(std::ptr::read_unaligned(q.as_ptr().add(4 * s) as *const i32));
        _mm_srai_epi16::<8>(_mm_unpacklo_epi8(x, x))
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

    /// The first N bytes of `b` and the first 32 activation codes of `q`, as arrays (one
    /// bounds check each).
    #[inline(always)]
    fn arrays<'a, const N: usize>(b: &'a [u8], q: &'a [i8]) -> (&'a [u8; N], &'a [i8; 32]) {
        (
            b[..N].try_into().expect("a tile-block piece"),
            q[..32].try_into().expect("32 activation codes"),
        )
    }

    /// acc[2i..2i + 2] += unsigned codes `lo` · `ql` + `hi` · `qh` (rows 4i..4i + 4).
    #[inline(always)]
    unsafe fn madd_pair(
        acc: &mut Acc,
        i: usize,
        lo: __m128i,
        hi: __m128i,
        ql: __m128i,
        qh: __m128i,
    ) {
        let z = _mm_setzero_si128();
        let l = _mm_add_epi32(
            _mm_madd_epi16(_mm_unpacklo_epi8(lo, z), ql),
            _mm_madd_epi16(_mm_unpacklo_epi8(hi, z), qh),
        );
        let h = _mm_add_epi32(
            _mm_madd_epi16(_mm_unpackhi_epi8(lo, z), ql),
            _mm_madd_epi16(_mm_unpackhi_epi8(hi, z), qh),
        );
        acc[2 * i] = _mm_add_epi32(acc[2 * i], l);
        acc[2 * i + 1] = _mm_add_epi32(acc[2 * i + 1], h);
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

    #[inline(always)]
    unsafe fn reduce(acc: &Acc) -> [i32; TILE] {
        let mut out = [0i32; TILE];
        for i in 0..4 {
            let (a, b) = (
                _mm_castsi128_ps(acc[2 * i]),
                _mm_castsi128_ps(acc[2 * i + 1]),
            );
            let even = _mm_castps_si128(_mm_shuffle_ps::<0x88>(a, b));
            let odd = _mm_castps_si128(_mm_shuffle_ps::<0xDD>(a, b));
            _mm_storeu_si128(
                out.as_mut_ptr().add(4 * i) as *mut __m128i,
                _mm_add_epi32(even, odd),
            );
        }
        out
    }

    /// Nibble groups `groups` of `codes`, with `upper(group, i, hi)` ORed into the codes.
    #[inline(always)]
    unsafe fn nibbles<const N: usize>(
        codes: &[u8; N],
        q: &[i8; 32],
        groups: std::ops::Range<usize>,
        first_step: usize,
        upper: impl Fn(usize, usize, bool) -> __m128i,
    ) -> [i32; TILE] {
        let mut acc = [_mm_setzero_si128(); 8];
        let m = _mm_set1_epi8(0x0F);
        for (n, j) in groups.enumerate() {
            let s = first_step + 2 * n;
            let (ql, qh) = (step(q, s), step(q, s + 1));
            for i in 0..4 {
                let v = load(codes, 64 * j + 16 * i);
                let lo = _mm_or_si128(_mm_and_si128(v, m), upper(n, i, false));
                let hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16::<4>(v), m), upper(n, i, true));
                madd_pair(&mut acc, i, lo, hi, ql, qh);
            }
        }
        reduce(&acc)
    }

    pub fn q4_block(codes: &[u8], q: &[i8]) -> [i32; TILE] {
        let (codes, q) = arrays::<256>(codes, q);
        // SAFETY: SSE2 is part of every x86-64; every load lies inside the arrays.
        unsafe { nibbles(codes, q, 0..4, 0, |_, _, _| _mm_setzero_si128()) }
    }

    pub fn q5_block(codes: &[u8], q: &[i8]) -> [i32; TILE] {
        let (codes, q) = arrays::<{ Q5_HI + 64 }>(codes, q);
        // SAFETY: as `q4_block`. Group n holds k-steps 2n (low) and 2n + 1 (high).
        unsafe {
            let plane: [__m128i; 4] = std::array::from_fn(|i| load(codes, Q5_HI + 16 * i));
            nibbles(codes, q, 0..4, 0, |n, i, hi| {
                bits_to_4(plane[i], (2 * n + hi as usize) as i32, 0x10)
            })
        }
    }

    pub fn q6_half(sub: &[u8], q: &[i8], g: usize) -> [i32; TILE] {
        assert!(g < 2);
        let (sub, q) = arrays::<{ Q6K_HI + 128 }>(sub, q);
        // SAFETY: as `q4_block`. Nibble group 2g + n holds k-steps 4g + 2n, 4g + 2n + 1, whose
        // top bits are bits 2t..2t + 2 (t = 2n, 2n + 1) of plane group g.
        unsafe {
            let plane: [__m128i; 4] = std::array::from_fn(|i| load(sub, Q6K_HI + 64 * g + 16 * i));
            nibbles(sub, q, 2 * g..2 * g + 2, 4 * g, |n, i, hi| {
                bits_to_4(plane[i], 2 * (2 * n + hi as usize) as i32, 0x30)
            })
        }
    }

    pub fn q8_block(codes: &[u8], q: &[i8]) -> [i32; TILE] {
        let (codes, q) = arrays::<512>(codes, q);
        // SAFETY: as `q4_block`; the codes are sign-extended bytes.
        unsafe {
            let mut acc = [_mm_setzero_si128(); 8];
            for s in 0..8 {
                let qs = step(q, s);
                for i in 0..4 {
                    let v = load(codes, 64 * s + 16 * i);
                    let l = _mm_srai_epi16::<8>(_mm_unpacklo_epi8(v, v));
                    let h = _mm_srai_epi16::<8>(_mm_unpackhi_epi8(v, v));
                    acc[2 * i] = _mm_add_epi32(acc[2 * i], _mm_madd_epi16(l, qs));
                    acc[2 * i + 1] = _mm_add_epi32(acc[2 * i + 1], _mm_madd_epi16(h, qs));
                }
            }
            reduce(&acc)
        }
    }
}

/// The 16 rows of tile-blocks `codes`/`scales` (Q4_0, Q4_1, Q5_0 or Q8_0) against one
/// activation.
pub(crate) fn tile_dot_q8(
    format: WeightFormat,
    codes: &[u8],
    scales: &[u8],
    nb: usize,
    act: &Q8Activation,
) -> [f32; TILE] {
    let (cb, sb) = (code_bytes(format), scale_bytes(format));
    let mut acc = [0.0f32; TILE];
    for k in 0..nb {
        cores::prefetch(codes, (k + AHEAD_BYTES / cb) * cb, cb);
        let (tb, sc) = (&codes[k * cb..(k + 1) * cb], &scales[k * sb..(k + 1) * sb]);
        let q = &act.q[k * BLOCK..(k + 1) * BLOCK];
        let (dots, offset) = match format {
            WeightFormat::Q8_0 => (cores::q8_block(tb, q), 0),
            WeightFormat::Q4_0 => (cores::q4_block(tb, q), 8),
            WeightFormat::Q5_0 => (cores::q5_block(tb, q), 16),
            _ => (cores::q4_block(tb, q), 0),
        };
        let off = offset * act.qsum[k];
        // The 16 rows' scales widened in one loop over a fixed array and the sums updated in
        // another, each element as before (so every result is the same bits): both loops
        // vectorise, where the per-row f16 conversions did not.
        let d = f16x16(&sc[..2 * TILE]);
        for r in 0..TILE {
            acc[r] += d[r] * act.d[k] * (dots[r] - off) as f32;
        }
        if format == WeightFormat::Q4_1 {
            let m = f16x16(&sc[2 * TILE..4 * TILE]);
            for r in 0..TILE {
                acc[r] += m[r] * act.sum[k];
            }
        }
    }
    acc
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
/// `body` super-block k's codes, scales and activation codes with the tile's 16 sums, which
/// start at `sums` (the blocks before these; zero for the first).
fn for_each_super(
    format: WeightFormat,
    codes: &[u8],
    scales: &[u8],
    blocks: std::ops::Range<usize>,
    act: &Q8KActivation,
    sums: [f32; TILE],
    mut body: impl FnMut(&[u8], &[u8], &[i8], usize, &mut [f32; TILE]),
) -> [f32; TILE] {
    let (cb, sb) = (code_bytes(format), scale_bytes(format));
    let mut acc = sums;
    for k in blocks {
        cores::prefetch(codes, (k + 1) * cb, cb);
        let q = &act.q[k * SUPER..(k + 1) * SUPER];
        let (codes, sc) = (&codes[k * cb..(k + 1) * cb], &scales[k * sb..(k + 1) * sb]);
        body(codes, sc, q, k, &mut acc);
    }
    acc
}

/// The 16 rows of a Q4_K tile against one Q8_K activation.
pub(crate) fn tile_dot_q4k(
    codes: &[u8],
    scales: &[u8],
    blocks: std::ops::Range<usize>,
    act: &Q8KActivation,
    sums: [f32; TILE],
) -> [f32; TILE] {
    for_each_super(
        WeightFormat::Q4_K,
        codes,
        scales,
        blocks,
        act,
        sums,
        |codes, sc, q, k, acc| {
            let (mut isum, mut imin) = ([0i32; TILE], [0i32; TILE]);
            for j in 0..8 {
                let dots = cores::q4_block(&codes[256 * j..], &q[BLOCK * j..]);
                let bsum = act.bsum[8 * k + j] as i32;
                for r in 0..TILE {
                    isum[r] += sc[Q4K_SC + TILE * j + r] as i32 * dots[r];
                    imin[r] += sc[Q4K_MN + TILE * j + r] as i32 * bsum;
                }
            }
            let dx = act.d[k];
            let (d, m) = (f16x16(&sc[..32]), f16x16(&sc[32..64]));
            for r in 0..TILE {
                acc[r] += d[r] * dx * isum[r] as f32;
                acc[r] -= m[r] * dx * imin[r] as f32;
            }
        },
    )
}

/// The 16 rows of a Q6_K tile against one Q8_K activation.
pub(crate) fn tile_dot_q6k(
    codes: &[u8],
    scales: &[u8],
    blocks: std::ops::Range<usize>,
    act: &Q8KActivation,
    sums: [f32; TILE],
) -> [f32; TILE] {
    for_each_super(
        WeightFormat::Q6_K,
        codes,
        scales,
        blocks,
        act,
        sums,
        |codes, sc, q, k, acc| {
            let (mut isum, mut ioff) = ([0i32; TILE], [0i32; TILE]);
            for j in 0..8 {
                let sub = &codes[Q6K_SUB * j..Q6K_SUB * (j + 1)];
                let qj = &q[BLOCK * j..BLOCK * (j + 1)];
                // Half g: k-steps 4g..4g + 4 (one scale), nibble groups 2g and 2g + 1, plane group g.
                for g in 0..2 {
                    let dots = cores::q6_half(sub, qj, g);
                    let group = 2 * j + g;
                    let bsum = act.bsum16[16 * k + group] as i32;
                    for r in 0..TILE {
                        let s = sc[Q6K_SC + TILE * group + r] as i8 as i32;
                        isum[r] += s * dots[r];
                        ioff[r] += s * bsum;
                    }
                }
            }
            let d = f16x16(&sc[..32]);
            for r in 0..TILE {
                acc[r] += d[r] * act.d[k] * (isum[r] - 32 * ioff[r]) as f32;
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
        for seed in 1..100u64 {
            let codes = bytes(512, seed);
            let q: Vec<i8> = bytes(32, seed + 1000)
                .into_iter()
                .map(|b| (b as i8).max(-127))
                .collect();
            assert_eq!(cores::q4_block(&codes, &q), plain::q4_block(&codes, &q));
            assert_eq!(cores::q5_block(&codes, &q), plain::q5_block(&codes, &q));
            assert_eq!(cores::q8_block(&codes, &q), plain::q8_block(&codes, &q));
            for g in 0..2 {
                assert_eq!(cores::q6_half(&codes, &q, g), plain::q6_half(&codes, &q, g));
            }
        }
    }
}
