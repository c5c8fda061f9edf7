//! The multi-token product with f32 activations (B = 2..64, prefill and batched decode) for
//! the codec formats: a task's rows are decoded once per chunk of columns into an f32 tile
//! (`Codec::unpack`, then a·q + b: the stored values, bit for bit) that every activation of
//! the batch then multiplies — each weight block decoded once per tile of rows, whatever B.
//! The multiply is a register-blocked micro-kernel over lane arrays: RB rows × NB
//! activations × L lanes of accumulators, (L, RB, NB) chosen per tier by `super` so the
//! accumulators fit its registers (AVX-512: 16 × 4 × 4 in 32 zmm; AVX2: 8 × 2 × 4 in 16 ymm;
//! portable SSE: 4 × 2 × 4 in 16 xmm). One source, inlined into each tier's wrapper.

// Lane loops index several fixed arrays in step (the shape LLVM vectorises).
#![allow(clippy::needless_range_loop)]

use super::prims::Prims;
use crate::unpack::{Codec, Unpacked};

/// Columns per decoded chunk (a multiple of every block size).
pub const CHUNK: usize = 512;

/// Decodes rows `r0..r0 + mr` of `data` (`rb` bytes per row), columns `c0..c0 + n`, into
/// `w` (mr × n, row-major).
#[inline(always)]
pub fn decode_chunk<C: Codec, P: Prims>(
    data: &[u8],
    rb: usize,
    r0: usize,
    mr: usize,
    c0: usize,
    n: usize,
    w: &mut [f32],
) {
    let mut u = Unpacked::default();
    for i in 0..mr {
        let row = &data[(r0 + i) * rb..(r0 + i + 1) * rb];
        for blk in 0..n / C::VALUES {
            let k = c0 / C::VALUES + blk;
            C::unpack::<P>(&row[k * C::BYTES..(k + 1) * C::BYTES], &mut u);
            let out = &mut w[i * n + blk * C::VALUES..i * n + (blk + 1) * C::VALUES];
            for j in 0..C::SUBS {
                let (a, b) = (u.a(j), u.b(j));
                for l in 0..16 {
                    let v = a * u.q[16 * j + l] as f32;
                    out[16 * j + l] = if C::HAS_B { v + b } else { v };
                }
            }
        }
    }
}

/// acc[r][b] = Σ_k w[r][k]·x[b][k] over n values (a multiple of L), for RB rows and NB
/// activations, as lane sums reduced by a fixed tree.
#[inline(always)]
pub fn micro<const L: usize, const RB: usize, const NB: usize>(
    w: [&[f32]; RB],
    x: [&[f32]; NB],
    n: usize,
) -> [[f32; NB]; RB] {
    let mut acc = [[[0.0f32; L]; NB]; RB];
    let mut k = 0;
    while k + L <= n {
        let mut wv = [[0.0f32; L]; RB];
        for r in 0..RB {
            wv[r].copy_from_slice(&w[r][k..k + L]);
        }
        for b in 0..NB {
            let mut xv = [0.0f32; L];
            xv.copy_from_slice(&x[b][k..k + L]);
            for r in 0..RB {
                for l in 0..L {
                    acc[r][b][l] += wv[r][l] * xv[l];
                }
            }
        }
        k += L;
    }
    let mut out = [[0.0f32; NB]; RB];
    for r in 0..RB {
        for b in 0..NB {
            out[r][b] = tree_sum(&acc[r][b]);
        }
    }
    out
}

/// Σ of L lanes, halving (L a power of 2).
#[inline(always)]
fn tree_sum<const L: usize>(v: &[f32; L]) -> f32 {
    let mut h = *v;
    let mut width = L;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            h[l] += h[l + width];
        }
    }
    h[0]
}

/// One task: rows `r0..r0 + mr` × every activation into `out` (batch × mr), for tile
/// parameters (L, RB, NB); `w` is scratch of mr × CHUNK.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn task<C: Codec, P: Prims, const L: usize, const RB: usize, const NB: usize>(
    data: &[u8],
    rb: usize,
    cols: usize,
    r0: usize,
    mr: usize,
    x: &[f32],
    batch: usize,
    out: &mut [f32],
    w: &mut [f32],
) {
    out.fill(0.0);
    let mut c0 = 0;
    while c0 < cols {
        let n = CHUNK.min(cols - c0);
        decode_chunk::<C, P>(data, rb, r0, mr, c0, n, w);
        let mut i = 0;
        while i < mr {
            if mr - i >= RB {
                pass::<L, RB, NB>(w, n, i, mr, x, cols, c0, batch, out);
                i += RB;
            } else {
                pass::<L, 1, NB>(w, n, i, mr, x, cols, c0, batch, out);
                i += 1;
            }
        }
        c0 += n;
    }
}

/// Rows i..i + RB of the decoded chunk × every activation, added into `out`: NB (4) at a
/// time, the last 1–3 by their own instance.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn pass<const L: usize, const RB: usize, const NB: usize>(
    w: &[f32],
    n: usize,
    i: usize,
    mr: usize,
    x: &[f32],
    cols: usize,
    c0: usize,
    batch: usize,
    out: &mut [f32],
) {
    let mut wr: [&[f32]; RB] = [&[]; RB];
    for r in 0..RB {
        wr[r] = &w[(i + r) * n..(i + r + 1) * n];
    }
    let xrow = |b: usize| &x[b * cols + c0..b * cols + c0 + n];
    let mut b = 0;
    while b < batch {
        match batch - b {
            1 => put(&mut *out, mr, i, b, micro::<L, RB, 1>(wr, [xrow(b)], n)),
            2 => put(
                &mut *out,
                mr,
                i,
                b,
                micro::<L, RB, 2>(wr, [xrow(b), xrow(b + 1)], n),
            ),
            3 => put(
                &mut *out,
                mr,
                i,
                b,
                micro::<L, RB, 3>(wr, [xrow(b), xrow(b + 1), xrow(b + 2)], n),
            ),
            _ => {
                let mut xs: [&[f32]; NB] = [&[]; NB];
                for (j, xj) in xs.iter_mut().enumerate() {
                    *xj = xrow(b + j);
                }
                put(&mut *out, mr, i, b, micro::<L, RB, NB>(wr, xs, n));
            }
        }
        b += (batch - b).min(NB);
    }
}

/// Adds a micro-kernel's sums into `out` (batch × mr) at rows i.., activations b...
#[inline(always)]
fn put<const RB: usize, const NB: usize>(
    out: &mut [f32],
    mr: usize,
    i: usize,
    b: usize,
    got: [[f32; NB]; RB],
) {
    for (r, row) in got.iter().enumerate() {
        for (k, v) in row.iter().enumerate() {
            out[(b + k) * mr + i + r] += v;
        }
    }
}
