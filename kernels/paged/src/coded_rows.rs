//! Decode attention's two row products over narrow codes, dequantising in registers: R query
//! rows against one key row of int8 or E4M3 codes (`dot_codes`), and o_r += Σ_t p_rt · scale ·
//! v_t over value rows of codes (`accumulate_codes`), each code row converted once and shared
//! by the R rows. The kernel-cpu tiers' tokens carry them: AVX2 (8 codes → 8 f32 per step:
//! int8 by sign extension, E4M3 as f16 bits — (b & 0x7F) << 7 with the sign moved to bit 15
//! is the value · 2^-8, subnormals included, S.1111.111 mapped to an f16 NaN — then F16C),
//! AVX-512 (the AVX2 bodies: AVX-512 CPUs have AVX2, FMA and F16C, and this machine has no
//! AVX-512 to test a 512-bit body on), portable (plain loops over the decoded values).

use crate::codec::e4m3_to_f32;
use kernel_cpu::rows::{Avx2, Avx512, Portable, RowKernels};

/// The value of code byte `b` (E4M3 when `FP8`, else int8).
#[inline(always)]
fn value<const FP8: bool>(b: u8) -> f32 {
    if FP8 {
        e4m3_to_f32(b)
    } else {
        // `codec::INT8_UNWRITTEN` (−128) is never written: an unwritten slot reads as −128 · scale.
        b as i8 as f32
    }
}

/// Row products over code rows, beside the f32 ones of `RowKernels`.
pub trait CodedRows: RowKernels {
    /// out[r] = Σ_i q[r·d + i] · value(codes[i]) for i < d.
    fn dot_codes<const FP8: bool, const R: usize>(
        self,
        q: &[f32],
        d: usize,
        codes: &[u8],
    ) -> [f32; R];
    /// o[r·d + i] += Σ_{t<n} p[r·p_stride + t] · scale · value(codes[t·d + i]).
    #[allow(clippy::too_many_arguments)]
    fn accumulate_codes<const FP8: bool, const R: usize>(
        self,
        o: &mut [f32],
        d: usize,
        p: &[f32],
        p_stride: usize,
        scale: f32,
        codes: &[u8],
        n: usize,
    );
}

fn check_dot(q: usize, codes: usize, rows: usize, d: usize) {
    assert!(q >= rows * d && codes >= d, "dot_codes: slices too short");
}

fn check_acc(o: usize, p: usize, codes: usize, rows: usize, d: usize, p_stride: usize, n: usize) {
    assert!(
        o >= rows * d && codes >= n * d,
        "accumulate_codes: o or codes too short"
    );
    assert!(
        n == 0 || p >= (rows - 1) * p_stride + n,
        "accumulate_codes: p too short"
    );
}

impl CodedRows for Portable {
    #[inline(always)]
    fn dot_codes<const FP8: bool, const R: usize>(
        self,
        q: &[f32],
        d: usize,
        codes: &[u8],
    ) -> [f32; R] {
        check_dot(q.len(), codes.len(), R, d);
        let mut out = [0.0f32; R];
        for (r, o) in out.iter_mut().enumerate() {
            let mut acc = [0.0f32; 8];
            let (qc, cc) = (
                q[r * d..(r + 1) * d].chunks_exact(8),
                codes[..d].chunks_exact(8),
            );
            let (qr, cr) = (qc.remainder(), cc.remainder());
            for (x, c) in qc.zip(cc) {
                for l in 0..8 {
                    acc[l] += x[l] * value::<FP8>(c[l]);
                }
            }
            let tail: f32 = qr.iter().zip(cr).map(|(x, &c)| x * value::<FP8>(c)).sum();
            *o = acc.iter().sum::<f32>() + tail;
        }
        out
    }

