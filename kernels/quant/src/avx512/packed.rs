//! The packed-tile kernel with AVX-512 VNNI (llama.cpp's `tinygemm_kernel_vnni` for
//! block_q4_1 / block_q8_0, whose layout `crate::packed` follows): a 16-row tile is one zmm,
//! one row per 32-bit lane. Per block, each k-step's four activation bytes are broadcast and
//! `vpdpbusd` accumulates (u8 codes × s8 activations) into the 16 rows' lanes; one convert and
//! one FMA with the 16 rows' d·d_x apply the scales. Q4_0's and Q5_0's offsets and Q8_0's sign
//! flip (codes + 128, unsigned for `vpdpbusd`) are taken off with the activation's exact Σq:
//! the block's integer sum starts at −offset·Σq, one broadcast from memory. Q5_0's 5th bits come from their plane, one
//! shift and one mask per k-step (as on AVX2).
//!
//! Q5_1 is Q5_0's codes with Q4_1's minimum (m·d_x·Σq per block, no offset). IQ4_NL's
//! nibbles index llama.cpp's `kvalues_iq4nl`: one `vpshufb` per code vector turns them into
//! the table values + 128, taken off with −128·Σq as Q8_0's flip.
//!
//! One loop for the six formats: per block the 8 code vectors (one per k-step) are built
//! once — loads, nibble unpacking, 5th bits or sign flips — and shared by the pass's B ≤ 8
//! activations, whose pointers are read once per tile, so the B accumulators, the 8 code
//! vectors and the scales stay in the 32 zmm registers (8 + 8 + 3 at B = 8). Per activation
//! and block that leaves 8 `vpdpbusd` and 5 other vector instructions (an earlier version
//! re-read each activation's vectors through its `Vec`s every block and kept the
//! accumulators on the stack: 28% of the VNNI peak at B = 8).

#[cfg(target_arch = "x86_64")]
use crate::act_group::ActGroup;
#[cfg(target_arch = "x86_64")]
use crate::format::WeightFormat;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The 32-value formats of the tile loop (a const parameter, so each is its own loop).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q8_0: u8 = 3;
const Q5_1: u8 = 4;
const IQ4_NL: u8 = 5;

/// `kvalues_iq4nl` + 128: IQ4_NL's table as unsigned bytes.
const IQ4_PLUS_128: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (crate::iq4nl::KVALUES[i] as i16 + 128) as u8;
        i += 1;
    }
    t
};

/// out[b][r] += Σ over tile-blocks k in `blocks` of row r of the tile whose tile-blocks have
/// their codes at `codes` and their scales at `scales` (`crate::packed`; block 0 there) ·
/// block k of activation b of `acts`. The sum runs on from `out`, so a tile taken in pieces of
/// blocks gives the bits of one pass over all of them.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL, VNNI and F16C; `codes` and `scales` cover `blocks.end`
/// tile-blocks of `format` (q4_0, q4_1, q5_0, q5_1, iq4_nl or q8_0).
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn tile_dot<const B: usize>(
    format: WeightFormat,
    codes: *const u8,
    scales: *const u8,
    blocks: std::ops::Range<usize>,
    acts: &ActGroup,
    out: &mut [[f32; 16]; B],
) {
    assert!(acts.covers(B, blocks.end));
    let acts = Act::of(acts);
    match format {
        WeightFormat::Q4_0 => tile::<Q4_0, B>(codes, scales, blocks, acts, out),
        WeightFormat::Q4_1 => tile::<Q4_1, B>(codes, scales, blocks, acts, out),
        WeightFormat::Q5_0 => tile::<Q5_0, B>(codes, scales, blocks, acts, out),
        WeightFormat::Q5_1 => tile::<Q5_1, B>(codes, scales, blocks, acts, out),
        WeightFormat::IQ4_NL => tile::<IQ4_NL, B>(codes, scales, blocks, acts, out),
        _ => tile::<Q8_0, B>(codes, scales, blocks, acts, out),
    }
}

/// A group's arrays as raw pointers (entry k·B + b: block k of activation b).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Act {
    q: *const i8,
    d: *const f32,
    sum: *const f32,
    bias: *const i32,
}

#[cfg(target_arch = "x86_64")]
impl Act {
    fn of(a: &ActGroup) -> Act {
        Act {
            q: a.q.as_ptr(),
            d: a.d.as_ptr(),
            sum: a.sum.as_ptr(),
            bias: a.bias.as_ptr(),
        }
    }
}

/// Four activation bytes (k-step `s` of group entry `i`) in every 32-bit lane.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn step(q: *const i8, i: usize, s: usize) -> __m512i {
    _mm512_set1_epi32((q.add(32 * i + 4 * s) as *const i32).read_unaligned())
}

