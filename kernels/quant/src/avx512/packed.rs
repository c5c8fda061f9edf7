//! The packed-tile kernel with AVX-512 VNNI (llama.cpp's `tinygemm_kernel_vnni` for
//! block_q4_1 / block_q8_0, whose layout `crate::packed` follows): a 16-row tile is one zmm,
//! one row per 32-bit lane. Per block, each k-step's four activation bytes are broadcast and
//! `vpdpbusd` accumulates (u8 codes × s8 activations) into the 16 rows' lanes; one convert and
//! one FMA with the 16 rows' d·d_x apply the scales. Q4_0's and Q5_0's offsets and Q8_0's sign
//! flip (codes + 128, unsigned for `vpdpbusd`) are taken off with the activation's exact Σq.
//! Q5_0's 5th bits come from their plane, one shift and one mask per k-step (as on AVX2).

#[cfg(target_arch = "x86_64")]
use crate::act_q8::Q8Activation;
#[cfg(target_arch = "x86_64")]
use crate::format::WeightFormat;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// out[b][r] = row r of the tile whose `nblocks` tile-blocks have their codes at `codes` and
/// their scales at `scales` (`crate::packed`) · activation b.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL, VNNI and F16C; `codes` and `scales` cover `nblocks`
/// tile-blocks of `format` (q4_0, q4_1, q5_0 or q8_0).
#[cfg(target_arch = "x86_64")]
pub unsafe fn tile_dot<const B: usize>(
    format: WeightFormat,
    codes: *const u8,
    scales: *const u8,
    nblocks: usize,
    acts: [&Q8Activation; B],
) -> [[f32; 16]; B] {
    for a in acts {
        assert!(a.q.len() >= nblocks * 32 && a.qsum.len() >= nblocks);
    }
    match format {
        WeightFormat::Q4_0 => tile_q4::<false, B>(codes, scales, nblocks, acts),
        WeightFormat::Q4_1 => tile_q4::<true, B>(codes, scales, nblocks, acts),
        WeightFormat::Q5_0 => tile_q5::<B>(codes, scales, nblocks, acts),
        _ => tile_q8::<B>(codes, scales, nblocks, acts),
    }
}

/// Four activation bytes (k-step `s` of block `k`) in every 32-bit lane.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn step(act: &Q8Activation, k: usize, s: usize) -> __m512i {
    _mm512_set1_epi32((act.q.as_ptr().add(32 * k + 4 * s) as *const i32).read_unaligned())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
unsafe fn tile_q4<const MIN: bool, const B: usize>(
    codes: *const u8,
    scales: *const u8,
    nblocks: usize,
    acts: [&Q8Activation; B],
) -> [[f32; 16]; B] {
    let sb = if MIN { 64 } else { 32 };
    let mask = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); B];
    for k in 0..nblocks {
        let (blk, sc) = (codes.add(k * 256), scales.add(k * sb));
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(sc as *const __m256i));
        let m = if MIN {
            _mm512_cvtph_ps(_mm256_loadu_si256(sc.add(32) as *const __m256i))
        } else {
            _mm512_setzero_ps()
        };
        for b in 0..B {
            let act = acts[b];
            // Two chains, so consecutive `vpdpbusd`s do not wait for each other.
            let mut sum = [_mm512_setzero_si512(); 2];
            for j in 0..4 {
                let bytes = _mm512_loadu_si512(blk.add(64 * j) as *const __m512i);
                let lo = _mm512_and_si512(bytes, mask);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(bytes), mask);
                sum[0] = _mm512_dpbusd_epi32(sum[0], lo, step(act, k, 2 * j));
                sum[1] = _mm512_dpbusd_epi32(sum[1], hi, step(act, k, 2 * j + 1));
            }
            let mut dot = _mm512_add_epi32(sum[0], sum[1]);
            if !MIN {
                dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(8 * *act.qsum.get_unchecked(k)));
            }
            let dx = _mm512_set1_ps(*act.d.get_unchecked(k));
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, dx), acc[b]);
            if MIN {
                acc[b] = _mm512_fmadd_ps(m, _mm512_set1_ps(*act.sum.get_unchecked(k)), acc[b]);
            }
        }
    }
    let mut out = [[0.0f32; 16]; B];
    for b in 0..B {
        _mm512_storeu_ps(out[b].as_mut_ptr(), acc[b]);
    }
    out
}

