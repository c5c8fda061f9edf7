//! FlashAttention-2 (Dao, 2023) on the CPU: each task owns a Br-row tile of queries for one
//! (batch, head) and streams Bc-key tiles of K and V through it, keeping the running row max
//! m, denominator l and unnormalised output O (the FA2 recurrence: O ← e^(m_old−m_new)·O +
//! P·V, one final O/l). Scores never leave the Br×Bc tile. GQA maps query head h to KV head
//! h / group without copying K/V. Keys no row of a query tile sees are never touched: the KV
//! loop runs from the tile's first row's window start to its last row's causal horizon
//! (`kv_range`; the key tiles start there, not at a multiple of Bc), so with a sliding window
//! w a full query tile visits ⌈(w + Br − 1) / Bc⌉ key tiles, not kv_len / Bc; only the
//! boundary tiles are masked element-wise. Soft-capped scores (Gemma-2) take one tanh
//! per visible score.

use super::gemm::{sgemm_with, widen, GemmBackend, Strides};
use super::softcap::cap_scores;
use crate::{cpu_only, prepare_contiguous, AttentionInputs, AttentionKernel, AttentionShape};
use crate::{ContiguousAttention, PreparedAttention};
use kernel_common::error::Result;
use kernel_common::{Buffer, Cost, DType, Device, Element, KernelError};
use kernel_cpu::simd;
use rayon::prelude::*;
use std::ops::Range;

/// Default query-tile rows.
pub const DEFAULT_BR: usize = 128;
/// Default key-tile columns.
pub const DEFAULT_BC: usize = 128;
/// Default tile-product backend.
pub const DEFAULT_GEMM: GemmBackend = GemmBackend::DEFAULT;
/// Largest tile side accepted.
pub const MAX_TILE: usize = 1024;

/// The flash2 variant with its tile sizes.
#[derive(Debug, Clone, Copy)]
pub struct Flash2 {
    br: usize,
    bc: usize,
    gemm: GemmBackend,
}

impl Flash2 {
    /// Tile sizes must be in `1..=MAX_TILE`.
    pub fn new(br: usize, bc: usize, gemm: GemmBackend) -> Result<Flash2> {
        for (name, t) in [("br", br), ("bc", bc)] {
            if t == 0 || t > MAX_TILE {
                return Err(KernelError::Unsupported(format!(
                    "flash2 tile {name}={t} must be in 1..={MAX_TILE}"
                )));
            }
        }
        Ok(Flash2 { br, bc, gemm })
    }

    /// Scratch floats one task holds: Q tile, O tile, S tile, widened K and V tiles, m and l.
    pub fn scratch_floats(&self, head_dim: usize) -> usize {
        2 * self.br * head_dim + self.br * self.bc + 2 * self.bc * head_dim + 2 * self.br
    }

    /// Key tiles one (batch, head) visits: Σ over its query tiles of ⌈|kv_range| / Bc⌉ —
    /// the loop count of `q_tile`, from the same bounds.
    pub fn kv_tiles_per_head(&self, shape: &AttentionShape) -> usize {
        (0..shape.q_len)
            .step_by(self.br)
            .map(|i0| {
                let rows = self.br.min(shape.q_len - i0);
                kv_range(shape, i0, rows).len().div_ceil(self.bc)
            })
            .sum()
    }
}

/// The keys query rows `i0..i0 + rows` need between them: from the first row's first visible
/// key (its window start) to the last row's causal horizon; every key when not causal.
fn kv_range(shape: &AttentionShape, i0: usize, rows: usize) -> Range<usize> {
    shape.visible_keys(i0).start..shape.visible_keys(i0 + rows - 1).end
}

