//! Where one ggml block's codes and scales go in a 16-row tile-block of `crate::packed` (the
//! layout is described there, its offsets are in `packed_layout`), and back: `put_block`
//! writes row r's block into a tile-block, `get_block` rebuilds that block's ggml bytes, so
//! packing is exact (`PackedMatrix::unpack` gives the file's bytes back).

use crate::format::WeightFormat;
use crate::packed_layout::{
    code_bytes, scale_bytes, BLOCK, Q4K_MN, Q4K_SC, Q5K_SUB, Q5_HI, Q6K_HI, Q6K_SC, Q6K_SUB, SUPER,
    TILE,
};

/// Writes 32 codes (values 0..15) of row r into a Q4_0-style sub-tile of 256 bytes: group j,
/// byte 4r + b = code 8j + b | code 8j + 4 + b << 4 (k-steps 2j and 2j + 1).
fn put_nibbles(codes: &mut [u8], r: usize, c: &[u8]) {
    for j in 0..4 {
        for b in 0..4 {
            codes[64 * j + 4 * r + b] = (c[8 * j + b] & 0x0F) | (c[8 * j + 4 + b] & 0x0F) << 4;
        }
    }
}

/// The 32 codes of row r in a Q4_0-style sub-tile.
fn get_nibbles(codes: &[u8], r: usize) -> [u8; BLOCK] {
    let mut c = [0u8; BLOCK];
    for j in 0..4 {
        for b in 0..4 {
            let byte = codes[64 * j + 4 * r + b];
            c[8 * j + b] = byte & 0x0F;
            c[8 * j + 4 + b] = byte >> 4;
        }
    }
    c
}

/// The 256 codes (0..15) of a ggml Q4_K block, in value order (byte 16 + 32h + i holds value
/// 64h + i in its low nibble and 64h + 32 + i in its high one).
fn q4k_codes(bytes: &[u8]) -> [u8; SUPER] {
    let mut c = [0u8; SUPER];
    for h in 0..4 {
        for i in 0..32 {
            let byte = bytes[16 + 32 * h + i];
            c[64 * h + i] = byte & 0x0F;
            c[64 * h + 32 + i] = byte >> 4;
        }
    }
    c
}

/// The 32 codes (0..31) of a ggml Q5_0 / Q5_1 block whose `qh` starts at `bytes[0]`: nibble j
/// of the 16 code bytes after it (low nibbles first) with bit j of the little-endian `qh` as
/// the 5th bit.
fn q5_codes(bytes: &[u8]) -> [u8; BLOCK] {
    let qh = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    std::array::from_fn(|j| {
        let nibble = (bytes[4 + j % 16] >> (4 * (j / 16))) & 0x0F;
        nibble | (((qh >> j) & 1) as u8) << 4
    })
}

/// Writes 32 codes (0..31) of row r into a Q5_0-style sub-tile (`Q5_HI` + 64 bytes): the low
/// 4 bits as `put_nibbles`, the 5th bits in the plane (byte 4r + b, bit s = code 4s + b's).
fn put_q5_sub(codes: &mut [u8], r: usize, c: &[u8]) {
    put_nibbles(codes, r, c);
    for b in 0..4 {
        codes[Q5_HI + 4 * r + b] = (0..8).map(|s| (c[4 * s + b] >> 4) << s).sum();
    }
}

/// The 32 codes (0..31) of row r in a Q5_0-style sub-tile.
fn get_q5_sub(codes: &[u8], r: usize) -> [u8; BLOCK] {
    let mut c = get_nibbles(codes, r);
    for (v, cv) in c.iter_mut().enumerate() {
        *cv |= ((codes[Q5_HI + 4 * r + v % 4] >> (v / 4)) & 1) << 4;
    }
    c
}

/// The 256 codes (0..31) of a ggml Q5_K block, in value order (`kquants::q4_k`'s layout:
/// byte 48 + 32h + i holds value 64h + i low and 64h + 32 + i high, whose 5th bits are bits
/// 2h and 2h + 1 of byte 16 + i).
fn q5k_codes(bytes: &[u8]) -> [u8; SUPER] {
    let mut c = [0u8; SUPER];
    for h in 0..4 {
        for i in 0..32 {
            let (byte, high) = (bytes[48 + 32 * h + i], bytes[16 + i] >> (2 * h));
            c[64 * h + i] = (byte & 0x0F) | (high & 1) << 4;
            c[64 * h + 32 + i] = (byte >> 4) | (high & 2) << 3;
        }
    }
    c
}

