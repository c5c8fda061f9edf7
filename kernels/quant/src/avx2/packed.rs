//! The packed-tile kernel on AVX2 (see `crate::packed` for the layout): a 16-row tile is two
//! halves of 8 rows, one row per 32-bit lane. Per block and half, each k-step's four
//! activation bytes are broadcast (`vpbroadcastd`, a load) and multiplied with the half's codes
//! by `vpmaddubsw`; Q4 steps accumulate in i16 (bounded, see the module doc of `packed`), one
//! `vpmaddwd` by ones widens the 8 sums, one convert and one FMA with the 8 rows' d·d_x apply
//! the scales. Q5_0's codes are the Q4 nibbles with their 5th bit shifted in from its plane
//! and widen every 4 steps (4 · 2 · 31 · 127 = 31496, inside i16). Q8_0's signed codes go
//! through the sign trick (|c| × q with c's sign) and widen every step, since two steps could
//! overflow i16 (each step's codes loaded and made absolute once for the pass's activations).
//! Codes are prefetched 4 KB ahead, as on AVX-512: without it a pass from DRAM waited on
//! memory (single thread, a 65536 × 896 matrix on a Zen 4 EPYC: Q8_0 at batch 1 went from
//! 21–22 to 23–28 GMAC/s with the prefetch and the loop order, at batch 4 from 49–50 to
//! 53–57; Qwen2.5-0.5B Q4_0 decode at batch 2–8, `--isa avx2`, 1.2–1.35× faster).

#[cfg(target_arch = "x86_64")]
use crate::act_group::ActGroup;
#[cfg(target_arch = "x86_64")]
use crate::format::WeightFormat;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
#[cfg(target_arch = "x86_64")]
use std::ops::Range;

/// out[b][r] += Σ over tile-blocks k in `blocks` of row r of the tile whose tile-blocks have
/// their codes at `codes` and their scales at `scales` (`crate::packed`; block 0 there) ·
/// block k of activation b of `acts`. The sum runs on from `out`, so a tile taken in pieces of
/// blocks gives the bits of one pass over all of them.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `codes` and `scales` cover `blocks.end` tile-blocks
/// of `format` (q4_0, q4_1, q5_0, q5_1, iq4_nl or q8_0).
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn tile_dot<const B: usize>(
    format: WeightFormat,
    codes: *const u8,
    scales: *const u8,
    blocks: Range<usize>,
    acts: &ActGroup,
    out: &mut [[f32; 16]; B],
) {
    assert!(acts.covers(B, blocks.end));
    // Passes of up to 8 for Q4, up to 4 for Q5_0, Q5_1, IQ4_NL and Q8_0 (`packed::pass`).
    assert!(B <= 4 || (B <= 8 && matches!(format, WeightFormat::Q4_0 | WeightFormat::Q4_1)));
    match format {
        WeightFormat::Q4_0 => tile_q4::<false, B>(codes, scales, blocks, acts, out),
        WeightFormat::Q4_1 => tile_q4::<true, B>(codes, scales, blocks, acts, out),
        WeightFormat::Q5_0 => tile_q5::<false, B>(codes, scales, blocks, acts, out),
        WeightFormat::Q5_1 => tile_q5::<true, B>(codes, scales, blocks, acts, out),
        WeightFormat::IQ4_NL => tile_q8::<true, B>(codes, scales, blocks, acts, out),
        _ => tile_q8::<false, B>(codes, scales, blocks, acts, out),
    }
}

/// How far ahead of the block in use its codes are prefetched (here and in `avx512::packed`).
const PREFETCH: usize = 4096;

/// Prefetches the `bytes` code bytes PREFETCH bytes after `blk` (both tiers' tile kernels:
/// the hardware streamer alone leaves a pass from DRAM waiting on memory). A prefetch past
/// the tile's end is a hint, never a fault.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch(blk: *const u8, bytes: usize) {
    for line in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH + line) as *const i8);
    }
}

/// Four activation bytes (k-step `s` of group entry `i`: block k of activation b at
/// i = k·B + b) in every 32-bit lane.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn step(acts: &ActGroup, i: usize, s: usize) -> __m256i {
    _mm256_set1_epi32((acts.q.as_ptr().add(32 * i + 4 * s) as *const i32).read_unaligned())
}

