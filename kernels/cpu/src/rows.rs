//! Row-blocked products for decode attention, where several query rows share each K/V row:
//! `dot_rows` (R scores q_r·k with k loaded once) and `accumulate_rows` (o_r += Σ_t p_rt·v_t
//! with R×16 accumulators held in registers while V streams from L1). Two implementations
//! behind the `RowKernels` trait: explicit AVX-512 or AVX2/FMA intrinsics, and portable loops;
//! a kernel is written once, generic over the trait, and gets a token only after detection.

/// R-row products used by decode attention.
pub trait RowKernels: Copy + Send + Sync {
    /// out[r] = q[r·d..(r+1)·d] · k[..d].
    fn dot_rows<const R: usize>(self, q: &[f32], d: usize, k: &[f32]) -> [f32; R];
    /// o[r·d..(r+1)·d] += Σ_{t<n} p[r·p_stride + t] · v[t·d..(t+1)·d].
    fn accumulate_rows<const R: usize>(
        self,
        o: &mut [f32],
        d: usize,
        p: &[f32],
        p_stride: usize,
        v: &[f32],
        n: usize,
    );
}

#[inline]
fn check_dot(q: usize, k: usize, rows: usize, d: usize) {
    assert!(q >= rows * d && k >= d, "dot_rows: slices too short");
}

#[inline]
fn check_acc(o: usize, p: usize, v: usize, rows: usize, d: usize, p_stride: usize, n: usize) {
    assert!(
        o >= rows * d && v >= n * d,
        "accumulate_rows: o or v too short"
    );
    assert!(
        n == 0 || p >= (rows - 1) * p_stride + n,
        "accumulate_rows: p too short"
    );
}

/// Plain loops: any CPU.
#[derive(Debug, Clone, Copy)]
pub struct Portable;

impl RowKernels for Portable {
    #[inline(always)]
    fn dot_rows<const R: usize>(self, q: &[f32], d: usize, k: &[f32]) -> [f32; R] {
        check_dot(q.len(), k.len(), R, d);
        // The `_plain` forms: this body is compiled for the baseline ISA, where `mul_add` is a
        // call to the software `fmaf` per element (measured: paged decode at 0.5 GB/s).
        std::array::from_fn(|r| crate::simd::dot_plain(&q[r * d..(r + 1) * d], &k[..d]))
    }

    #[inline(always)]
    fn accumulate_rows<const R: usize>(
        self,
        o: &mut [f32],
        d: usize,
        p: &[f32],
        p_stride: usize,
        v: &[f32],
        n: usize,
    ) {
        check_acc(o.len(), p.len(), v.len(), R, d, p_stride, n);
        for r in 0..R {
            for t in 0..n {
                crate::simd::axpy_plain(
                    p[r * p_stride + t],
                    &v[t * d..(t + 1) * d],
                    &mut o[r * d..(r + 1) * d],
                );
            }
        }
    }
}

/// AVX2 + FMA intrinsics; only `Avx2::detect` makes one.
#[derive(Debug, Clone, Copy)]
pub struct Avx2 {
    _detected: (),
}

impl Avx2 {
    /// The token, when the active ISA (`Isa::active()`: the CPU, the cap, this thread's
    /// choice) includes AVX2 + FMA.
    pub fn detect() -> Option<Avx2> {
        Avx2::for_tier(crate::Isa::active())
    }

    /// The token for a tier already resolved (on the calling thread, before work is forked to
    /// rayon workers, where this thread's `with_isa` choice does not reach): when `isa`
    /// includes AVX2 and this CPU has it.
    pub fn for_tier(isa: crate::Isa) -> Option<Avx2> {
        (isa.has_avx2() && crate::Isa::Avx2.supported()).then_some(Avx2 { _detected: () })
    }
}

/// AVX-512F intrinsics (16-lane registers); only `Avx512::detect` makes one.
#[derive(Debug, Clone, Copy)]
pub struct Avx512 {
    _detected: (),
}