    #[inline(always)]
    fn accumulate_codes<const FP8: bool, const R: usize>(
        self,
        o: &mut [f32],
        d: usize,
        p: &[f32],
        p_stride: usize,
        scale: f32,
        codes: &[u8],
        n: usize,
    ) {
        check_acc(o.len(), p.len(), codes.len(), R, d, p_stride, n);
        for r in 0..R {
            let orow = &mut o[r * d..(r + 1) * d];
            for t in 0..n {
                let a = p[r * p_stride + t] * scale;
                for (x, &c) in orow.iter_mut().zip(&codes[t * d..(t + 1) * d]) {
                    *x += a * value::<FP8>(c);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::value;
    use std::arch::x86_64::*;

    /// What the 8-lane conversion yields per unit of code value: E4M3 comes out as the
    /// value · 2^-8 (the exponent bias of f16 minus E4M3's).
    pub const fn lane_unit<const FP8: bool>() -> f32 {
        if FP8 {
            256.0
        } else {
            1.0
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// Eight codes at `p` as f32 lanes: int8 exactly; E4M3 as value · 2^-8.
    ///
    /// # Safety
    /// `p` points at 8 readable bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn load8<const FP8: bool>(p: *const u8) -> __m256 {
        let raw = _mm_loadl_epi64(p as *const __m128i);
        if FP8 {
            let w = _mm_cvtepu8_epi16(raw);
            let mag = _mm_and_si128(w, _mm_set1_epi16(0x7F));
            let sign = _mm_slli_epi16::<8>(_mm_and_si128(w, _mm_set1_epi16(0x80)));
            let nan = _mm_and_si128(
                _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7F)),
                _mm_set1_epi16(0x7C00),
            );
            let h = _mm_or_si128(_mm_or_si128(_mm_slli_epi16::<7>(mag), sign), nan);
            _mm256_cvtph_ps(h)
        } else {
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw))
        }
    }

    /// # Safety
    /// `q` holds R·d floats, `c` d bytes; AVX2, FMA and F16C are present.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_codes<const FP8: bool, const R: usize>(
        q: *const f32,
        d: usize,
        c: *const u8,
    ) -> [f32; R] {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut i = 0;
        while i + 16 <= d {
            let (k0, k1) = (load8::<FP8>(c.add(i)), load8::<FP8>(c.add(i + 8)));
            for (r, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(r * d + i)), k0, a[0]);
                a[1] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(r * d + i + 8)), k1, a[1]);
            }
            i += 16;
        }
        if i + 8 <= d {
            let k0 = load8::<FP8>(c.add(i));
            for (r, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(r * d + i)), k0, a[0]);
            }
            i += 8;
        }
        let mut out = [0.0f32; R];
        for (r, o) in out.iter_mut().enumerate() {
            let mut s = lane_unit::<FP8>() * hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
            for j in i..d {
                s = (*q.add(r * d + j)).mul_add(value::<FP8>(*c.add(j)), s);
            }
            *o = s;
        }
        out
    }

    /// # Safety
    /// `o` holds R·d floats, `c` n·d bytes, `p` (R−1)·p_stride + n floats; AVX2, FMA and F16C
    /// are present.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn accumulate_codes<const FP8: bool, const R: usize>(
        o: *mut f32,
        d: usize,
        p: *const f32,
        p_stride: usize,
        scale: f32,
        c: *const u8,
        n: usize,
    ) {
        let lane_scale = scale * lane_unit::<FP8>();
        let mut col = 0;
        while col + 16 <= d {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for (r, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_loadu_ps(o.add(r * d + col));
                a[1] = _mm256_loadu_ps(o.add(r * d + col + 8));
            }
            for t in 0..n {
                let (v0, v1) = (
                    load8::<FP8>(c.add(t * d + col)),
                    load8::<FP8>(c.add(t * d + col + 8)),
                );
                for (r, a) in acc.iter_mut().enumerate() {
                    let pr = _mm256_set1_ps(*p.add(r * p_stride + t) * lane_scale);
                    a[0] = _mm256_fmadd_ps(pr, v0, a[0]);
                    a[1] = _mm256_fmadd_ps(pr, v1, a[1]);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.add(r * d + col), a[0]);
                _mm256_storeu_ps(o.add(r * d + col + 8), a[1]);
            }
            col += 16;
        }
        if col + 8 <= d {
            let mut acc = [_mm256_setzero_ps(); R];
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(o.add(r * d + col));
            }
            for t in 0..n {
                let v0 = load8::<FP8>(c.add(t * d + col));
                for (r, a) in acc.iter_mut().enumerate() {
                    let pr = _mm256_set1_ps(*p.add(r * p_stride + t) * lane_scale);
                    *a = _mm256_fmadd_ps(pr, v0, *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.add(r * d + col), *a);
            }
            col += 8;
        }
        for r in 0..R {
            for j in col..d {
                let mut x = *o.add(r * d + j);
                for t in 0..n {
                    let a = *p.add(r * p_stride + t) * scale;
                    x = a.mul_add(value::<FP8>(*c.add(t * d + j)), x);
                }
                *o.add(r * d + j) = x;
            }
        }
    }
}