/// One task: query rows `i0..i0+rows` of one (batch, head) against its KV head.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn q_tile<T: Element>(
    shape: &AttentionShape,
    cfg: Flash2,
    i0: usize,
    q: &[T],
    k: &[T],
    v: &[T],
    out: &mut [T],
) {
    let d = shape.head_dim;
    let rows = out.len() / d;
    let mut q_scratch = Vec::new();
    let qt = widen(q, &mut q_scratch);
    let mut o = vec![0.0f32; rows * d];
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0.0f32; rows];
    let mut s = vec![0.0f32; rows * cfg.bc];
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    // Keys before the first row's window and beyond the last row's horizon are never needed.
    let Range {
        start: mut j0,
        end: kv_end,
    } = kv_range(shape, i0, rows);
    while j0 < kv_end {
        let cols = cfg.bc.min(kv_end - j0);
        let kt = widen(&k[j0 * d..(j0 + cols) * d], &mut ks);
        let vt = widen(&v[j0 * d..(j0 + cols) * d], &mut vs);
        sgemm_with(
            cfg.gemm,
            rows,
            d,
            cols,
            shape.scale,
            qt,
            Strides::row_major(d),
            kt,
            Strides::transposed(d),
            0.0,
            &mut s,
            cfg.bc,
        );
        for r in 0..rows {
            let srow = &mut s[r * cfg.bc..r * cfg.bc + cols];
            // This row's keys within the tile; the others are masked out of it.
            let seen = shape.visible_keys(i0 + r);
            let lo = seen.start.saturating_sub(j0).min(cols);
            let hi = seen.end.saturating_sub(j0).min(cols);
            if lo >= hi {
                // Nothing visible here (before this row's window): zero weights, no update.
                srow.fill(0.0);
                continue;
            }
            if let Some(cap) = shape.softcap {
                cap_scores(cap, &mut srow[lo..hi]);
            }
            srow[..lo].fill(f32::NEG_INFINITY);
            srow[hi..].fill(f32::NEG_INFINITY);
            let m_new = m[r].max(simd::max(srow));
            let row_sum = simd::exp_shifted_sum(srow, m_new);
            let alpha = simd::exp_f32(m[r] - m_new);
            l[r] = alpha * l[r] + row_sum;
            if alpha != 1.0 {
                simd::scale(alpha, &mut o[r * d..(r + 1) * d]);
            }
            m[r] = m_new;
        }
        sgemm_with(
            cfg.gemm,
            rows,
            cols,
            d,
            1.0,
            &s,
            Strides::row_major(cfg.bc),
            vt,
            Strides::row_major(d),
            1.0,
            &mut o,
            d,
        );
        j0 += cols;
    }
    for (r, orow) in o.chunks_exact_mut(d).enumerate() {
        simd::scale(1.0 / l[r], orow);
    }
    T::narrow_into(&o, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
fn q_tile_avx2<T: Element>(
    shape: &AttentionShape,
    cfg: Flash2,
    i0: usize,
    q: &[T],
    k: &[T],
    v: &[T],
    out: &mut [T],
) {
    q_tile(shape, cfg, i0, q, k, v, out)
}

impl Flash2 {
    fn run<T: Element>(&self, shape: &AttentionShape, q: &[T], k: &[T], v: &[T], out: &mut [T]) {
        let (lq, lk, d) = (shape.q_len, shape.kv_len, shape.head_dim);
        let avx2 = kernel_cpu::Isa::active().has_avx2();
        out.par_chunks_mut(lq * d)
            .enumerate()
            .for_each(|(bh, o_head)| {
                let (b, h) = (bh / shape.q_heads, bh % shape.q_heads);
                let kv = (b * shape.kv_heads + h / shape.group()) * lk * d;
                let (kh, vh) = (&k[kv..kv + lk * d], &v[kv..kv + lk * d]);
                let q_head = &q[bh * lq * d..(bh + 1) * lq * d];
                o_head
                    .par_chunks_mut(self.br * d)
                    .enumerate()
                    .for_each(|(t, o)| {
                        let i0 = t * self.br;
                        let qt = &q_head[i0 * d..i0 * d + o.len()];
                        #[cfg(target_arch = "x86_64")]
                        if avx2 {
                            // SAFETY: the active ISA includes AVX2 and FMA, so this CPU has them.
                            return unsafe { q_tile_avx2(shape, *self, i0, qt, kh, vh, o) };
                        }
                        let _ = avx2;
                        q_tile(shape, *self, i0, qt, kh, vh, o)
                    });
            });
    }
}

impl ContiguousAttention for Flash2 {
    fn compute(
        &self,
        shape: &AttentionShape,
        inputs: &AttentionInputs,
        out: &mut Buffer,
    ) -> Result<()> {
        out.expect("out", inputs.dtype(), shape.q_elems())?;
        crate::with_qkvo!(inputs, out, |q, k, v, o| self.run(shape, q, k, v, o));
        Ok(())
    }
}

impl AttentionKernel for Flash2 {
    fn name(&self) -> String {
        format!(
            "flash2:bc={},br={},gemm={}",
            self.bc,
            self.br,
            self.gemm.name()
        )
    }
    fn supports(&self, _shape: &AttentionShape, _dtype: DType, device: Device) -> Result<()> {
        cpu_only("flash2", device)
    }
    /// Compulsory traffic only: K/V tiles are re-read from cache, not from memory.
    fn cost(&self, shape: &AttentionShape, dtype: DType) -> Cost {
        shape.io_cost(dtype)
    }
    fn prepare<'a>(
        &'a self,
        shape: &AttentionShape,
        inputs: &'a AttentionInputs,
    ) -> Result<Box<dyn PreparedAttention + 'a>> {
        prepare_contiguous(self, shape, inputs)
    }
}
