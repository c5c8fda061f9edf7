//! "Standard attention" as the claims use the term: per (batch, head) the full score matrix
//! S = scale·Q·Kᵀ (q_len × kv_len) is materialised with a GEMM, soft-capped where asked
//! (Gemma-2), masked (causal, sliding window), soft-maxed row by row and multiplied by V with
//! a second GEMM. Memory and work grow as q_len·kv_len per running head, window or not.

use super::gemm::{sgemm, widen, Strides};
use super::softcap::cap_scores;
use crate::{cpu_only, prepare_contiguous, AttentionInputs, AttentionKernel, AttentionShape};
use crate::{ContiguousAttention, PreparedAttention};
use kernel_common::error::Result;
use kernel_common::{Buffer, Cost, DType, Device, Element};
use kernel_cpu::simd;
use rayon::prelude::*;

/// The naive variant.
pub struct Naive;

impl Naive {
    /// Bytes of the score matrix one head materialises.
    pub fn scores_bytes(shape: &AttentionShape) -> u64 {
        (shape.q_len * shape.kv_len * 4) as u64
    }
}

/// Per (batch, head): S = scale·Q·Kᵀ, masked row softmax in place, O = P·V.
#[inline(always)]
fn head<T: Element>(shape: &AttentionShape, q: &[T], k: &[T], v: &[T], out: &mut [T]) {
    let (lq, lk, d) = (shape.q_len, shape.kv_len, shape.head_dim);
    let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
    let (q, k, v) = (widen(q, &mut qs), widen(k, &mut ks), widen(v, &mut vs));
    let mut s = vec![0.0f32; lq * lk];
    sgemm(
        lq,
        d,
        lk,
        shape.scale,
        q,
        Strides::row_major(d),
        k,
        Strides::transposed(d),
        0.0,
        &mut s,
        lk,
    );
    for (i, row) in s.chunks_exact_mut(lk).enumerate() {
        let seen = shape.visible_keys(i);
        row[..seen.start].fill(0.0);
        row[seen.end..].fill(0.0);
        let visible = &mut row[seen];
        if let Some(cap) = shape.softcap {
            cap_scores(cap, visible);
        }
        let m = simd::max(visible);
        let l = simd::exp_shifted_sum(visible, m);
        simd::scale(1.0 / l, visible);
    }
    let mut o = vec![0.0f32; lq * d];
    sgemm(
        lq,
        lk,
        d,
        1.0,
        &s,
        Strides::row_major(lk),
        v,
        Strides::row_major(d),
        0.0,
        &mut o,
        d,
    );
    T::narrow_into(&o, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn head_avx2<T: Element>(shape: &AttentionShape, q: &[T], k: &[T], v: &[T], out: &mut [T]) {
    head(shape, q, k, v, out)
}

fn run<T: Element>(shape: &AttentionShape, q: &[T], k: &[T], v: &[T], out: &mut [T]) {
    let (lq, lk, d) = (shape.q_len, shape.kv_len, shape.head_dim);
    let avx2 = kernel_cpu::Isa::active().has_avx2();
    out.par_chunks_mut(lq * d).enumerate().for_each(|(bh, o)| {
        let (b, h) = (bh / shape.q_heads, bh % shape.q_heads);
        let kv = ((b * shape.kv_heads + h / shape.group()) * lk * d)..;
        let (qh, kh, vh) = (
            &q[bh * lq * d..][..lq * d],
            &k[kv.clone()][..lk * d],
            &v[kv][..lk * d],
        );
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: the active ISA includes AVX2 and FMA, so this CPU has them.
            return unsafe { head_avx2(shape, qh, kh, vh, o) };
        }
        let _ = avx2;
        head(shape, qh, kh, vh, o)
    });
}

impl ContiguousAttention for Naive {
    fn compute(
        &self,
        shape: &AttentionShape,
        inputs: &AttentionInputs,
        out: &mut Buffer,
    ) -> Result<()> {
        out.expect("out", inputs.dtype(), shape.q_elems())?;
        crate::with_qkvo!(inputs, out, |q, k, v, o| run(shape, q, k, v, o));
        Ok(())
    }
}

impl AttentionKernel for Naive {
    fn name(&self) -> String {
        "naive".into()
    }
    fn supports(&self, _shape: &AttentionShape, _dtype: DType, device: Device) -> Result<()> {
        cpu_only("naive", device)
    }
    /// Compulsory traffic plus four passes over each head's score matrix (write S, read and
    /// write it in the softmax, read P in the second GEMM).
    fn cost(&self, shape: &AttentionShape, dtype: DType) -> Cost {
        let heads = (shape.batch * shape.q_heads) as u64;
        let io = shape.io_cost(dtype);
        Cost {
            bytes: io.bytes + 4 * heads * Naive::scores_bytes(shape),
            flops: io.flops,
        }
    }
    /// One score matrix and one f32 output per running head.
    fn workspace_bytes(&self, shape: &AttentionShape, threads: usize) -> u64 {
        let running = threads.min(shape.batch * shape.q_heads) as u64;
        running * (Naive::scores_bytes(shape) + (shape.q_len * shape.head_dim * 4) as u64)
    }
    fn prepare<'a>(
        &'a self,
        shape: &AttentionShape,
        inputs: &'a AttentionInputs,
    ) -> Result<Box<dyn PreparedAttention + 'a>> {
        prepare_contiguous(self, shape, inputs)
    }
}
