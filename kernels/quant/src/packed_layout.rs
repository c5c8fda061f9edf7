//! The byte layout of `crate::packed`'s 16-row tiles: rows per tile, values per tile-block,
//! and the code and scale bytes of each tile-block per format (Q4_K's unpacked 6-bit scales
//! and minimums at `Q4K_SC` / `Q4K_MN`). A leaf, so the tile kernels (`packed_q4k`,
//! `avx2::packed_q4k`) read the layout without importing the matrix that owns it.

use crate::format::WeightFormat;

/// Rows per tile.
pub const TILE: usize = 16;
/// Values per block of the 32-value formats (and per sub-block of Q4_K).
pub const BLOCK: usize = 32;
/// Values per Q4_K super-block.
pub const SUPER: usize = 256;

/// Values per tile-block of `format` (a block, or Q4_K's super-block).
pub const fn block_values(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q4_K => SUPER,
        _ => BLOCK,
    }
}
/// Code bytes of one tile-block.
pub const fn code_bytes(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q8_0 => 512,
        WeightFormat::Q4_K => 8 * 256,
        _ => 256,
    }
}

/// Scale bytes of one tile-block (16 f16 d, and for Q4_1 16 f16 m; Q4_K: d, dmin, then the
/// 8 × 16 scales and 8 × 16 minimums as bytes).
pub const fn scale_bytes(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q4_1 => 64,
        WeightFormat::Q4_K => 64 + 2 * 8 * TILE,
        _ => 32,
    }
}

/// Where Q4_K's scales and minimums start in a tile-block's scale bytes.
pub(crate) const Q4K_SC: usize = 64;
pub(crate) const Q4K_MN: usize = 64 + 8 * TILE;

/// Bytes of one tile-block (codes and scales).
pub const fn tile_block_bytes(format: WeightFormat) -> usize {
    code_bytes(format) + scale_bytes(format)
}
