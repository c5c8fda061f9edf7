//! Row-interleaved tiles for the int8-activation product (the `packed` variant): the weight
//! layout llama.cpp builds at load time for its AMX/VNNI `tinygemm` kernels (`ggml-cpu/amx`,
//! block_q4_1 packed by `pack_qs`) and, in 4/8-row form, for its Q4_0 `repack` GEMV. Sixteen
//! rows × one 32-value block form a tile-block; inside it, byte lane 4r..4r+4 of each 64-byte
//! group holds four codes of row r, so one broadcast of four activation bytes multiplies all 16
//! rows at once (`vpdpbusd` with AVX-512 VNNI, `vpmaddubsw` on AVX2) and the 16 rows' dot
//! products come out in the lanes of one vector — no horizontal sums, no per-row scale
//! broadcasts: the 16 rows' scales are one 32-byte load and one `vcvtph2ps`. The row-major
//! kernels spend ~8 vector instructions per row and block; these 1.5–3.
//!
//! Tile-block layout (T = 16 rows, block k of 32 values, tiles × blocks in that order), codes
//! and scales in two regions of one 64-byte-aligned buffer, so every 64-byte code load is one
//! cache line (with the scales inline, a Q8_0 tile-block is 544 bytes and every other block's
//! loads straddled two lines: 25% slower from L3):
//! - Q4_0 / Q4_1 codes: 4 groups × 64 bytes; group j, byte 4r + b = code(r, 8j + b) |
//!   code(r, 8j + 4 + b) << 4 (the low nibbles are k-step 2j, the high ones k-step 2j + 1;
//!   k-step s is values 4s..4s+4). Scales: the 16 rows' f16 d, for Q4_1 then the 16 f16 m.
//! - Q8_0 codes: 8 groups × 64 bytes, group s, byte 4r + b = code(r, 4s + b). Scales: 16 f16 d.
//! - Q5_0 codes: the low 4 bits as Q4_0's, then a 64-byte plane of 5th bits: byte 4r + b, bit
//!   s = the 5th bit of code(r, 4s + b), so one shift and one mask put k-step s's 5th bits at
//!   bit 4 of every lane byte (the AVX2 kernel's extra cost: 3 ops per k-step and 8 rows,
//!   shared by the pass's activations). Scales: 16 f16 d. Product: Σ(c − 16)·q = Σc·q − 16·Σq.
//! - Q5_1 (value d·c + m, c = 0..31): Q5_0's codes, Q4_1's scales (16 f16 d, then 16 f16 m);
//!   product d·d_x·Σc·q + m·d_x·Σq, as Q4_1's.
//! - IQ4_NL (value d·kvalues_iq4nl[c], the table's entries −127..113): Q4_0's codes and
//!   scales; the kernels turn the nibbles into table values with one byte shuffle per code
//!   vector (`vpshufb`; the portable tier a lookup per tile-block and pass) and multiply them
//!   as Q8_0's codes (llama.cpp's `vec_dot_iq4_nl_q8_0`).
//!
//! - Q4_K (super-blocks of 256: 8 sub-blocks of 32 with 6-bit scales sc and minimums m):
//!   a tile-block is 16 rows × one super-block; its codes are 8 Q4_0-style sub-tiles of 256
//!   bytes (sub-block j's codes as a Q4_0 tile-block's); its scales the 16 rows' f16 d, the 16
//!   f16 dmin, then sc[j][r] and m[j][r] as bytes (8 × 16 each) — the 6-bit fields unpacked
//!   once at load, so the kernels read them with one widening load per 8 rows (llama.cpp's
//!   `block_q4_Kx8` unpacks them at load too). The product is llama.cpp's `vec_dot_q4_K_q8_K`
//!   arithmetic: the activation quantised to Q8_K (per-256 scale, sums per 32), per sub-block
//!   an exact Σc·q times sc, the minimums as Σ m·Σq, both integer per super-block, then
//!   d·d_x·Σ − dmin·d_x·Σmin in f32.
//! - Q5_K (Q4_K with 5-bit codes): Q4_K's scales; its codes 8 sub-tiles of 320 bytes, each a
//!   Q5_0 tile-block's codes (nibbles, then the 5th-bit plane). The product is Q4_K's
//!   (`vec_dot_q5_K_q8_K`), the 5th bits OR-ed into the unpacked codes as Q5_0's.
//! - Q6_K (super-blocks of 256: 16 groups of 16 with i8 scales, 6-bit codes c, value
//!   d·s·(c − 32)): per sub-block of 32, Q4_0-style nibbles (256 bytes) then the top 2 bits
//!   (128 bytes: group g of k-steps 4g..4g+4, byte 4r + b, bits 2t..2t+2 of k-step 4g + t);
//!   scales the 16 rows' f16 d, then s[G][r] as i8 (16 × 16). The product is llama.cpp's
//!   `vec_dot_q6_K_q8_K`: Σ_G s_G·Σc·q exact in i32, less 32·Σ_G s_G·Σq (Q8_K's sums of
//!   16), times d·d_x (`packed_q4k`).
//!
//! Codes + scales are 16 × the ggml block (288, 320, 352, 384, 544, Q6_K 3360 bytes; Q4_K
//! 2368 = 16 × 144 + 64, Q5_K 2880 = 16 × 176 + 64), so packing costs no memory beyond
//! padding the last tile to 16 rows (Q4_K: 2.8% for the unpacked 6-bit fields, Q5_K 2.3%).
//! Where each block's bytes go is `packed_codes`.
//!
//! The arithmetic is the row-major `FusedQ8`'s exactly — per block an exact integer
//! Σ(c − offset)·q, times a·d_x, plus m·d_x·Σq for Q4_1 — so the same reference judges it. An
//! AVX2 lane accumulates 8 steps of `vpmaddubsw` in i16 before widening: Q4 codes ≤ 15 and
//! |q| ≤ 127 keep the sum ≤ 8 · 2 · 15 · 127 = 30480, inside i16 (Q8_0 widens every step).

