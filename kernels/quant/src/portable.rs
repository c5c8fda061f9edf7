//! The portable products: any CPU, no intrinsics (what ARM and other CPUs get until they have
//! their own path, and what `isa=portable` forces on x86-64). Batch 1 decodes a few blocks of a
//! row at a time into scratch and takes dot products (`row_dot`); batch ≥ 2 decodes 64-row ×
//! 512-column tiles to f32 and multiplies them by faer's GEMM (`decoded_tile_gemm`); int8
//! activations take integer dot products per 32-value chunk (`rows_dot_q8`), exactly the sums
//! the SIMD kernels form.

use crate::act_q8::Q8Activation;
use crate::group::read_scale;
use crate::matrix::QuantMatrix;
use crate::plan::{BlockPlan, Header};
use kernel_cpu::gemm::{sgemm, Strides};

/// Rows and columns of the decoded tile.
const TILE_ROWS: usize = 64;
const TILE_COLS: usize = 512;

/// One row: decode a few blocks into scratch, dot them with x.
pub fn row_dot(w: &QuantMatrix, r: usize, x: &[f32], scratch: &mut (Vec<f32>, Vec<u8>)) -> f32 {
    let bv = w.format.block_values();
    let (vals, codes) = scratch;
    // Decode several small blocks at once so each dot product runs over a useful length.
    let span = bv.max(256).next_multiple_of(bv).min(w.cols);
    vals.resize(span, 0.0);
    let mut sum = 0.0f32;
    for (k, xs) in x.chunks(span).enumerate() {
        let part = &mut vals[..xs.len()];
        w.decode_row_range(r, k * span, part, codes);
        sum += kernel_cpu::simd::dot_plain(part, xs);
    }
    sum
}

/// Portable batch ≥ 2: decode TILE_ROWS × TILE_COLS of W to f32, multiply by faer's GEMM.
pub fn decoded_tile_gemm(
    w: &QuantMatrix,
    r0: usize,
    mr: usize,
    x: &[f32],
    batch: usize,
    out: &mut [f32],
) {
    let cols = w.cols;
    let kc = TILE_COLS
        .next_multiple_of(w.format.block_values())
        .min(cols);
    let mut tile = vec![0.0f32; TILE_ROWS.min(mr) * kc];
    let mut codes = vec![];
    for (t0, tr) in (0..mr)
        .step_by(TILE_ROWS)
        .map(|t| (t, TILE_ROWS.min(mr - t)))
    {
        let mut c = vec![0.0f32; batch * tr];
        for k0 in (0..cols).step_by(kc) {
            let kw = kc.min(cols - k0);
            for i in 0..tr {
                w.decode_row_range(r0 + t0 + i, k0, &mut tile[i * kw..(i + 1) * kw], &mut codes);
            }
            sgemm(
                batch,
                kw,
                tr,
                1.0,
                &x[k0..],
                Strides::row_major(cols),
                &tile[..tr * kw],
                Strides::transposed(kw),
                if k0 == 0 { 0.0 } else { 1.0 },
                &mut c,
                tr,
            );
        }
        for b in 0..batch {
            out[b * mr + t0..b * mr + t0 + tr].copy_from_slice(&c[b * tr..(b + 1) * tr]);
        }
    }
}

/// (a, b, zero) of a block header: w = a·(c − offset − zero) + b.
fn header(plan: &BlockPlan, p: &[u8]) -> (f32, f32, i32) {
    match plan.header {
        Header::Scale(st) => (read_scale(p, st), 0.0, 0),
        Header::ScaleMin => (crate::ggml::f16_at(p), crate::ggml::f16_at(&p[2..]), 0),
        Header::ScaleZero(st) => (read_scale(p, st), 0.0, p[st.bytes()] as i32),
    }
}

/// y = Σ over the row's blocks of a·d_x·Σ(c − offset)·q (+ m·d_x·Σq for Q4_1), with every
/// chunk's integer sum exact; `act` from `act_q8::quantize_activation(plan, x)`.
pub fn rows_dot_q8(plan: &BlockPlan, row: &[u8], nblocks: usize, act: &Q8Activation) -> f32 {
    let chunk_bytes = if plan.bits == 4 { 16 } else { 32 };
    let mut acc = 0.0f32;
    for blk in 0..nblocks {
        let p = &row[blk * plan.bytes..(blk + 1) * plan.bytes];
        let (a, m, zero) = header(plan, p);
        let offset = plan.offset as i32 + zero;
        for c in 0..plan.values / 32 {
            let at = blk * plan.values + c * 32;
            let codes = &p[plan.header_bytes + c * chunk_bytes..][..chunk_bytes];
            let q = &act.q[at..at + 32];
            let q: &[i8; 32] = q.try_into().expect("32 codes");
            let dot = chunk_dot(plan.bits, plan.signed8, codes, q) - offset * act.qsum[at / 32];
            acc += a * act.d[at / 32] * dot as f32;
            if m != 0.0 {
                acc += m * act.sum[at / 32];
            }
        }
    }
    acc
}