/// The AVX2 bodies for the `avx2` and `avx512` tiers' tokens (an AVX-512 CPU has AVX2, FMA
/// and F16C; a token exists only when its tier was detected on this machine).
macro_rules! x86_coded_rows {
    ($($token:ty),*) => {$(
        impl CodedRows for $token {
            #[inline(always)]
            fn dot_codes<const FP8: bool, const R: usize>(
                self,
                q: &[f32],
                d: usize,
                codes: &[u8],
            ) -> [f32; R] {
                check_dot(q.len(), codes.len(), R, d);
                #[cfg(target_arch = "x86_64")]
                // SAFETY: lengths checked above; the token proves its tier (AVX2, FMA and F16C
                // at least) was detected.
                return unsafe { x86::dot_codes::<FP8, R>(q.as_ptr(), d, codes.as_ptr()) };
                #[cfg(not(target_arch = "x86_64"))]
                Portable.dot_codes::<FP8, R>(q, d, codes)
            }

            #[inline(always)]
            fn accumulate_codes<const FP8: bool, const R: usize>(
                self,
                o: &mut [f32],
                d: usize,
                p: &[f32],
                p_stride: usize,
                scale: f32,
                codes: &[u8],
                n: usize,
            ) {
                check_acc(o.len(), p.len(), codes.len(), R, d, p_stride, n);
                #[cfg(target_arch = "x86_64")]
                // SAFETY: lengths checked above; the token proves its tier (AVX2, FMA and F16C
                // at least) was detected.
                return unsafe {
                    x86::accumulate_codes::<FP8, R>(
                        o.as_mut_ptr(),
                        d,
                        p.as_ptr(),
                        p_stride,
                        scale,
                        codes.as_ptr(),
                        n,
                    )
                };
                #[cfg(not(target_arch = "x86_64"))]
                Portable.accumulate_codes::<FP8, R>(o, d, p, p_stride, scale, codes, n)
            }
        }
    )*};
}

x86_coded_rows!(Avx2, Avx512);

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_cpu::isa;

    /// Every byte through each tier's conversion, against the table: 8 lanes and the tails.
    fn check<K: CodedRows>(k: K) {
        for d in [1usize, 7, 8, 15, 16, 24, 33, 64, 128] {
            let q: Vec<f32> = (0..4 * d).map(|i| (i as f32 * 0.37).sin()).collect();
            for fp8 in [false, true] {
                let codes: Vec<u8> = (0..8 * d)
                    .map(|i| (i * 37 % 256) as u8)
                    .map(|b| if fp8 && b & 0x7F == 0x7F { 0x3C } else { b })
                    .collect();
                let v = |b: u8| if fp8 { e4m3_to_f32(b) } else { b as i8 as f32 };
                for t in 0..8 {
                    let row = &codes[t * d..(t + 1) * d];
                    let got = if fp8 {
                        k.dot_codes::<true, 4>(&q, d, row)
                    } else {
                        k.dot_codes::<false, 4>(&q, d, row)
                    };
                    for r in 0..4 {
                        let want: f64 =
                            (0..d).map(|i| q[r * d + i] as f64 * v(row[i]) as f64).sum();
                        let mag: f64 = (0..d)
                            .map(|i| (q[r * d + i] as f64 * v(row[i]) as f64).abs())
                            .sum();
                        assert!(
                            (got[r] as f64 - want).abs() <= 1e-5 * mag.max(1.0),
                            "fp8 {fp8} d {d} row {t} r {r}: {} vs {want}",
                            got[r]
                        );
                    }
                }
                let (n, ps, scale) = (8, 11, 0.37f32);
                let p: Vec<f32> = (0..4 * ps).map(|i| (i as f32 * 0.13).cos()).collect();
                let mut o: Vec<f32> = (0..4 * d).map(|i| i as f32 * 0.5).collect();
                let before = o.clone();
                if fp8 {
                    k.accumulate_codes::<true, 4>(&mut o, d, &p, ps, scale, &codes, n);
                } else {
                    k.accumulate_codes::<false, 4>(&mut o, d, &p, ps, scale, &codes, n);
                }
                for r in 0..4 {
                    for i in 0..d {
                        let terms: Vec<f64> = (0..n)
                            .map(|t| {
                                p[r * ps + t] as f64 * scale as f64 * v(codes[t * d + i]) as f64
                            })
                            .collect();
                        let want = before[r * d + i] as f64 + terms.iter().sum::<f64>();
                        let mag = before[r * d + i].abs() as f64
                            + terms.iter().map(|x| x.abs()).sum::<f64>();
                        assert!(
                            (o[r * d + i] as f64 - want).abs() <= 1e-5 * mag.max(1.0),
                            "fp8 {fp8} d {d} r {r} i {i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_tier_matches_the_table() {
        check(Portable);
        isa::for_each_available(|tier| {
            if let Some(k) = Avx512::for_tier(tier) {
                check(k);
            } else if let Some(k) = Avx2::for_tier(tier) {
                check(k);
            }
        });
    }

    #[test]
    fn nan_codes_stay_nan_in_every_tier() {
        let q = [1.0f32; 16];
        let mut codes = [0x38u8; 16]; // 1.0
        codes[5] = 0x7F;
        codes[12] = 0xFF;
        assert!(Portable.dot_codes::<true, 1>(&q, 16, &codes)[0].is_nan());
        isa::for_each_available(|tier| {
            if let Some(k) = Avx2::for_tier(tier) {
                assert!(k.dot_codes::<true, 1>(&q, 16, &codes)[0].is_nan());
                let mut o = [0.0f32; 16];
                k.accumulate_codes::<true, 1>(&mut o, 16, &[1.0], 1, 1.0, &codes, 1);
                assert!(o[5].is_nan() && o[12].is_nan() && o[0] == 1.0);
            }
        });
    }
}