use crate::act_group::ActGroup;
use crate::act_q8::{self, Q8Activation};
use crate::format::WeightFormat;
use crate::matrix::{decode_block, QuantMatrix};
use crate::packed_codes;
pub use crate::packed_layout::{
    block_values, code_bytes, scale_bytes, tile_block_bytes, BLOCK, SUPER, TILE,
};
use crate::plan::BlockPlan;
use kernel_common::{error::Result, KernelError};
use kernel_cpu::{team, Isa};

/// Tiles per thread task.
const TASK_TILES: usize = 2;
/// Activations per pass over a tile of `format` at `isa`: 8 for the 32-value formats with
/// AVX-512 VNNI (32 zmm registers hold 8 accumulators, the block's 8 code vectors and the
/// sums) and for Q4_0 / Q4_1 with AVX2, 4 elsewhere (the K-quant kernels; Q5_0, Q5_1, IQ4_NL
/// and Q8_0 with AVX2, whose 16 ymm registers hold 4 activations' sums beside their codes).
/// AVX2 Q4 at 8, measured on a Zen 4 core: in L2 (`tile_rate`, 256 × 576, one thread) 77–82
/// GMAC/s at 5–8 activations and 78–81 at 64–512 against 57–76 with passes of 4, and a
/// SmolLM2 Q4_0 8-token step at 2 threads 4% faster (alternated A/B). Q8_0 at 8 was 5%
/// faster in L2 and no faster in the model; Q5_0 at 8 was slower (65 against 68 GMAC/s).
fn pass(format: WeightFormat, isa: Isa) -> usize {
    let avx2_q4 = matches!(format, WeightFormat::Q4_0 | WeightFormat::Q4_1);
    if (isa.has_avx512_vnni() && block_values(format) == BLOCK) || (isa.has_avx2() && avx2_q4) {
        8
    } else {
        4
    }
}

/// A weight matrix in Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q8_0, Q4_K, Q5_K or Q6_K laid out as
/// 16-row tiles.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedMatrix {
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    /// The code region, then the scale region.
    lines: Vec<Line>,
    /// Byte offset of the scale region.
    scales_at: usize,
}

/// One cache line: the buffer's unit, so it is 64-byte aligned.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// The formats with a packed layout (the ggml formats GGUF checkpoints use).
pub const PACKABLE: [WeightFormat; 9] = [
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
    WeightFormat::Q5_0,
    WeightFormat::Q5_1,
    WeightFormat::IQ4_NL,
    WeightFormat::Q8_0,
    WeightFormat::Q4_K,
    WeightFormat::Q5_K,
    WeightFormat::Q6_K,
];

/// Whether `format` has a packed layout.
pub fn packable(format: WeightFormat) -> bool {
    PACKABLE.contains(&format)
}

/// `PACKABLE` as a sentence's list ("q4_0, q4_1, … and q6_k"), for the errors that name them.
pub fn packable_names() -> String {
    let names: Vec<String> = PACKABLE.iter().map(|f| f.to_string()).collect();
    let (last, rest) = names.split_last().expect("PACKABLE is not empty");
    format!("{} and {last}", rest.join(", "))
}