impl Avx512 {
    /// The token, when the active ISA includes AVX-512 (and so AVX2/FMA for the tails).
    pub fn detect() -> Option<Avx512> {
        Avx512::for_tier(crate::Isa::active())
    }

    /// The token for a tier already resolved (see `Avx2::for_tier`).
    pub fn for_tier(isa: crate::Isa) -> Option<Avx512> {
        (isa.has_avx512() && crate::Isa::Avx512.supported()).then_some(Avx512 { _detected: () })
    }
}

#[cfg(target_arch = "x86_64")]
mod x86_512 {
    use std::arch::x86_64::*;

    /// # Safety
    /// `q` holds R·d floats and `k` holds d floats.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn dot_rows<const R: usize>(q: *const f32, d: usize, k: *const f32) -> [f32; R] {
        let mut acc = [_mm512_setzero_ps(); R];
        let mut i = 0;
        while i + 16 <= d {
            let kv = _mm512_loadu_ps(k.add(i));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(r * d + i)), kv, *a);
            }
            i += 16;
        }
        let mut out = [0.0f32; R];
        for (r, o) in out.iter_mut().enumerate() {
            let mut s = _mm512_reduce_add_ps(acc[r]);
            for j in i..d {
                s = (*q.add(r * d + j)).mul_add(*k.add(j), s);
            }
            *o = s;
        }
        out
    }

    /// # Safety
    /// `o` holds R·d floats, `v` n·d, `p` (R−1)·p_stride + n.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn accumulate_rows<const R: usize>(
        o: *mut f32,
        d: usize,
        p: *const f32,
        p_stride: usize,
        v: *const f32,
        n: usize,
    ) {
        let mut c = 0;
        while c + 32 <= d {
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            for (r, a) in acc.iter_mut().enumerate() {
                a[0] = _mm512_loadu_ps(o.add(r * d + c));
                a[1] = _mm512_loadu_ps(o.add(r * d + c + 16));
            }
            for t in 0..n {
                let (v0, v1) = (
                    _mm512_loadu_ps(v.add(t * d + c)),
                    _mm512_loadu_ps(v.add(t * d + c + 16)),
                );
                for (r, a) in acc.iter_mut().enumerate() {
                    let pr = _mm512_set1_ps(*p.add(r * p_stride + t));
                    a[0] = _mm512_fmadd_ps(pr, v0, a[0]);
                    a[1] = _mm512_fmadd_ps(pr, v1, a[1]);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(o.add(r * d + c), a[0]);
                _mm512_storeu_ps(o.add(r * d + c + 16), a[1]);
            }
            c += 32;
        }
        if c < d {
            // The last d mod 32 columns through the AVX2 path, on shifted views.
            super::x86::accumulate_rows::<R>(o.add(c), d, p, p_stride, v.add(c), n, d - c);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// `q` holds R·d floats and `k` holds d floats.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_rows<const R: usize>(q: *const f32, d: usize, k: *const f32) -> [f32; R] {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut i = 0;
        while i + 16 <= d {
            let (k0, k1) = (_mm256_loadu_ps(k.add(i)), _mm256_loadu_ps(k.add(i + 8)));
            for (r, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(r * d + i)), k0, a[0]);
                a[1] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(r * d + i + 8)), k1, a[1]);
            }
            i += 16;
        }
        if i + 8 <= d {
            let k0 = _mm256_loadu_ps(k.add(i));
            for (r, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(r * d + i)), k0, a[0]);
            }
            i += 8;
        }
        let mut out = [0.0f32; R];
        for (r, o) in out.iter_mut().enumerate() {
            let mut s = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
            for j in i..d {
                s = (*q.add(r * d + j)).mul_add(*k.add(j), s);
            }
            *o = s;
        }
        out
    }

    /// # Safety
    /// `o` holds R·d floats, `v` n·d, `p` (R−1)·p_stride + n.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    /// Only the first `cols` columns of each row are updated (rows are still `d` apart).
    pub unsafe fn accumulate_rows<const R: usize>(
        o: *mut f32,
        d: usize,
        p: *const f32,
        p_stride: usize,
        v: *const f32,
        n: usize,
        cols: usize,
    ) {
        let mut c = 0;
        while c + 16 <= cols {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for (r, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_loadu_ps(o.add(r * d + c));
                a[1] = _mm256_loadu_ps(o.add(r * d + c + 8));
            }
            for t in 0..n {
                let (v0, v1) = (
                    _mm256_loadu_ps(v.add(t * d + c)),
                    _mm256_loadu_ps(v.add(t * d + c + 8)),
                );
                for (r, a) in acc.iter_mut().enumerate() {
                    let pr = _mm256_set1_ps(*p.add(r * p_stride + t));
                    a[0] = _mm256_fmadd_ps(pr, v0, a[0]);
                    a[1] = _mm256_fmadd_ps(pr, v1, a[1]);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.add(r * d + c), a[0]);
                _mm256_storeu_ps(o.add(r * d + c + 8), a[1]);
            }
            c += 16;
        }
        for r in 0..R {
            for j in c..cols {
                let mut x = *o.add(r * d + j);
                for t in 0..n {
                    x = (*p.add(r * p_stride + t)).mul_add(*v.add(t * d + j), x);
                }
                *o.add(r * d + j) = x;
            }
        }
    }
}