/// The 5th bits of k-step `s` at bit 4 of each lane byte, from the tile's plane `hv` (bit s
/// of each byte; the 16-bit shifts move no neighbouring bit into bit 4).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn fifth_bits(hv: __m512i, s: usize) -> __m512i {
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

/// The Q5_0 tile: the 8 code vectors of a block built once (nibble | 5th bit) and shared by
/// the pass's activations; Σ(c − 16)·q = Σc·q − 16·Σq.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // s / b index register arrays in step with the loads
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
unsafe fn tile_q5<const B: usize>(
    codes: *const u8,
    scales: *const u8,
    nblocks: usize,
    acts: [&Q8Activation; B],
) -> [[f32; 16]; B] {
    let cb = crate::packed_layout::code_bytes(WeightFormat::Q5_0);
    let mask = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); B];
    for k in 0..nblocks {
        let (blk, sc) = (codes.add(k * cb), scales.add(k * 32));
        let hv = _mm512_loadu_si512(blk.add(crate::packed_layout::Q5_HI) as *const __m512i);
        let mut w = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            let bytes = _mm512_loadu_si512(blk.add(64 * j) as *const __m512i);
            w[2 * j] = _mm512_or_si512(_mm512_and_si512(bytes, mask), fifth_bits(hv, 2 * j));
            w[2 * j + 1] = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(bytes), mask),
                fifth_bits(hv, 2 * j + 1),
            );
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(sc as *const __m256i));
        for b in 0..B {
            let act = acts[b];
            let mut sum = [_mm512_setzero_si512(); 2];
            for s in 0..8 {
                sum[s % 2] = _mm512_dpbusd_epi32(sum[s % 2], w[s], step(act, k, s));
            }
            let dot = _mm512_sub_epi32(
                _mm512_add_epi32(sum[0], sum[1]),
                _mm512_set1_epi32(16 * *act.qsum.get_unchecked(k)),
            );
            let dx = _mm512_set1_ps(*act.d.get_unchecked(k));
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, dx), acc[b]);
        }
    }
    let mut out = [[0.0f32; 16]; B];
    for b in 0..B {
        _mm512_storeu_ps(out[b].as_mut_ptr(), acc[b]);
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
unsafe fn tile_q8<const B: usize>(
    codes: *const u8,
    scales: *const u8,
    nblocks: usize,
    acts: [&Q8Activation; B],
) -> [[f32; 16]; B] {
    let flip = _mm512_set1_epi8(-128);
    let mut acc = [_mm512_setzero_ps(); B];
    for k in 0..nblocks {
        let (blk, sc) = (codes.add(k * 512), scales.add(k * 32));

        let d = _mm512_cvtph_ps(_mm256_loadu_si256(sc as *const __m256i));
        for b in 0..B {
            let act = acts[b];
            let mut sum = [_mm512_setzero_si512(); 2];
            for s in 0..8 {
                // c + 128 as an unsigned byte; Σ(c + 128)·q − 128·Σq = Σc·q.
                let c =
                    _mm512_xor_si512(_mm512_loadu_si512(blk.add(64 * s) as *const __m512i), flip);
                sum[s % 2] = _mm512_dpbusd_epi32(sum[s % 2], c, step(act, k, s));
            }
            let dot = _mm512_sub_epi32(
                _mm512_add_epi32(sum[0], sum[1]),
                _mm512_set1_epi32(128 * *act.qsum.get_unchecked(k)),
            );
            let dx = _mm512_set1_ps(*act.d.get_unchecked(k));
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, dx), acc[b]);
        }
    }
    let mut out = [[0.0f32; 16]; B];
    for b in 0..B {
        _mm512_storeu_ps(out[b].as_mut_ptr(), acc[b]);
    }
    out
}