/// Σ code_i·q_i over one 32-value chunk of `rows_dot_q8`: position i is byte i mod 16, nibble
/// i / 16 (4-bit codes), or byte i (8-bit, signed or not). SSE2 on x86-64 (part of every
/// x86-64: codes and activations widened to i16, `pmaddwd` into i32, exact); plain loops
/// elsewhere.
#[inline(always)]
fn chunk_dot(bits: u32, signed8: bool, codes: &[u8], q: &[i8; 32]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    {
        chunk_dot_sse2(bits, signed8, codes, q)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        chunk_dot_plain(bits, signed8, codes, q)
    }
}

#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn chunk_dot_plain(bits: u32, signed8: bool, codes: &[u8], q: &[i8; 32]) -> i32 {
    (0..32)
        .map(|i| {
            let c = match (bits, signed8) {
                (4, _) => ((codes[i % 16] >> (4 * (i / 16))) & 15) as i32,
                (_, true) => codes[i] as i8 as i32,
                _ => codes[i] as i32,
            };
            c * q[i] as i32
        })
        .sum()
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn chunk_dot_sse2(bits: u32, signed8: bool, codes: &[u8], q: &[i8; 32]) -> i32 {
    use std::arch::x86_64::*;
    let need = if bits == 4 { 16 } else { 32 };
    assert!(codes.len() >= need);
    // SAFETY: SSE2 is part of every x86-64; the loads read `need` bytes of `codes` (asserted)
    // and the 32 of `q`.
    unsafe {
        let load = |p: *const u8| _mm_loadu_si128(p as *const __m128i);
        let z = _mm_setzero_si128();
        let sext = |v: __m128i| {
            (
                _mm_srai_epi16::<8>(_mm_unpacklo_epi8(v, v)),
                _mm_srai_epi16::<8>(_mm_unpackhi_epi8(v, v)),
            )
        };
        let zext = |v: __m128i| (_mm_unpacklo_epi8(v, z), _mm_unpackhi_epi8(v, z));
        let (c0, c1) = if bits == 4 {
            let v = load(codes.as_ptr());
            let m = _mm_set1_epi8(15);
            (
                _mm_and_si128(v, m),
                _mm_and_si128(_mm_srli_epi16::<4>(v), m),
            )
        } else {
            (load(codes.as_ptr()), load(codes.as_ptr().add(16)))
        };
        let (w0, w1, w2, w3) = if bits != 4 && signed8 {
            let ((a, b), (c, d)) = (sext(c0), sext(c1));
            (a, b, c, d)
        } else {
            let ((a, b), (c, d)) = (zext(c0), zext(c1));
            (a, b, c, d)
        };
        let ((x0, x1), (x2, x3)) = (
            sext(load(q.as_ptr() as *const u8)),
            sext(load(q.as_ptr().add(16) as *const u8)),
        );
        let s = _mm_add_epi32(
            _mm_add_epi32(_mm_madd_epi16(w0, x0), _mm_madd_epi16(w1, x1)),
            _mm_add_epi32(_mm_madd_epi16(w2, x2), _mm_madd_epi16(w3, x3)),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0x4E>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0xB1>(s));
        _mm_cvtsi128_si32(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sse2_chunk_dot_equals_the_plain_loop() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut byte = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        };
        for _ in 0..200 {
            let codes: Vec<u8> = (0..32).map(|_| byte()).collect();
            let q: [i8; 32] = std::array::from_fn(|_| (byte() as i8).max(-127));
            for (bits, signed8) in [(4, false), (8, true), (8, false)] {
                assert_eq!(
                    chunk_dot(bits, signed8, &codes, &q),
                    chunk_dot_plain(bits, signed8, &codes, &q),
                    "bits {bits} signed {signed8}"
                );
            }
        }
    }
}