impl RowKernels for Avx2 {
    #[inline(always)]
    fn dot_rows<const R: usize>(self, q: &[f32], d: usize, k: &[f32]) -> [f32; R] {
        check_dot(q.len(), k.len(), R, d);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: lengths checked above; the token exists only when AVX2/FMA were detected.
        return unsafe { x86::dot_rows::<R>(q.as_ptr(), d, k.as_ptr()) };
        #[cfg(not(target_arch = "x86_64"))]
        Portable.dot_rows::<R>(q, d, k)
    }

    #[inline(always)]
    fn accumulate_rows<const R: usize>(
        self,
        o: &mut [f32],
        d: usize,
        p: &[f32],
        p_stride: usize,
        v: &[f32],
        n: usize,
    ) {
        check_acc(o.len(), p.len(), v.len(), R, d, p_stride, n);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: lengths checked above; the token exists only when AVX2/FMA were detected.
        return unsafe {
            x86::accumulate_rows::<R>(o.as_mut_ptr(), d, p.as_ptr(), p_stride, v.as_ptr(), n, d)
        };
        #[cfg(not(target_arch = "x86_64"))]
        Portable.accumulate_rows::<R>(o, d, p, p_stride, v, n)
    }
}

impl RowKernels for Avx512 {
    #[inline(always)]
    fn dot_rows<const R: usize>(self, q: &[f32], d: usize, k: &[f32]) -> [f32; R] {
        check_dot(q.len(), k.len(), R, d);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: lengths checked above; the token exists only when AVX-512F was detected.
        return unsafe { x86_512::dot_rows::<R>(q.as_ptr(), d, k.as_ptr()) };
        #[cfg(not(target_arch = "x86_64"))]
        Portable.dot_rows::<R>(q, d, k)
    }

