//! A pass's int8 activations interleaved block by block, as the packed tile kernels read them
//! (llama.cpp's `block_q8_0x4` / `x8`, built by its `quantize_mat_q8_0` for the repacked
//! GEMMs): block k of activation b is entry k·n + b of every array, so one pointer per array
//! and a constant displacement per activation reach all n of them. With one `Q8Activation`
//! per activation, a pass of 8 needed 24 pointers live across the block loop — more than
//! x86-64's general registers — and the spilled reloads competed with the activation
//! broadcasts for the load ports.

use crate::act_q8::Q8Activation;

/// `n` activations of `blocks` 32-value blocks each, interleaved by block.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ActGroup {
    /// Activations in the group.
    pub n: usize,
    /// Blocks per activation.
    pub blocks: usize,
    /// Codes: block k of activation b at `(k·n + b)·32`, in the activation's code order.
    pub q: Vec<i8>,
    /// Scales d at `k·n + b`.
    pub d: Vec<f32>,
    /// d·Σq at `k·n + b`.
    pub sum: Vec<f32>,
    /// −offset·Σq at `k·n + b`, the weights' code offset taken off the integer sum in one
    /// addition (`offset`: 8 for Q4_0, 16 for Q5_0, 128 for Q8_0's flipped sign, 0 for Q4_1).
    pub bias: Vec<i32>,
}

impl ActGroup {
    /// The group of `acts` (each of at least `blocks` blocks) for weights whose codes carry
    /// `offset`, in this group's buffers.
    pub fn fill(&mut self, acts: &[Q8Activation], blocks: usize, offset: i32) {
        let n = acts.len();
        assert!(acts
            .iter()
            .all(|a| a.q.len() >= 32 * blocks && a.d.len() >= blocks && a.sum.len() >= blocks));
        self.n = n;
        self.blocks = blocks;
        // The buffers only grow: every entry the kernels read (`covers`) is written below, and
        // shrinking then growing again (a layer's products alternate 576 and 1536 columns)
        // zeroed the regrown part on every call.
        if self.q.len() < 32 * n * blocks {
            self.q.resize(32 * n * blocks, 0);
            self.d.resize(n * blocks, 0.0);
            self.sum.resize(n * blocks, 0.0);
            self.bias.resize(n * blocks, 0);
        }
        for (b, a) in acts.iter().enumerate() {
            for k in 0..blocks {
                let i = k * n + b;
                self.q[32 * i..32 * (i + 1)].copy_from_slice(&a.q[32 * k..32 * (k + 1)]);
                self.d[i] = a.d[k];
                self.sum[i] = a.sum[k];
                // |Σq| ≤ 32 · 127, so −128·Σq fits an i32 with room.
                self.bias[i] = -offset * a.qsum[k];
            }
        }
    }

    /// Whether the group holds `n` activations of at least `blocks` blocks (what a kernel
    /// asserts before it reads through raw pointers).
    pub fn covers(&self, n: usize, blocks: usize) -> bool {
        self.n == n
            && self.blocks >= blocks
            && self.q.len() >= 32 * n * self.blocks
            && self.d.len() >= n * self.blocks
            && self.sum.len() >= n * self.blocks
            && self.bias.len() >= n * self.blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_k_of_activation_b_is_entry_k_n_plus_b() {
        let acts: Vec<Q8Activation> = (0..3)
            .map(|b| Q8Activation {
                q: (0..64).map(|i| (i + 10 * b) as i8).collect(),
                d: vec![b as f32, 10.0 + b as f32],
                sum: vec![-(b as f32), -10.0 - b as f32],
                qsum: vec![b, 100 + b],
            })
            .collect();
        let mut g = ActGroup::default();
        g.fill(&acts, 2, 8);
        assert!(g.covers(3, 2) && !g.covers(2, 2) && !g.covers(3, 3));
        for (b, a) in acts.iter().enumerate() {
            for k in 0..2 {
                let i = k * 3 + b;
                assert_eq!(&g.q[32 * i..32 * (i + 1)], &a.q[32 * k..32 * (k + 1)]);
                assert_eq!(
                    (g.d[i], g.sum[i], g.bias[i]),
                    (a.d[k], a.sum[k], -8 * a.qsum[k])
                );
            }
        }
    }
}
