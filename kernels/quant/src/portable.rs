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
            // Position i of a chunk: byte i mod 16, nibble i / 16 (4-bit), or byte i.
            let dot: i32 = (0..32)
                .map(|i| {
                    let c = match (plan.bits, plan.signed8) {
                        (4, _) => ((codes[i % 16] >> (4 * (i / 16))) & 15) as i32,
                        (_, true) => codes[i] as i8 as i32,
                        _ => codes[i] as i32,
                    };
                    (c - offset) * q[i] as i32
                })
                .sum();
            acc += a * act.d[at / 32] * dot as f32;
            if m != 0.0 {
                acc += m * act.sum[at / 32];
            }
        }
    }
    acc
}