impl PackedMatrix {
    /// Tiles (the last padded with zero rows).
    pub fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE)
    }

    /// Tile-blocks per row (blocks of 32, or Q4_K super-blocks).
    pub fn blocks(&self) -> usize {
        self.cols / block_values(self.format)
    }

    /// All packed bytes: the code region, then the scale region.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is 64 plain bytes (repr(C)), so the vector is one byte slice.
        unsafe {
            std::slice::from_raw_parts(self.lines.as_ptr() as *const u8, 64 * self.lines.len())
        }
    }

    /// The codes of tile-block (t, k), then those of the next blocks of tile t.
    pub(crate) fn codes(&self, t: usize, k: usize) -> &[u8] {
        let at = (t * self.blocks() + k) * code_bytes(self.format);
        &self.bytes()[at..self.scales_at]
    }

    /// The scales of tile-block (t, k), then those of the next blocks of tile t.
    pub(crate) fn scales(&self, t: usize, k: usize) -> &[u8] {
        let at = self.scales_at + (t * self.blocks() + k) * scale_bytes(self.format);
        &self.bytes()[at..]
    }

    /// Packs a row-major matrix (exact: `unpack` gives its bytes back).
    pub fn pack(m: &QuantMatrix) -> Result<PackedMatrix> {
        if !packable(m.format) {
            return Err(KernelError::Unsupported(format!(
                "packed tiles take {}, not {}",
                packable_names(),
                m.format
            )));
        }
        let (format, nblocks) = (m.format, m.cols / block_values(m.format));
        let (bb, cb, sb) = (
            format.block_bytes(),
            code_bytes(format),
            scale_bytes(format),
        );
        let tiles = m.rows.div_ceil(TILE);
        let scales_at = tiles * nblocks * cb;
        let total = scales_at + tiles * nblocks * sb;
        let mut lines = vec![Line([0; 64]); total.div_ceil(64)];
        // SAFETY: as in `bytes`, mutably.
        let data = unsafe {
            std::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut u8, 64 * lines.len())
        };
        let (code_region, scale_region) = data.split_at_mut(scales_at);
        // Tiles in parallel (a 0.5B model's load packs ~400 MB of tiles).
        use rayon::prelude::*;
        code_region
            .par_chunks_exact_mut((nblocks * cb).max(1))
            .zip(scale_region.par_chunks_exact_mut((nblocks * sb).max(1)))
            .enumerate()
            .for_each(|(t, (tile_codes, tile_scales))| {
                for (k, (codes, scales)) in tile_codes
                    .chunks_exact_mut(cb)
                    .zip(tile_scales.chunks_exact_mut(sb))
                    .enumerate()
                {
                    for r in 0..TILE.min(m.rows - t * TILE) {
                        let block = &m.row(t * TILE + r)[k * bb..(k + 1) * bb];
                        packed_codes::put_block(format, block, r, codes, scales);
                    }
                }
            });
        Ok(PackedMatrix {
            format,
            rows: m.rows,
            cols: m.cols,
            lines,
            scales_at,
        })
    }

    /// The ggml bytes of block k of row r.
    fn ggml_block(&self, r: usize, k: usize) -> Vec<u8> {
        let (codes, scales) = (self.codes(r / TILE, k), self.scales(r / TILE, k));
        packed_codes::get_block(self.format, r % TILE, codes, scales)
    }

    /// The row-major matrix again (byte for byte what was packed).
    pub fn unpack(&self) -> QuantMatrix {
        let mut bytes = Vec::with_capacity(self.rows * self.format.row_bytes(self.cols));
        for r in 0..self.rows {
            for k in 0..self.blocks() {
                bytes.extend(self.ggml_block(r, k));
            }
        }
        QuantMatrix::from_bytes(self.format, self.rows, self.cols, bytes)
            .expect("a packed matrix unpacks to its own shape")
    }

    /// Decodes row r into `out` (`cols` values), with the same f32 arithmetic as
    /// `QuantMatrix::decode_row_range`.
    pub fn decode_row(&self, r: usize, out: &mut [f32]) {
        let mut codes = vec![];
        let bv = block_values(self.format);
        for (k, o) in out[..self.cols].chunks_exact_mut(bv).enumerate() {
            decode_block(self.format, &self.ggml_block(r, k), &mut codes, o);
        }
    }
}

/// The activations the packed kernels read, one per row of `x` (`cols` wide): int8 per 32
/// values in natural order (the tiles absorb the code order), with d, d·Σq and Σq per block.
/// A prefill-sized batch is quantised in parallel, rows split over the team (serial, this was
/// 6% of a 512-token SmolLM2 prefill with the other thread idle).
/// The rows go into `acts`' buffers (kept from call to call by `with_act_buffers`).
fn quantize_rows(x: &[f32], cols: usize, isa: Isa, acts: &mut Vec<Q8Activation>) {
    let plan = BlockPlan::for_format(WeightFormat::Q8_0).expect("q8_0 has a plan");
    let rows = x.len() / cols;
    acts.resize_with(rows, Q8Activation::empty);
    let quantize = |r: usize, act: &mut Q8Activation| {
        act_q8::quantize_activation_into(&plan, &x[r * cols..(r + 1) * cols], isa, act)
    };
    if rows < QUANTIZE_PARALLEL_ROWS {
        acts.iter_mut()
            .enumerate()
            .for_each(|(r, a)| quantize(r, a));
        return;
    }
    team::for_each_chunk_mut(acts, QUANTIZE_PARALLEL_ROWS, |t, part| {
        for (i, a) in part.iter_mut().enumerate() {
            quantize(t * QUANTIZE_PARALLEL_ROWS + i, a);
        }
    });
}

