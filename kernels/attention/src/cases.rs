//! The attention family's one case list, shared by `harness check`, the conformance suite,
//! the property tests and the emulated CUDA tests (llama.cpp's `test-backend-ops` keeps one
//! list of cases that every backend runs): random shapes — decode, append and prefill;
//! MHA/GQA/MQA; odd head dims; a third of the causal ones with a sliding window (1, 2, any
//! length, the context), a quarter of all soft-capped — then the DESIGN.md edge cases
//! (kv_len 1, lengths 54/97/577, kv_heads 1 and = q_heads, non-causal with q_len > kv_len)
//! and windowed / soft-capped ones (Mistral- and Gemma-like); and the small shapes the
//! emulator (and a GPU) runs, at the head dims the CUDA kernels take.

use crate::AttentionShape;
use kernel_common::inputs::rng;
use rand::Rng;

/// `n` random shapes drawn from `seed`.
pub fn random(n: usize, seed: u64) -> Vec<AttentionShape> {
    let mut r = rng(seed);
    let mut out = vec![];
    for _ in 0..n {
        let kv_heads = [1, 2, 4][r.gen_range(0..3)];
        let group = r.gen_range(1..=4);
        let head_dim = [64, 128, r.gen_range(1..=160)][r.gen_range(0..3)];
        let kv_len = r.gen_range(1..=600);
        let (q_len, causal) = match r.gen_range(0..3) {
            0 => (1, true),
            1 => (r.gen_range(1..=kv_len.min(16)), true),
            _ => (kv_len, r.gen_bool(0.5)),
        };
        let window = (causal && r.gen_bool(1.0 / 3.0))
            .then(|| [1, 2, r.gen_range(1..=kv_len + 5), kv_len][r.gen_range(0..4)]);
        let softcap = r
            .gen_bool(0.25)
            .then(|| [50.0, r.gen_range(0.5f32..10.0)][r.gen_range(0..2)]);
        out.push(
            AttentionShape::new(
                r.gen_range(1..=3),
                kv_heads * group,
                kv_heads,
                q_len,
                kv_len,
                head_dim,
                causal,
            )
            .with_window(window)
            .with_softcap(softcap),
        );
    }
    out
}

/// The edge cases: decode, append and prefill at the DESIGN.md lengths, then sliding windows
/// (decode past a block, prefill across tiles, a window of 1, one past the context) and
/// soft-caps (Gemma-2's 50, a tight one, without a window).
pub fn edge() -> Vec<AttentionShape> {
    vec![
        AttentionShape::new(1, 4, 4, 1, 1, 64, true),
        AttentionShape::new(2, 8, 1, 1, 577, 128, true),
        AttentionShape::new(3, 8, 8, 1, 97, 64, true),
        AttentionShape::new(1, 8, 2, 54, 97, 128, true),
        AttentionShape::new(1, 4, 1, 577, 577, 64, true),
        AttentionShape::new(1, 2, 2, 97, 54, 128, false),
        AttentionShape::new(2, 8, 2, 1, 577, 128, true).with_window(Some(64)),
        AttentionShape::new(1, 8, 2, 97, 97, 64, true)
            .with_window(Some(16))
            .with_softcap(Some(50.0)),
        AttentionShape::new(1, 4, 1, 16, 577, 128, true)
            .with_window(Some(582))
            .with_softcap(Some(2.0)),
        AttentionShape::new(1, 4, 4, 1, 97, 64, true).with_window(Some(1)),
        AttentionShape::new(1, 4, 2, 54, 97, 64, false).with_softcap(Some(1.0)),
    ]
}

/// What `harness check` runs: `n` random shapes from `seed`, then the edge cases.
pub fn check_cases(n: usize, seed: u64) -> Vec<AttentionShape> {
    let mut out = random(n, seed);
    out.extend(edge());
    out
}

/// Small shapes at head dims 64 and 128 (what `cuda_flash2` takes), cheap enough for the
/// emulator: prefill across query blocks, decode, non-causal, windows shorter than a tile,
/// across tiles, past the context and of 1; caps tight and Gemma-2's, with and without a
/// window.
pub fn device() -> Vec<AttentionShape> {
    vec![
        AttentionShape::new(2, 4, 2, 70, 70, 64, true),
        AttentionShape::new(1, 2, 2, 1, 130, 128, true),
        AttentionShape::new(1, 4, 1, 33, 97, 64, false),
        AttentionShape::new(1, 2, 1, 5, 200, 128, true),
        AttentionShape::new(1, 2, 2, 129, 129, 128, true),
        AttentionShape::new(1, 2, 1, 130, 130, 64, true).with_window(Some(5)),
        AttentionShape::new(1, 2, 2, 1, 200, 128, true).with_window(Some(63)),
        AttentionShape::new(1, 2, 1, 70, 150, 64, true)
            .with_window(Some(100))
            .with_softcap(Some(1.5)),
        AttentionShape::new(1, 1, 1, 33, 40, 128, true)
            .with_window(Some(45))
            .with_softcap(Some(50.0)),
        AttentionShape::new(1, 1, 1, 20, 97, 64, false).with_softcap(Some(0.7)),
        AttentionShape::new(1, 1, 1, 65, 65, 128, true).with_window(Some(1)),
    ]
}
