//! The f64 oracle: for each query row, materialise the score s_j = scale·q·k_j in f64 of
//! every key it sees (causal horizon and sliding window), soft-cap it (cap · tanh(s / cap))
//! when asked, take an exact softmax (max-shifted) and the weighted sum of v.
//! Never optimised; rows may be evaluated one by one so big cases can be spot-checked.

use crate::{cpu_only, prepare_contiguous, AttentionInputs, AttentionKernel, AttentionShape};
use crate::{ContiguousAttention, PreparedAttention};
use kernel_common::error::Result;
use kernel_common::{with_buffer, Buffer, Cost, DType, Device, Element};
use rayon::prelude::*;

/// One query row: (batch index, query head, row within q_len).
pub type QueryRow = (usize, usize, usize);

/// Elements `start..start+len` of `buf` widened to f64.
fn slice_f64(buf: &Buffer, start: usize, len: usize) -> Vec<f64> {
    with_buffer!(buf, v => v[start..start + len].iter().map(|x| x.to_f32() as f64).collect())
}

/// A score after the optional logit soft-cap, in f64: cap · tanh(s / cap), or `s`.
pub fn softcap(softcap: Option<f32>, s: f64) -> f64 {
    match softcap {
        Some(cap) => {
            let cap = cap as f64;
            cap * (s / cap).tanh()
        }
        None => s,
    }
}

/// The reference output of the given query rows, `head_dim` values per row, in row order.
pub fn attention_rows(
    shape: &AttentionShape,
    inputs: &AttentionInputs,
    rows: &[QueryRow],
) -> Vec<f64> {
    let d = shape.head_dim;
    rows.par_iter()
        .flat_map_iter(|&(b, h, i)| {
            let kvh = h / shape.group();
            let q = slice_f64(
                &inputs.q,
                ((b * shape.q_heads + h) * shape.q_len + i) * d,
                d,
            );
            let kv_base = (b * shape.kv_heads + kvh) * shape.kv_len * d;
            let seen = shape.visible_keys(i);
            let scores: Vec<f64> = seen
                .clone()
                .map(|j| {
                    let k = slice_f64(&inputs.k, kv_base + j * d, d);
                    let s = shape.scale as f64 * q.iter().zip(&k).map(|(a, b)| a * b).sum::<f64>();
                    softcap(shape.softcap, s)
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = p.iter().sum();
            let mut out = vec![0.0f64; d];
            for (j, pj) in seen.zip(&p) {
                let v = slice_f64(&inputs.v, kv_base + j * d, d);
                for (o, vv) in out.iter_mut().zip(&v) {
                    *o += pj * vv;
                }
            }
            out.into_iter().map(move |o| o / l)
        })
        .collect()
}

/// Every query row of the shape in output order `[batch, q_heads, q_len]`.
pub fn all_rows(shape: &AttentionShape) -> Vec<QueryRow> {
    let mut rows = Vec::with_capacity(shape.batch * shape.q_heads * shape.q_len);
    for b in 0..shape.batch {
        for h in 0..shape.q_heads {
            for i in 0..shape.q_len {
                rows.push((b, h, i));
            }
        }
    }
    rows
}

/// The full reference output `[batch, q_heads, q_len, head_dim]` in f64.
pub fn attention(shape: &AttentionShape, inputs: &AttentionInputs) -> Vec<f64> {
    attention_rows(shape, inputs, &all_rows(shape))
}

/// The reference as a variant (output rounded to the storage dtype), so it can be timed too.
pub struct Reference;

impl ContiguousAttention for Reference {
    fn compute(
        &self,
        shape: &AttentionShape,
        inputs: &AttentionInputs,
        out: &mut Buffer,
    ) -> Result<()> {
        out.expect("out", inputs.dtype(), shape.q_elems())?;
        let full = attention(shape, inputs);
        with_buffer!(out, o => for (dst, src) in o.iter_mut().zip(&full) {
            *dst = Element::from_f32(*src as f32);
        });
        Ok(())
    }
}

impl AttentionKernel for Reference {
    fn name(&self) -> String {
        "reference".into()
    }
    fn supports(&self, _shape: &AttentionShape, _dtype: DType, device: Device) -> Result<()> {
        cpu_only("reference", device)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_key_returns_its_value() {
        let shape = AttentionShape::new(1, 2, 1, 1, 1, 3, true);
        let inputs = AttentionInputs {
            q: Buffer::F32(vec![1.0, 2.0, 3.0, -1.0, 0.5, 2.0]),
            k: Buffer::F32(vec![0.3, 0.1, -0.2]),
            v: Buffer::F32(vec![4.0, -5.0, 6.0]),
        };
        let out = attention(&shape, &inputs);
        assert_eq!(out, vec![4.0, -5.0, 6.0, 4.0, -5.0, 6.0]);
    }

    #[test]
    fn equal_scores_average_the_values() {
        // q = 0 gives equal scores: the output is the mean of the visible values.
        let shape = AttentionShape::new(1, 1, 1, 2, 2, 1, true);
        let inputs = AttentionInputs {
            q: Buffer::F32(vec![0.0, 0.0]),
            k: Buffer::F32(vec![1.0, 2.0]),
            v: Buffer::F32(vec![2.0, 4.0]),
        };
        // Row 0 sees key 0 only; row 1 sees both.
        assert_eq!(attention(&shape, &inputs), vec![2.0, 3.0]);
        let rows = attention_rows(&shape, &inputs, &[(0, 0, 1)]);
        assert_eq!(rows, vec![3.0]);
    }
}