/// One call's Q8 activations: a row each, and the pass-sized groups the vector tiers read.
#[derive(Default)]
struct ActBuffers {
    rows: Vec<Q8Activation>,
    groups: Vec<ActGroup>,
}

thread_local! {
    /// The activation buffers of this thread's last `matmul` (a decode step's ~200 products
    /// reuse them instead of allocating four vectors per row).
    static ACT_BUFFERS: std::cell::RefCell<ActBuffers> = std::cell::RefCell::new(ActBuffers::default());
}

/// `f` with this thread's activation buffers, or fresh ones where they are in use (a
/// `matmul` inside a `matmul`'s task).
fn with_act_buffers<R>(f: impl FnOnce(&mut ActBuffers) -> R) -> R {
    ACT_BUFFERS.with(|b| match b.try_borrow_mut() {
        Ok(mut mine) => f(&mut mine),
        Err(_) => f(&mut ActBuffers::default()),
    })
}

/// Rows per task of the parallel activation quantisation (and the batch from which it runs
/// in parallel).
const QUANTIZE_PARALLEL_ROWS: usize = 16;

/// Y = X · Wᵀ (X: batch × cols, Y: batch × rows) with int8 activations on packed tiles, at
/// tier `isa` (resolved by the caller on its own thread); a tier this CPU lacks is an error,
/// never executed.
pub fn matmul(w: &PackedMatrix, x: &[f32], batch: usize, y: &mut [f32], isa: Isa) -> Result<()> {
    let isa = isa
        .require()
        .map_err(|e| KernelError::Unsupported(format!("packed matmul: {e}")))?;
    if batch == 0 || x.len() != batch * w.cols || y.len() != batch * w.rows {
        return Err(KernelError::BadBuffer(format!(
            "packed matmul of {}×{} weights with batch {batch}: x has {} values, y {}",
            w.rows,
            w.cols,
            x.len(),
            y.len()
        )));
    }
    if block_values(w.format) == SUPER {
        let quantize = |row: &[f32]| crate::act_q8k::quantize_at(row, isa);
        let acts = Acts::Q8K(in_parallel(x, w.cols, quantize));
        run_tiles(w, &acts, batch, y, isa);
    } else {
        with_act_buffers(|buf| {
            quantize_rows(x, w.cols, isa, &mut buf.rows);
            let groups = if isa.has_avx2() {
                // The vector tiers read each pass's activations interleaved by block.
                let pass = pass(w.format, isa);
                let n = batch.div_ceil(pass);
                if buf.groups.len() < n {
                    buf.groups.resize_with(n, ActGroup::default);
                }
                for (g, rows) in buf.groups.iter_mut().zip(buf.rows.chunks(pass)) {
                    g.fill(rows, w.blocks(), code_offset(w.format));
                }
                &buf.groups[..n]
            } else {
                &[]
            };
            run_tiles(w, &Acts::Q8(&buf.rows, groups), batch, y, isa)
        });
    }
    Ok(())
}

/// The offset the tile kernels take off a 32-value format's codes: Q4_0's 8 and Q5_0's 16
/// (stored unsigned), Q8_0's and IQ4_NL's 128 (flipped to unsigned for the VNNI kernel; the
/// AVX2 one multiplies signed values and reads no offset), none for Q4_1 and Q5_1 (their
/// minimum is separate).
fn code_offset(format: WeightFormat) -> i32 {
    match format {
        WeightFormat::Q4_0 => 8,
        WeightFormat::Q5_0 => 16,
        WeightFormat::Q8_0 | WeightFormat::IQ4_NL => 128,
        _ => 0,
    }
}

/// Every tile against every activation, tiles split over the team. A task holds the sums of
/// up to `SPAN` activations for one tile; with more activations than one pass takes, the tile
/// goes in pieces of `piece_blocks` blocks and every pass runs over a piece before the next
/// (GEMM's k-blocking), so the piece is read from L1 by every pass after the first. One pass
/// per whole tile read a `ffn_down` tile (44 KB of Q4_0 at 4864 columns) from L2 again per
/// pass: Qwen2.5-0.5B's batch 16 at AVX2 (4 passes) decoded slower than batch 8.
fn run_tiles(w: &PackedMatrix, acts: &Acts, batch: usize, y: &mut [f32], isa: Isa) {
    // A decode or verification step's few activations take a task's sums of 8 (512 bytes
    // made zero per task, not SPAN's 4 KB: a 49152-row output layer has 1536 tasks).
    if batch <= SMALL_SPAN {
        run_tiles_in::<SMALL_SPAN>(w, acts, batch, y, isa)
    } else {
        run_tiles_in::<SPAN>(w, acts, batch, y, isa)
    }
}