/// The 256 codes (0..63) of a ggml Q6_K block, in value order (`kquants::q6_k`'s layout).
fn q6k_codes(bytes: &[u8]) -> [u8; SUPER] {
    let mut c = [0u8; SUPER];
    for h in 0..2 {
        for i in 0..32 {
            let (l0, l1, hb) = (
                bytes[64 * h + i],
                bytes[64 * h + 32 + i],
                bytes[128 + 32 * h + i],
            );
            let v = 128 * h + i;
            c[v] = (l0 & 0xF) | (hb & 3) << 4;
            c[v + 32] = (l1 & 0xF) | ((hb >> 2) & 3) << 4;
            c[v + 64] = (l0 >> 4) | ((hb >> 4) & 3) << 4;
            c[v + 96] = (l1 >> 4) | ((hb >> 6) & 3) << 4;
        }
    }
    c
}

/// The 32 codes (0..15, or Q8_0's two's complement bytes) of a Q4_0, Q4_1 or Q8_0 block.
fn block_codes(format: WeightFormat, bytes: &[u8]) -> [u8; BLOCK] {
    let mut c = [0u8; BLOCK];
    match format {
        WeightFormat::Q8_0 => c.copy_from_slice(&bytes[2..34]),
        _ => {
            let qs = &bytes[format.header_bytes()..];
            for j in 0..16 {
                c[j] = qs[j] & 0x0F;
                c[j + 16] = qs[j] >> 4;
            }
        }
    }
    c
}

/// Copies the f16 at `from[..2]` to row r's slot of the 16 consecutive f16 at `to[at..]`.
fn put_f16_row(to: &mut [u8], at: usize, r: usize, from: &[u8]) {
    to[at + 2 * r..at + 2 * r + 2].copy_from_slice(&from[..2]);
}

/// Writes row r's ggml block `block` into the tile-block `codes` / `scales` (zeroed before
/// the first row is written).
pub(crate) fn put_block(
    format: WeightFormat,
    block: &[u8],
    r: usize,
    codes: &mut [u8],
    scales: &mut [u8],
) {
    debug_assert!(codes.len() >= code_bytes(format) && scales.len() >= scale_bytes(format));
    match format {
        WeightFormat::Q4_K | WeightFormat::Q5_K => {
            let five = format == WeightFormat::Q5_K;
            let c = if five {
                q5k_codes(block)
            } else {
                q4k_codes(block)
            };
            for j in 0..8 {
                let cj = &c[32 * j..32 * j + 32];
                if five {
                    put_q5_sub(&mut codes[Q5K_SUB * j..], r, cj);
                } else {
                    put_nibbles(&mut codes[256 * j..], r, cj);
                }
                let (sc, mn) = crate::kquants::get_scale_min_k4(j, &block[4..16]);
                scales[Q4K_SC + TILE * j + r] = sc;
                scales[Q4K_MN + TILE * j + r] = mn;
            }
            put_f16_row(scales, 0, r, &block[0..2]);
            put_f16_row(scales, 32, r, &block[2..4]);
        }
        WeightFormat::Q5_0 | WeightFormat::Q5_1 => {
            // d (and Q5_1's m) as 16 consecutive f16 each, then qh and the nibbles.
            let header = format.header_bytes();
            put_q5_sub(codes, r, &q5_codes(&block[header..]));
            for h in 0..header / 2 {
                put_f16_row(scales, 32 * h, r, &block[2 * h..]);
            }
        }
        WeightFormat::Q6_K => {
            let c = q6k_codes(block);
            for j in 0..8 {
                let sub = &mut codes[Q6K_SUB * j..Q6K_SUB * (j + 1)];
                put_nibbles(sub, r, &c[32 * j..32 * j + 32]);
                for g in 0..2 {
                    for b in 0..4 {
                        sub[Q6K_HI + 64 * g + 4 * r + b] = (0..4)
                            .map(|t| (c[32 * j + 4 * (4 * g + t) + b] >> 4) << (2 * t))
                            .sum();
                    }
                }
            }
            for (g, &s) in block[192..208].iter().enumerate() {
                scales[Q6K_SC + TILE * g + r] = s;
            }
            put_f16_row(scales, 0, r, &block[208..210]);
        }
        WeightFormat::Q8_0 => {
            let c = block_codes(format, block);
            for s in 0..8 {
                codes[64 * s + 4 * r..64 * s + 4 * r + 4].copy_from_slice(&c[4 * s..4 * s + 4]);
            }
            put_f16_row(scales, 0, r, block);
        }
        _ => {
            put_nibbles(codes, r, &block_codes(format, block));
            // d, then Q4_1's m, each as 16 consecutive f16.
            for h in 0..format.header_bytes() / 2 {
                put_f16_row(scales, 32 * h, r, &block[2 * h..]);
            }
        }
    }
}