/// The Q4 tile, one 8-row half at a time (half outer, blocks inner: B accumulators live, not
/// 2·B). Per block the half's 8 code vectors are unpacked 4 at a time and each unpacked vector
/// serves all B activations before the next is made, so the nibble unpacking is paid once per
/// B activations and the live registers are 4 codes + B i16 sums + B accumulators (≤ 14 of the
/// 16 at B = 4; at B = 8, the pass `packed::pass` gives Q4, the accumulators and some sums go
/// to memory, touched once per block, and the unpacking is paid once per 8). The previous
/// loop order (halves inside blocks, codes re-unpacked per activation) spilled broadcasts to
/// the stack and ran at ~14 int8 MACs per cycle at prefill.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // t / b index register arrays in step with the loads
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q4<const MIN: bool, const B: usize>(
    codes: *const u8,
    scales: *const u8,
    blocks: Range<usize>,
    acts: &ActGroup,
    out: &mut [[f32; 16]; B],
) {
    let sb = if MIN { 64 } else { 32 };
    let mask = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); B];
        for b in 0..B {
            acc[b] = _mm256_loadu_ps(out[b].as_ptr().add(8 * h));
        }
        for k in blocks.clone() {
            let (blk, sc) = (codes.add(k * 256 + 32 * h), scales.add(k * sb));
            if h == 0 {
                prefetch(codes.add(k * 256), 256);
            }
            let mut sum16 = [_mm256_setzero_si256(); B];
            for jj in 0..2 {
                // Code vectors of k-steps 4·jj .. 4·jj + 4: the low and high nibbles of groups
                // 2·jj and 2·jj + 1.
                let mut w = [_mm256_setzero_si256(); 4];
                for t in 0..2 {
                    let bytes = _mm256_loadu_si256(blk.add(64 * (2 * jj + t)) as *const __m256i);
                    w[2 * t] = _mm256_and_si256(bytes, mask);
                    w[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), mask);
                }
                for b in 0..B {
                    for u in 0..4 {
                        let q = step(acts, k * B + b, 4 * jj + u);
                        sum16[b] = _mm256_add_epi16(sum16[b], _mm256_maddubs_epi16(w[u], q));
                    }
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(sc.add(16 * h) as *const __m128i));
            let m = if MIN {
                _mm256_cvtph_ps(_mm_loadu_si128(sc.add(32 + 16 * h) as *const __m128i))
            } else {
                _mm256_setzero_ps()
            };
            for b in 0..B {
                let i = k * B + b;
                let mut dot = _mm256_madd_epi16(sum16[b], ones);
                if !MIN {
                    // Q4_0: Σ(c − 8)·q = Σc·q − 8·Σq.
                    dot = _mm256_add_epi32(dot, _mm256_set1_epi32(*acts.bias.get_unchecked(i)));
                }
                let dx = _mm256_set1_ps(*acts.d.get_unchecked(i));
                acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, dx), acc[b]);
                if MIN {
                    let sx = _mm256_set1_ps(*acts.sum.get_unchecked(i));
                    acc[b] = _mm256_fmadd_ps(m, sx, acc[b]);
                }
            }
        }
        for b in 0..B {
            _mm256_storeu_ps(out[b].as_mut_ptr().add(8 * h), acc[b]);
        }
    }
}

/// The 5th bits of k-step `s` at bit 4 of each lane byte (0x10 or 0), from the half's plane
/// `hv` (bit s of each byte; 16-bit shifts, so a bit from the neighbouring byte can land
/// only below bit 4 or above it, never in it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn fifth_bits(hv: __m256i, s: usize) -> __m256i {
    let at4 = match s {
        0 => _mm256_slli_epi16::<4>(hv),
        1 => _mm256_slli_epi16::<3>(hv),
        2 => _mm256_slli_epi16::<2>(hv),
        3 => _mm256_slli_epi16::<1>(hv),
        4 => hv,
        5 => _mm256_srli_epi16::<1>(hv),
        6 => _mm256_srli_epi16::<2>(hv),
        _ => _mm256_srli_epi16::<3>(hv),
    };
    _mm256_and_si256(at4, _mm256_set1_epi8(0x10))
}