/// `run_tiles` with the sums of up to `S` activations a task (S: a multiple of every pass).
fn run_tiles_in<const S: usize>(
    w: &PackedMatrix,
    acts: &Acts,
    batch: usize,
    y: &mut [f32],
    isa: Isa,
) {
    let tiles = w.tiles();
    let out = SharedOut(y.as_mut_ptr(), y.len());
    let pass = pass(w.format, isa);
    team::parallel_for(tiles.div_ceil(TASK_TILES), |task| {
        let out = &out;
        let mut sums = [[0.0f32; TILE]; S];
        for t in task * TASK_TILES..((task + 1) * TASK_TILES).min(tiles) {
            let rows = TILE.min(w.rows - t * TILE);
            for s0 in (0..batch).step_by(S) {
                let span = S.min(batch - s0);
                // Zero on entry: the array starts so, and each row used is zeroed again as it
                // is written out below (a `fill` here was a libc memset call per tile).
                let sums = &mut sums[..span];
                match acts {
                    Acts::Q8(rows, groups) => {
                        let nb = w.blocks();
                        let piece = if span > pass {
                            piece_blocks(w.format)
                        } else {
                            nb
                        };
                        for k0 in (0..nb).step_by(piece) {
                            let ks = k0..(k0 + piece).min(nb);
                            for p0 in (0..span).step_by(pass) {
                                let n = pass.min(span - p0);
                                tile_dot_pass(
                                    w,
                                    t,
                                    ks.clone(),
                                    &rows[s0 + p0..][..n],
                                    groups.get((s0 + p0) / pass),
                                    &mut sums[p0..p0 + n],
                                    isa,
                                );
                            }
                        }
                    }
                    Acts::Q8K(a) => {
                        // As the 32-value tiles: with more activations than a pass takes,
                        // the tile goes in pieces, every pass over a piece while it is in L1.
                        let (codes, scales) = (w.codes(t, 0), w.scales(t, 0));
                        let (f, nb, pass) = (w.format, w.blocks(), crate::packed_q4k::k_pass(isa));
                        let piece = if span > pass { piece_blocks(f) } else { nb };
                        for k0 in (0..nb).step_by(piece) {
                            let ks = k0..(k0 + piece).min(nb);
                            for p0 in (0..span).step_by(pass) {
                                let n = pass.min(span - p0);
                                crate::packed_q4k::tile_dot(
                                    f,
                                    codes,
                                    scales,
                                    ks.clone(),
                                    &a[s0 + p0..s0 + p0 + n],
                                    &mut sums[p0..p0 + n],
                                    isa,
                                );
                            }
                        }
                    }
                }
                for (b, vals) in sums.iter_mut().enumerate() {
                    let at = (s0 + b) * w.rows + t * TILE;
                    // SAFETY: tile t's rows of each output row are written by this task only.
                    unsafe {
                        if rows == TILE {
                            out.write_tile(at, vals)
                        } else {
                            out.write(at, &vals[..rows])
                        }
                    };
                    *vals = [0.0; TILE];
                }
            }
        }
    });
}

/// Most activations whose sums a task holds for one tile (a multiple of every pass size).
const SPAN: usize = 64;

/// The sums a task holds when a call has at most this many activations (a multiple of every
/// pass size).
const SMALL_SPAN: usize = 8;

/// Code and scale bytes of one piece of a tile in a multi-pass product: small enough to stay
/// in L1 beside a pass's activations.
const PIECE_BYTES: usize = 4096;

/// Tile-blocks per piece of a tile in a multi-pass product.
fn piece_blocks(format: WeightFormat) -> usize {
    (PIECE_BYTES / tile_block_bytes(format)).max(1)
}

/// The quantised activations of one call: Q8_0-style per 32 values (a row each, and on the
/// vector tiers each pass's rows as one `ActGroup`), or Q8_K for the K-quant tiles.
enum Acts<'a> {
    Q8(&'a [Q8Activation], &'a [ActGroup]),
    Q8K(Vec<crate::act_q8k::Q8KActivation>),
}

/// `quantize` of every `cols`-wide row of `x`, rows split over the team for a prompt-sized
/// batch (the caller's tier passed in: team workers run at the leader's tier).
fn in_parallel<A: Send>(x: &[f32], cols: usize, quantize: impl Fn(&[f32]) -> A + Sync) -> Vec<A> {
    let rows = x.len() / cols;
    if rows < QUANTIZE_PARALLEL_ROWS {
        return x.chunks(cols).map(&quantize).collect();
    }
    let mut acts: Vec<Option<A>> = (0..rows).map(|_| None).collect();
    team::for_each_chunk_mut(&mut acts, QUANTIZE_PARALLEL_ROWS, |t, part| {
        for (i, a) in part.iter_mut().enumerate() {
            let r = t * QUANTIZE_PARALLEL_ROWS + i;
            *a = Some(quantize(&x[r * cols..(r + 1) * cols]));
        }
    });
    acts.into_iter()
        .map(|a| a.expect("every row quantised"))
        .collect()
}