/// The f16 of row r among the 16 consecutive f16 at `from[at..]`.
fn f16_row(from: &[u8], at: usize, r: usize) -> [u8; 2] {
    [from[at + 2 * r], from[at + 2 * r + 1]]
}

/// The ggml bytes of row r's block in the tile-block `codes` / `scales`.
pub(crate) fn get_block(format: WeightFormat, r: usize, codes: &[u8], scales: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; format.block_bytes()];
    match format {
        WeightFormat::Q4_K | WeightFormat::Q5_K => {
            out[0..2].copy_from_slice(&f16_row(scales, 0, r));
            out[2..4].copy_from_slice(&f16_row(scales, 32, r));
            let ls: [u8; 8] = std::array::from_fn(|j| scales[Q4K_SC + TILE * j + r]);
            let lm: [u8; 8] = std::array::from_fn(|j| scales[Q4K_MN + TILE * j + r]);
            crate::kquants::put_scale_min_k4(&ls, &lm, &mut out[4..16]);
            let mut c = [0u8; SUPER];
            for j in 0..8 {
                let cj = if format == WeightFormat::Q5_K {
                    get_q5_sub(&codes[Q5K_SUB * j..], r)
                } else {
                    get_nibbles(&codes[256 * j..], r)
                };
                c[32 * j..32 * j + 32].copy_from_slice(&cj);
            }
            if format == WeightFormat::Q5_K {
                crate::kquants::q4_k::put_q5k_codes(&c, &mut out);
            } else {
                crate::kquants::q4_k::put_q4k_codes(&c, &mut out);
            }
        }
        WeightFormat::Q5_0 | WeightFormat::Q5_1 => {
            let header = format.header_bytes();
            for h in 0..header / 2 {
                out[2 * h..2 * h + 2].copy_from_slice(&f16_row(scales, 32 * h, r));
            }
            crate::ggml::put_q5(&get_q5_sub(codes, r), &mut out[header..]);
        }
        WeightFormat::Q6_K => {
            let mut c = [0u8; SUPER];
            for j in 0..8 {
                let sub = &codes[Q6K_SUB * j..Q6K_SUB * (j + 1)];
                let lo = get_nibbles(sub, r);
                for (i, &l) in lo.iter().enumerate() {
                    let (s, b) = (i / 4, i % 4);
                    let hi = sub[Q6K_HI + 64 * (s / 4) + 4 * r + b] >> (2 * (s % 4)) & 3;
                    c[32 * j + i] = l | hi << 4;
                }
            }
            crate::kquants::q6_k::put_codes(&c, &mut out);
            for g in 0..16 {
                out[192 + g] = scales[Q6K_SC + TILE * g + r];
            }
            out[208..210].copy_from_slice(&f16_row(scales, 0, r));
        }
        WeightFormat::Q8_0 => {
            out[0..2].copy_from_slice(&f16_row(scales, 0, r));
            for s in 0..8 {
                out[2 + 4 * s..2 + 4 * s + 4]
                    .copy_from_slice(&codes[64 * s + 4 * r..64 * s + 4 * r + 4]);
            }
        }
        _ => {
            for h in 0..format.header_bytes() / 2 {
                out[2 * h..2 * h + 2].copy_from_slice(&f16_row(scales, 32 * h, r));
            }
            let c = get_nibbles(codes, r);
            let qs = &mut out[format.header_bytes()..];
            for j in 0..16 {
                qs[j] = c[j] | c[j + 16] << 4;
            }
        }
    }
    out
}
