//! ggml's K-quants (llama.cpp PR #1684, `ggml-quants.c` "2-6 bit quantization in
//! super-blocks"): 256-value super-blocks of 16 or 32-value sub-blocks, each sub-block's scale
//! (and minimum) stored as a small integer times one f16 super-block factor. One file per
//! format (Q4_K and Q5_K share theirs); this module holds what they share, ported from
//! `ggml-quants.c` with the same f32 operations in the same order: `nearest_int`, the scale
//! searches `make_qx_quants` (Q6_K), `make_q3_quants` (Q3_K) and `make_qkx2_quants` (Q2_K,
//! Q4_K, Q5_K), and the 6-bit scale/min packing of Q4_K/Q5_K (`get_scale_min_k4`).
//! llama-quantize without an importance matrix calls exactly these `*_ref` paths.

/// Q2_K: 2-bit codes, 4-bit scales and minimums per 16 values.
pub mod q2_k;
/// Q3_K: 3-bit codes (2 bits + a high-bit plane), 6-bit signed scales per 16 values.
pub mod q3_k;
/// Q4_K and Q5_K: 4/5-bit codes, 6-bit scales and minimums per 32 values.
pub mod q4_k;
/// Q6_K: 6-bit codes (4 + 2 bits), i8 scales per 16 values.
pub mod q6_k;
/// Q8_K: i8 codes, one f32 scale, i16 sums per 16 values.
pub mod q8_k;

/// Below this magnitude a group is all zero (`GROUP_MAX_EPS`).
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// The largest |x| the scale searches take: they form sums of x³-sized terms (weights x² or
/// |x|, times x and a code), which stay finite in f32 below ~4e11 for every search here.
/// Every f16-scaled format overflows its scale far below this (Q6_K, the widest, near
/// 2.7e8), so nothing storable is refused; above it ggml's arithmetic overflows and stores
/// garbage (often an all-zero block), which is refused instead.
pub const SEARCH_MAX: f32 = 1e11;

/// `Err(max |x|)` when a block is beyond what the searches compute in f32 (`SEARCH_MAX`).
pub fn searchable(x: &[f32]) -> Result<(), f32> {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if amax > SEARCH_MAX {
        Err(amax)
    } else {
        Ok(())
    }
}

/// Round to nearest by the float trick of ggml's `nearest_int` (exact for |f| ≤ 2^22; beyond,
/// the same wrapped value ggml gets, since its assert is compiled out).
#[inline]
pub fn nearest_int(f: f32) -> i32 {
    let val = f + 12582912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL)` (the path `quantize_row_q6_K_ref`
/// takes): a symmetric scale for codes −nmax..nmax−1 chosen among 19 trial scales by the
/// x²-weighted least squares fit; `l` gets the codes + nmax; returns the scale.
pub fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return 0.0;
    }
    let code = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let fit = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = code(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let iscale = -(nmax as f32) / max;
    for (li, &v) in l.iter_mut().zip(x) {
        *li = (code(iscale, v) + nmax) as i8;
    }
    let (sumlx, suml2) = fit(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = fit(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (code(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants(n, nmax, x, L, do_rmse = true)`: codes −nmax..nmax−1 from the value of
/// largest magnitude, then up to 5 rounds of moving single codes while the x²-weighted fit
/// improves; `l` gets the codes + nmax; returns the least-squares scale.
pub fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let old = *li as f32;
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *li as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for li in l[..x.len()].iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The search parameters of `make_qkx2_quants`.
pub struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    /// Absolute rather than squared errors.
    pub use_mad: bool,
}

/// `make_qkx2_quants`: an affine fit x ≈ scale·l − min with codes 0..=nmax over the range
/// [min(x, 0), max(x)], refined over `nstep + 1` trial scales by weighted least squares;
/// `l` gets the codes; returns (scale, min) with min ≥ 0 the subtracted offset.
pub fn make_qkx2_quants(p: &Qkx2, x: &[f32], weights: &[f32], l: &mut [u8]) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let nmax = p.nmax as f32;
    let err = |d: f32| if p.use_mad { d.abs() } else { d * d };
    let mut iscale = nmax / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax);
        l[i] = q as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax);
            laux[i] = q as u8;
            let (w, q) = (weights[i], q as f32);
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let big_d = sum_w * sum_l2 - sum_l * sum_l;
        if big_d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / big_d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / big_d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Scale and minimum j (0..8) of Q4_K/Q5_K's 12 packed bytes (`get_scale_min_k4`): j < 4 in
/// the low 6 bits of bytes j and j + 4; j ≥ 4 as a nibble of byte j + 4 with the top 2 bits
/// in the high bits of bytes j − 4 and j.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Packs 8 scales and 8 minimums (each ≤ 63) as `quantize_row_q4_K_ref` does.
pub fn put_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], q: &mut [u8]) {
    for j in 0..8 {
        if j < 4 {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            q[j - 4] |= (ls[j] >> 4) << 6;
            q[j] |= (lm[j] >> 4) << 6;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even_like_the_fpu() {
        for (f, want) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
        ] {
            assert_eq!(nearest_int(f), want, "{f}");
        }
        assert_eq!(nearest_int(4194303.0), 4194303);
        assert_eq!(nearest_int(-4194303.0), -4194303);
    }

    #[test]
    fn k4_scale_packing_round_trips_every_value() {
        for seed in 0..64u8 {
            let ls: [u8; 8] = std::array::from_fn(|j| (seed + 7 * j as u8) % 64);
            let lm: [u8; 8] = std::array::from_fn(|j| (seed * 3 + 11 * j as u8) % 64);
            let mut q = [0u8; 12];
            put_scale_min_k4(&ls, &lm, &mut q);
            for j in 0..8 {
                assert_eq!(get_scale_min_k4(j, &q), (ls[j], lm[j]));
            }
        }
    }
}