    #[inline(always)]
    fn accumulate_rows<const R: usize>(
        self,
        o: &mut [f32],
        d: usize,
        p: &[f32],
        p_stride: usize,
        v: &[f32],
        n: usize,
    ) {
        check_acc(o.len(), p.len(), v.len(), R, d, p_stride, n);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: lengths checked above; the token exists only when AVX-512F was detected.
        return unsafe {
            x86_512::accumulate_rows::<R>(o.as_mut_ptr(), d, p.as_ptr(), p_stride, v.as_ptr(), n)
        };
        #[cfg(not(target_arch = "x86_64"))]
        Portable.accumulate_rows::<R>(o, d, p, p_stride, v, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<K: RowKernels>(k: K) {
        for d in [1usize, 7, 8, 15, 16, 33, 48, 80, 128] {
            let q: Vec<f32> = (0..4 * d).map(|i| (i as f32 * 0.3).sin()).collect();
            let kv: Vec<f32> = (0..d).map(|i| (i as f32 * 0.7).cos()).collect();
            let got = k.dot_rows::<4>(&q, d, &kv);
            for r in 0..4 {
                let want: f32 = (0..d).map(|i| q[r * d + i] * kv[i]).sum();
                assert!((got[r] - want).abs() < 1e-4, "d={d} r={r}");
            }
            assert!((k.dot_rows::<1>(&q, d, &kv)[0] - got[0]).abs() < 1e-5);
            let (n, ps) = (5, 7);
            let v: Vec<f32> = (0..n * d).map(|i| (i as f32 * 0.11).sin()).collect();
            let p: Vec<f32> = (0..4 * ps).map(|i| i as f32 * 0.01).collect();
            let mut o: Vec<f32> = (0..4 * d).map(|i| i as f32).collect();
            let before = o.clone();
            k.accumulate_rows::<4>(&mut o, d, &p, ps, &v, n);
            for r in 0..4 {
                for i in 0..d {
                    let want = before[r * d + i]
                        + (0..n).map(|t| p[r * ps + t] * v[t * d + i]).sum::<f32>();
                    assert!((o[r * d + i] - want).abs() < 1e-3, "d={d} r={r} i={i}");
                }
            }
        }
    }

    #[test]
    fn every_isa_matches_loops_and_a_rows_bits_do_not_depend_on_its_block() {
        check(Portable);
        check_blocks(Portable);
        crate::isa::for_each_available(|isa| {
            if isa.has_avx512() {
                let k = Avx512::detect().expect("the avx512 tier is active");
                check(k);
                check_blocks(k);
            } else if isa.has_avx2() {
                assert!(Avx512::detect().is_none());
                let k = Avx2::detect().expect("the avx2 tier is active");
                check(k);
                check_blocks(k);
            } else {
                assert!(Avx2::detect().is_none());
            }
        });
    }

    /// The `R` rows' dot products, then their accumulations (`p` rows `PS` apart), as bits.
    const PS: usize = 7;
    fn rows_bits<K: RowKernels, const R: usize>(
        k: K,
        q: &[f32],
        p: &[f32],
        kv: &[f32],
        d: usize,
    ) -> Vec<u32> {
        let mut o: Vec<f32> = q[..R * d].iter().map(|x| x * 3.0).collect();
        k.accumulate_rows::<R>(&mut o, d, p, PS, kv, 5);
        let dots = k.dot_rows::<R>(q, d, kv);
        dots.iter().chain(&o).map(|x| x.to_bits()).collect()
    }

    fn check_blocks<K: RowKernels>(k: K) {
        // Decode attention blocks a GQA group of 3 or 7 rows as 3 or 4 + 3: each row's
        // results must be the bits it gets alone.
        for d in [1usize, 15, 16, 64, 80, 128] {
            let q: Vec<f32> = (0..4 * d).map(|i| (i as f32 * 0.37).sin()).collect();
            let p: Vec<f32> = (0..4 * PS).map(|i| (i as f32 * 0.13).cos()).collect();
            let kv: Vec<f32> = (0..5 * d).map(|i| (i as f32 * 0.71).cos()).collect();
            let alone = |r: usize| {
                let b = rows_bits::<K, 1>(k, &q[r * d..], &p[r * PS..], &kv, d);
                (b[0], b[1..].to_vec())
            };
            for (rows, got) in [
                (2, rows_bits::<K, 2>(k, &q, &p, &kv, d)),
                (3, rows_bits::<K, 3>(k, &q, &p, &kv, d)),
                (4, rows_bits::<K, 4>(k, &q, &p, &kv, d)),
            ] {
                for r in 0..rows {
                    let (dot, acc) = alone(r);
                    assert_eq!(got[r], dot, "d={d} rows={rows} r={r}: dot");
                    assert_eq!(
                        got[rows + r * d..rows + (r + 1) * d],
                        acc[..],
                        "d={d} rows={rows} r={r}: accumulation"
                    );
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "too short")]
    fn short_slices_are_caught() {
        Portable.dot_rows::<4>(&[0.0; 7], 2, &[0.0; 2]);
    }
}