/// The output of `matmul`, shared by tasks that write disjoint ranges.
struct SharedOut(*mut f32, usize);
unsafe impl Sync for SharedOut {}
impl SharedOut {
    /// # Safety
    /// No other task writes `at..at + vals.len()`.
    unsafe fn write(&self, at: usize, vals: &[f32]) {
        assert!(at + vals.len() <= self.1);
        std::ptr::copy_nonoverlapping(vals.as_ptr(), self.0.add(at), vals.len());
    }

    /// `write` of a whole tile's row: a fixed-size store the compiler inlines (the
    /// variable-length copy was a libc memcpy call per tile and activation, ~100,000 an
    /// 8-token SmolLM2 step).
    ///
    /// # Safety
    /// As `write`.
    unsafe fn write_tile(&self, at: usize, vals: &[f32; TILE]) {
        assert!(at + TILE <= self.1);
        std::ptr::write_unaligned(self.0.add(at) as *mut [f32; TILE], *vals);
    }
}

/// out[b][r] += Σ over the tile-blocks in `blocks` of row 16t + r · activation b, for up to
/// `pass(format, isa)` activations: on a vector tier from `group` (the same activations
/// interleaved, which the vector kernels read), on the portable tier from `acts`.
fn tile_dot_pass(
    w: &PackedMatrix,
    t: usize,
    blocks: std::ops::Range<usize>,
    acts: &[Q8Activation],
    group: Option<&ActGroup>,
    out: &mut [[f32; TILE]],
    isa: Isa,
) {
    assert!(blocks.end <= w.blocks() && out.len() == acts.len());
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        let group = group.expect("the vector tiers' activation groups");
        let (codes, scales) = (w.codes(t, 0).as_ptr(), w.scales(t, 0).as_ptr());
        // SAFETY: the tier was allowed on the caller's thread, so the CPU has its features; the
        // tile holds `w.blocks()` ≥ `blocks.end` tile-blocks and the group covers them
        // (checked by the kernels).
        unsafe {
            macro_rules! go {
                ($kernel:path, $n:literal) => {{
                    let out: &mut [[f32; TILE]; $n] = out.try_into().expect("a pass's sums");
                    $kernel(w.format, codes, scales, blocks, group, out)
                }};
            }
            use crate::avx2::packed::tile_dot as avx2;
            use crate::avx512::packed::tile_dot as avx512;
            if isa.has_avx512_vnni() {
                match acts.len() {
                    1 => go!(avx512::<1>, 1),
                    2 => go!(avx512::<2>, 2),
                    3 => go!(avx512::<3>, 3),
                    4 => go!(avx512::<4>, 4),
                    5 => go!(avx512::<5>, 5),
                    6 => go!(avx512::<6>, 6),
                    7 => go!(avx512::<7>, 7),
                    _ => go!(avx512::<8>, 8),
                }
            } else {
                match acts.len() {
                    1 => go!(avx2::<1>, 1),
                    2 => go!(avx2::<2>, 2),
                    3 => go!(avx2::<3>, 3),
                    4 => go!(avx2::<4>, 4),
                    5 => go!(avx2::<5>, 5),
                    6 => go!(avx2::<6>, 6),
                    7 => go!(avx2::<7>, 7),
                    _ => go!(avx2::<8>, 8),
                }
            }
        }
        return;
    }
    let _ = (isa, group);
    let (codes, scales) = (w.codes(t, 0), w.scales(t, 0));
    macro_rules! portable {
        ($n:literal) => {{
            let a: [&Q8Activation; $n] = std::array::from_fn(|i| &acts[i]);
            let out: &mut [[f32; TILE]; $n] = out.try_into().expect("a pass's sums");
            crate::packed_portable::tile_dot_q8(w.format, codes, scales, blocks, a, out)
        }};
    }
    match acts.len() {
        1 => portable!(1),
        2 => portable!(2),
        3 => portable!(3),
        _ => portable!(4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WeightDist;

    #[test]
    fn a_tier_the_cpu_lacks_or_the_cap_excludes_is_an_error_not_executed() {
        let m = QuantMatrix::quantize(WeightFormat::Q4_0, 16, 64, &[0.5; 1024]).unwrap();
        let p = PackedMatrix::pack(&m).unwrap();
        let x = vec![1.0f32; 64];
        let mut y = vec![f32::NAN; 16];
        for isa in Isa::ALL {
            let r = matmul(&p, &x, 1, &mut y, isa);
            assert_eq!(r.is_ok(), isa.supported(), "{isa}: {r:?}");
        }
        // Under a portable cap on this thread, the vector tiers are refused.
        kernel_cpu::isa::with_isa(Isa::Portable, || {
            for isa in Isa::ALL.into_iter().filter(|&i| i != Isa::Portable) {
                let e = matmul(&p, &x, 1, &mut y, isa).unwrap_err().to_string();
                assert!(e.contains("cap") || e.contains("lacks"), "{isa}: {e}");
            }
        })
        .unwrap();
    }

    /// A packed `rows × cols` matrix of `name` (outlier channels, seeded) and its decoded rows.
    fn packed_and_decoded(
        name: &str,
        rows: usize,
        cols: usize,
        seed: u64,
    ) -> (PackedMatrix, Vec<f32>) {
        let f = WeightFormat::parse(name).unwrap();
        let w = WeightDist::Outliers {
            channels: 2,
            scale: 8.0,
        }
        .sample(rows, cols, seed);
        let m = QuantMatrix::quantize(f, rows, cols, &w).unwrap();
        let mut dec = vec![0.0f32; rows * cols];
        for (r, row) in dec.chunks_exact_mut(cols).enumerate() {
            m.decode_row_range(r, 0, row, &mut vec![]);
        }
        (PackedMatrix::pack(&m).unwrap(), dec)
    }

    /// `y` (batch × rows) within f32 rounding of the f64 product of the decoded weights with
    /// the activations as the kernel sees them (`seen`, batch × cols).
    fn assert_near_f64_product(y: &[f32], dec: &[f32], seen: &[f32], cols: usize, what: &str) {
        let rows = dec.len() / cols;
        for (b, (yb, xb)) in y.chunks(rows).zip(seen.chunks(cols)).enumerate() {
            for (r, wr) in dec.chunks(cols).enumerate() {
                let want: f64 = wr.iter().zip(xb).map(|(a, c)| *a as f64 * *c as f64).sum();
                let mag: f64 = wr
                    .iter()
                    .zip(xb)
                    .map(|(a, c)| (*a as f64 * *c as f64).abs())
                    .sum();
                let got = yb[r] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * mag + 1e-30,
                    "{what} [{b}][{r}]: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn every_batch_from_1_to_64_and_past_a_span_matches_the_f64_product_at_every_tier() {
        // Each pass size's tails (AVX-512 takes 8 activations a pass, AVX2 8 of Q4 and 4 of
        // Q5_0 / Q5_1 / IQ4_NL / Q8_0, portable 4), with a partial last tile, tiles in pieces
        // (17 blocks: 14 + 3 of Q4_0 and IQ4_NL, 11 + 6 of Q5_0, 10 + 7 of Q5_1, 7 + 7 + 3 of
        // Q8_0) and batches past one task's span of 64; the f64 product of the decoded weights
        // with the activation as the kernel sees it (d·q) is the reference.
        let (rows, cols) = (40, 17 * 32);
        assert!(piece_blocks(WeightFormat::Q4_1) < 17 && piece_blocks(WeightFormat::Q8_0) < 8);
        for name in ["q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q8_0"] {
            let (p, dec) = packed_and_decoded(name, rows, cols, 7);
            let x: Vec<f32> = WeightDist::Gaussian.sample(131, cols, 11);
            let seen: Vec<f32> = x
                .chunks(cols)
                .flat_map(act_q8::activation_as_seen)
                .collect();
            for isa in kernel_cpu::isa::runnable() {
                let mut alone = vec![f32::NAN; 131 * rows];
                for (xb, yb) in x.chunks(cols).zip(alone.chunks_mut(rows)) {
                    matmul(&p, xb, 1, yb, isa).unwrap();
                }
                for batch in (1..=64).chain([65, 72, 131]) {
                    let mut y = vec![f32::NAN; batch * rows];
                    matmul(&p, &x[..batch * cols], batch, &mut y, isa).unwrap();
                    let what = format!("{name} {isa} batch {batch}");
                    // Passes and pieces chain one accumulation: each activation's bits are
                    // those it gets alone.
                    assert!(
                        y.iter()
                            .zip(&alone)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}: an activation differs from it alone"
                    );
                    assert_near_f64_product(&y, &dec, &seen[..batch * cols], cols, &what);
                }
            }
        }
    }

    #[test]
    fn k_quant_tiles_in_pieces_match_the_f64_product_and_one_activation_bit_for_bit() {
        // Q4_K, Q5_K and Q6_K over 3 super-blocks (3 pieces once a batch takes more than one
        // pass), a partial last tile, batches 1..=16 and past a span, at every tier: within
        // f32 rounding of the f64 product, and each activation's sums the bits it gets alone
        // (the pieces chain one accumulation, so batching changes nothing).
        let (rows, cols) = (40, 3 * SUPER);
        assert_eq!(piece_blocks(WeightFormat::Q4_K), 1);
        for name in ["q4_k", "q5_k", "q6_k"] {
            let (p, dec) = packed_and_decoded(name, rows, cols, 5);
            let x: Vec<f32> = WeightDist::Gaussian.sample(65, cols, 13);
            let seen: Vec<f32> = x
                .chunks(cols)
                .flat_map(crate::act_q8k::activation_as_seen)
                .collect();
            for isa in kernel_cpu::isa::runnable() {
                let alone: Vec<Vec<f32>> = (0..65)
                    .map(|b| {
                        let mut y = vec![f32::NAN; rows];
                        matmul(&p, &x[b * cols..(b + 1) * cols], 1, &mut y, isa).unwrap();
                        y
                    })
                    .collect();
                for batch in (1..=16).chain([33, 65]) {
                    let mut y = vec![f32::NAN; batch * rows];
                    matmul(&p, &x[..batch * cols], batch, &mut y, isa).unwrap();
                    for (b, got) in y.chunks(rows).enumerate() {
                        assert!(
                            got.iter()
                                .zip(&alone[b])
                                .all(|(a, c)| a.to_bits() == c.to_bits()),
                            "{name} {isa} batch {batch}: activation {b} differs from it alone"
                        );
                    }
                    let what = format!("{name} {isa} batch {batch}");
                    assert_near_f64_product(&y, &dec, &seen[..batch * cols], cols, &what);
                }
            }
        }
    }

    #[test]
    fn the_largest_codes_against_the_largest_activations_stay_exact_at_every_tier() {
        // Every code at its largest (all code bits set; Q8_0 at 127) with unit f16 scales,
        // against activations quantised to ±127 everywhere: the integer sums at their bound
        // (an AVX2 i16 sum over 8 k-steps of 5-bit codes would wrap: 8 · 2 · 31 · 127 > 32767),
        // batch 1 and a full pass, within f32 rounding of the f64 product.
        for f in PACKABLE {
            let (rows, cols) = (16, 2 * block_values(f));
            let mut block = vec![0xFFu8; f.block_bytes()];
            let one = [0x00, 0x3C]; // f16 1.0
            match f {
                WeightFormat::Q6_K => block[208..210].copy_from_slice(&one),
                WeightFormat::Q8_0 => {
                    block[2..].fill(0x7F);
                    block[..2].copy_from_slice(&one);
                }
                _ => {
                    for h in 0..if f.header_bytes() >= 4 { 2 } else { 1 } {
                        block[2 * h..2 * h + 2].copy_from_slice(&one);
                    }
                }
            }
            let bytes = block.repeat(rows * cols / block_values(f));
            let m = QuantMatrix::from_bytes(f, rows, cols, bytes).unwrap();
            let mut dec = vec![0.0f32; rows * cols];
            for (r, row) in dec.chunks_exact_mut(cols).enumerate() {
                m.decode_row_range(r, 0, row, &mut vec![]);
            }
            let p = PackedMatrix::pack(&m).unwrap();
            for sign in [1.0f32, -1.0] {
                let x = vec![sign; 8 * cols];
                let seen = crate::matvec::activation_as_seen(
                    crate::MatVecVariant::Packed(None),
                    f,
                    &x,
                    cols,
                );
                for isa in kernel_cpu::isa::runnable() {
                    for batch in [1, 8] {
                        let mut y = vec![f32::NAN; batch * rows];
                        matmul(&p, &x[..batch * cols], batch, &mut y, isa).unwrap();
                        let what = format!("{f} {isa} batch {batch} sign {sign}");
                        assert_near_f64_product(&y, &dec, &seen[..batch * cols], cols, &what);
                    }
                }
            }
        }
    }

    #[test]
    fn the_errors_name_every_packable_format_as_a_list() {
        assert_eq!(
            packable_names(),
            "q4_0, q4_1, q5_0, q5_1, iq4_nl, q8_0, q4_k, q5_k and q6_k"
        );
        let q2k = QuantMatrix::from_bytes(
            WeightFormat::Q2_K,
            1,
            256,
            vec![0; WeightFormat::Q2_K.block_bytes()],
        )
        .unwrap();
        let e = PackedMatrix::pack(&q2k).unwrap_err().to_string();
        assert!(
            e.contains("take q4_0, q4_1,") && e.ends_with("q6_k, not q2_k"),
            "{e}"
        );
    }

    #[test]
    fn pack_unpack_and_rows_round_trip() {
        for f in PACKABLE {
            let cols = 3 * block_values(f);
            for rows in [1usize, 15, 16, 17, 40] {
                let w = WeightDist::Outliers {
                    channels: 3,
                    scale: 20.0,
                }
                .sample(rows, cols, rows as u64);
                let m = QuantMatrix::quantize(f, rows, cols, &w).unwrap();
                let p = PackedMatrix::pack(&m).unwrap();
                assert_eq!(
                    p.bytes().len(),
                    (rows.div_ceil(16) * 3 * tile_block_bytes(f)).next_multiple_of(64)
                );
                assert_eq!(p.bytes().as_ptr() as usize % 64, 0);
                assert_eq!(p.unpack(), m, "{f} {rows}");
                let mut a = vec![0.0; cols];
                let mut b = vec![0.0; cols];
                for r in 0..rows {
                    p.decode_row(r, &mut a);
                    m.decode_row_range(r, 0, &mut b, &mut vec![]);
                    assert_eq!(a, b);
                }
            }
        }
        let m = QuantMatrix::quantize(WeightFormat::parse("sym4g32").unwrap(), 2, 32, &[0.5; 64])
            .unwrap();
        assert!(PackedMatrix::pack(&m).is_err());
    }
}