/// The Q5_0 / Q5_1 (`MIN`) tile: `tile_q4`'s loop order with the 5th bits OR-ed into each
/// unpacked code vector, the i16 sums widened per 4 k-steps, and for Q5_0
/// Σ(c − 16)·q = Σc·q − 16·Σq, for Q5_1 Q4_1's minimum term m·d_x·Σq.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // t / b index register arrays in step with the loads
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q5<const MIN: bool, const B: usize>(
    codes: *const u8,
    scales: *const u8,
    blocks: Range<usize>,
    acts: &ActGroup,
    out: &mut [[f32; 16]; B],
) {
    let format = if MIN {
        WeightFormat::Q5_1
    } else {
        WeightFormat::Q5_0
    };
    let cb = crate::packed_layout::code_bytes(format);
    let sb = crate::packed_layout::scale_bytes(format);
    let mask = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); B];
        for b in 0..B {
            acc[b] = _mm256_loadu_ps(out[b].as_ptr().add(8 * h));
        }
        for k in blocks.clone() {
            let (blk, sc) = (codes.add(k * cb + 32 * h), scales.add(k * sb));
            if h == 0 {
                prefetch(codes.add(k * cb), cb);
            }
            let hv = _mm256_loadu_si256(blk.add(crate::packed_layout::Q5_HI) as *const __m256i);
            let mut dot = [_mm256_setzero_si256(); B];
            for jj in 0..2 {
                let mut w = [_mm256_setzero_si256(); 4];
                for t in 0..2 {
                    let bytes = _mm256_loadu_si256(blk.add(64 * (2 * jj + t)) as *const __m256i);
                    w[2 * t] = _mm256_and_si256(bytes, mask);
                    w[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), mask);
                }
                for u in 0..4 {
                    w[u] = _mm256_or_si256(w[u], fifth_bits(hv, 4 * jj + u));
                }
                for b in 0..B {
                    let mut sum16 = _mm256_setzero_si256();
                    for u in 0..4 {
                        let q = step(acts, k * B + b, 4 * jj + u);
                        sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(w[u], q));
                    }
                    dot[b] = _mm256_add_epi32(dot[b], _mm256_madd_epi16(sum16, ones));
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(sc.add(16 * h) as *const __m128i));
            for b in 0..B {
                let i = k * B + b;
                // Q5_0: Σ(c − 16)·q = Σc·q − 16·Σq (Q5_1's bias is 0: its offset is 0).
                let dot = _mm256_add_epi32(dot[b], _mm256_set1_epi32(*acts.bias.get_unchecked(i)));
                let dx = _mm256_set1_ps(*acts.d.get_unchecked(i));
                acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, dx), acc[b]);
                if MIN {
                    let m = _mm256_cvtph_ps(_mm_loadu_si128(sc.add(32 + 16 * h) as *const __m128i));
                    let sx = _mm256_set1_ps(*acts.sum.get_unchecked(i));
                    acc[b] = _mm256_fmadd_ps(m, sx, acc[b]);
                }
            }
        }
        for b in 0..B {
            _mm256_storeu_ps(out[b].as_mut_ptr().add(8 * h), acc[b]);
        }
    }
}

/// The Q8_0 tile (IQ4_NL with `NL`: its signed values come from the nibbles by one `vpshufb`
/// into `kvalues_iq4nl`, then are multiplied as Q8_0's codes, as llama.cpp's AVX2
/// `vec_dot_iq4_nl_q8_0`): per k-step both halves' codes are loaded and made absolute (|c|,
/// the sign trick's unsigned operand) once, then serve all B activations, each as
/// |c| × (q with c's sign) by `vpmaddubsw`, widened every step (|c|·|q| ≤ 127 · 127, so two
/// steps could overflow i16); one broadcast of the activation's step serves both halves. The
/// previous loop order (activations outside the steps) redid the load and |c| per activation.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // b / h index register arrays in step with the loads
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q8<const NL: bool, const B: usize>(
    codes: *const u8,
    scales: *const u8,
    blocks: Range<usize>,
    acts: &ActGroup,
    out: &mut [[f32; 16]; B],
) {
    let format = if NL {
        WeightFormat::IQ4_NL
    } else {
        WeightFormat::Q8_0
    };
    let cb = crate::packed_layout::code_bytes(format);
    let ones = _mm256_set1_epi16(1);
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(
        crate::iq4nl::KVALUES.as_ptr() as *const __m128i
    ));
    let mask = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_ps(); 2]; B];
    for b in 0..B {
        for h in 0..2 {
            acc[b][h] = _mm256_loadu_ps(out[b].as_ptr().add(8 * h));
        }
    }
    for k in blocks {
        let (blk, sc) = (
            codes.add(k * cb),
            scales.add(k * crate::packed_layout::scale_bytes(format)),
        );
        prefetch(blk, cb);
        let mut dot = [[_mm256_setzero_si256(); 2]; B];
        for s in 0..8 {
            let c = [0, 1].map(|h| {
                if NL {
                    // k-step s: the low (even s) or high nibbles of group s / 2, as table values.
                    let bytes =
                        _mm256_loadu_si256(blk.add(64 * (s / 2) + 32 * h) as *const __m256i);
                    let idx = if s % 2 == 0 {
                        _mm256_and_si256(bytes, mask)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), mask)
                    };
                    _mm256_shuffle_epi8(table, idx)
                } else {
                    _mm256_loadu_si256(blk.add(64 * s + 32 * h) as *const __m256i)
                }
            });
            let a = c.map(|c| _mm256_sign_epi8(c, c));
            for b in 0..B {
                let q = step(acts, k * B + b, s);
                for h in 0..2 {
                    let pairs = _mm256_maddubs_epi16(a[h], _mm256_sign_epi8(q, c[h]));
                    dot[b][h] = _mm256_add_epi32(dot[b][h], _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        for h in 0..2 {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(sc.add(16 * h) as *const __m128i));
            for b in 0..B {
                let dx = _mm256_set1_ps(*acts.d.get_unchecked(k * B + b));
                acc[b][h] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(dot[b][h]),
                    _mm256_mul_ps(d, dx),
                    acc[b][h],
                );
            }
        }
    }
    for b in 0..B {
        _mm256_storeu_ps(out[b].as_mut_ptr(), acc[b][0]);
        _mm256_storeu_ps(out[b].as_mut_ptr().add(8), acc[b][1]);
    }
}
