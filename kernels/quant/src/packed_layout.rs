//! The byte layout of `crate::packed`'s 16-row tiles: rows per tile, values per tile-block,
//! and the code and scale bytes of each tile-block per format (Q4_K's unpacked 6-bit scales
//! and minimums at `Q4K_SC` / `Q4K_MN` (Q5_K's too), Q5_0's and Q5_1's 5th-bit plane at
//! `Q5_HI` (of each Q5_K sub-block of `Q5K_SUB` bytes), Q6_K's 2-bit plane at `Q6K_HI` of each
//! sub-block and its i8 scales at `Q6K_SC`). A leaf, so the tile kernels
//! (`packed_q4k`, `packed_portable`, `avx2::*`) read the layout without importing the matrix that
//! owns it.

use crate::format::WeightFormat;

/// Rows per tile.
pub const TILE: usize = 16;
/// Values per block of the 32-value formats (and per sub-block of Q4_K / Q6_K).
pub const BLOCK: usize = 32;
/// Values per K-quant super-block.
pub const SUPER: usize = 256;

/// Values per tile-block of `format` (a block, or a K-quant super-block).
pub const fn block_values(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K => SUPER,
        _ => BLOCK,
    }
}
/// Code bytes of one tile-block.
pub const fn code_bytes(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q8_0 => 512,
        WeightFormat::Q4_K => 8 * 256,
        // Q4_0-style nibbles, then the 5th bits: 16 rows × 32 bits.
        WeightFormat::Q5_0 | WeightFormat::Q5_1 => Q5_HI + 64,
        // Per sub-block of 32, a Q5_0 tile-block's codes.
        WeightFormat::Q5_K => 8 * Q5K_SUB,
        // Per sub-block of 32: Q4_0-style nibbles, then the top 2 bits: 16 rows × 64 bits.
        WeightFormat::Q6_K => 8 * Q6K_SUB,
        _ => 256,
    }
}

/// Scale bytes of one tile-block (16 f16 d, and for Q4_1 / Q5_1 16 f16 m; Q4_K / Q5_K: d,
/// dmin, then the 8 × 16 scales and 8 × 16 minimums as bytes; Q6_K: d, then the 16 × 16 i8
/// scales).
pub const fn scale_bytes(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q4_1 | WeightFormat::Q5_1 => 64,
        WeightFormat::Q4_K | WeightFormat::Q5_K => 64 + 2 * 8 * TILE,
        WeightFormat::Q6_K => 32 + 16 * TILE,
        _ => 32,
    }
}

/// Where Q4_K's scales and minimums start in a tile-block's scale bytes.
pub(crate) const Q4K_SC: usize = 64;
pub(crate) const Q4K_MN: usize = 64 + 8 * TILE;
/// Where Q5_0's and Q5_1's 5th-bit plane starts in a tile-block's code bytes (and in each of
/// Q5_K's sub-blocks): byte 4r + b, bit s holds the 5th bit of row r's value 4s + b (k-step s,
/// lane byte b).
pub(crate) const Q5_HI: usize = 256;
/// Code bytes of one Q5_K sub-block of 32 in a tile-block (a Q5_0 tile-block's codes).
pub(crate) const Q5K_SUB: usize = Q5_HI + 64;
/// Code bytes of one Q6_K sub-block of 32 in a tile-block, and where its 2-bit plane starts
/// in them: group g (k-steps 4g..4g + 4) is 64 bytes, byte 4r + b, bits 2t..2t + 2 holding
/// the top 2 bits of row r's value 4(4g + t) + b of the sub-block.
pub(crate) const Q6K_SUB: usize = 256 + 128;
pub(crate) const Q6K_HI: usize = 256;
/// Where Q6_K's i8 scales start in a tile-block's scale bytes: scale G (values 16G..16G + 16)
/// of row r at `Q6K_SC + TILE * G + r`.
pub(crate) const Q6K_SC: usize = 32;

/// Bytes of one tile-block (codes and scales).
pub const fn tile_block_bytes(format: WeightFormat) -> usize {
    code_bytes(format) + scale_bytes(format)
}