/// The 5th bits of k-step `s` at bit 4 of each lane byte, from the tile's plane `hv` (bit s
/// of each byte; the 16-bit shifts move no neighbouring bit into bit 4).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn fifth_bits(hv: __m512i, s: usize) -> __m512i {
    let at4 = match s {
        0 => _mm512_slli_epi16::<4>(hv),
        1 => _mm512_slli_epi16::<3>(hv),
        2 => _mm512_slli_epi16::<2>(hv),
        3 => _mm512_slli_epi16::<1>(hv),
        4 => hv,
        5 => _mm512_srli_epi16::<1>(hv),
        6 => _mm512_srli_epi16::<2>(hv),
        _ => _mm512_srli_epi16::<3>(hv),
    };
    _mm512_and_si512(at4, _mm512_set1_epi8(0x10))
}

/// The 8 unsigned code vectors of a tile-block (vector s: k-step s of the 16 rows): Q4
/// nibbles, with Q5_0's / Q5_1's 5th bits OR-ed in, or IQ4_NL's table values + 128 (one
/// `vpshufb` of the nibbles), or Q8_0's codes + 128.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block_codes<const F: u8>(blk: *const u8) -> [__m512i; 8] {
    let mut w = [_mm512_setzero_si512(); 8];
    if F == Q8_0 {
        let flip = _mm512_set1_epi8(-128);
        for (s, w) in w.iter_mut().enumerate() {
            *w = _mm512_xor_si512(_mm512_loadu_si512(blk.add(64 * s) as *const __m512i), flip);
        }
        return w;
    }
    let mask = _mm512_set1_epi8(0x0F);
    for j in 0..4 {
        let bytes = _mm512_loadu_si512(blk.add(64 * j) as *const __m512i);
        w[2 * j] = _mm512_and_si512(bytes, mask);
        w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(bytes), mask);
    }
    if F == IQ4_NL {
        // kvalues_iq4nl + 128 (1..=241, unsigned for `vpdpbusd`) in every 128-bit lane.
        let t = &IQ4_PLUS_128;
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const __m128i));
        for w in w.iter_mut() {
            *w = _mm512_shuffle_epi8(table, *w);
        }
    }
    if F == Q5_0 || F == Q5_1 {
        let hv = _mm512_loadu_si512(blk.add(crate::packed_layout::Q5_HI) as *const __m512i);
        for (s, w) in w.iter_mut().enumerate() {
            *w = _mm512_or_si512(*w, fifth_bits(hv, s));
        }
    }
    w
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // b indexes the accumulators in step with the pointers
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
unsafe fn tile<const F: u8, const B: usize>(
    codes: *const u8,
    scales: *const u8,
    blocks: std::ops::Range<usize>,
    acts: Act,
    out: &mut [[f32; 16]; B],
) {
    let format = match F {
        Q4_0 => WeightFormat::Q4_0,
        Q4_1 => WeightFormat::Q4_1,
        Q5_0 => WeightFormat::Q5_0,
        Q5_1 => WeightFormat::Q5_1,
        IQ4_NL => WeightFormat::IQ4_NL,
        _ => WeightFormat::Q8_0,
    };
    let (cb, sb) = (
        crate::packed_layout::code_bytes(format),
        crate::packed_layout::scale_bytes(format),
    );
    let mut acc = [_mm512_setzero_ps(); B];
    for b in 0..B {
        acc[b] = _mm512_loadu_ps(out[b].as_ptr());
    }
    for k in blocks {
        let (blk, sc) = (codes.add(k * cb), scales.add(k * sb));
        // The code lines 4 KB ahead (the hardware streamer alone left the B = 8 pass waiting
        // on memory: gate_up ran at 71 GMAC/s a core from DRAM, 183 from L2).
        crate::avx2::packed::prefetch(blk, cb);
        let w = block_codes::<F>(blk);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(sc as *const __m256i));
        for b in 0..B {
            let i = k * B + b;
            // The sum starts at −offset·Σq (a broadcast from memory), so it ends as the exact
            // Σ(c − offset)·q. Two chains, so consecutive `vpdpbusd`s do not wait for each
            // other (one chain per activation measured 25% slower at B = 16, 17% at B = 4).
            let mut sum = [_mm512_set1_epi32(*acts.bias.add(i)), _mm512_setzero_si512()];
            for s in 0..8 {
                sum[s % 2] = _mm512_dpbusd_epi32(sum[s % 2], w[s], step(acts.q, i, s));
            }
            let dot = _mm512_add_epi32(sum[0], sum[1]);
            let dx = _mm512_set1_ps(*acts.d.add(i));
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, dx), acc[b]);
            if F == Q4_1 || F == Q5_1 {
                let m = _mm512_cvtph_ps(_mm256_loadu_si256(sc.add(32) as *const __m256i));
                acc[b] = _mm512_fmadd_ps(m, _mm512_set1_ps(*acts.sum.add(i)), acc[b]);
            }
        }
    }
    for b in 0..B {
        _mm512_storeu_ps(out[b].as_mut_ptr(), acc[b]);
    }
}
