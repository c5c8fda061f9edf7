//! `AttentionShape`: batch, query/KV heads (MHA when equal, GQA when kv_heads divides
//! q_heads, MQA when 1), query and key lengths, head_dim, causal flag, softmax scale, sliding
//! window (Mistral, Gemma-3's local layers) and logit soft-cap (Gemma-2); validated once, plus
//! the FLOP and byte counts the roofline uses.

use kernel_common::error::Result;
use kernel_common::{Cost, DType, KernelError};
use std::ops::Range;

/// One attention problem. Causal attention with `q_len < kv_len` is the append/decode case:
/// query `i` sits at absolute position `kv_len - q_len + i` and sees keys `0..=` that position.
///
/// Sliding window (`window = Some(w)`, causal only): a query at absolute position p sees key
/// position j iff j ≤ p and p − j < w — the last w positions, itself included. This is
/// Hugging Face transformers' `sliding_window_overlay` (`kv_idx > q_idx - sliding_window`,
/// and-ed with the causal mask; Mistral, Gemma-3) and llama.cpp's `LLAMA_SWA_TYPE_STANDARD`
/// (`is_masked_swa`: masked iff p − j ≥ n_swa). A window ≥ p + 1 is plain causal attention.
///
/// Soft-capping (`softcap = Some(cap)`, Gemma-2's `attn_logit_softcapping`): each score
/// becomes s' = cap · tanh(s · scale / cap) — scale first, then the cap, then the mask and
/// the softmax.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// Softmax scale applied to q·k (usually 1/√head_dim).
    pub scale: f32,
    /// Sliding window in positions (causal only): key j is seen from position p iff p − j < w.
    pub window: Option<usize>,
    /// Logit soft-cap: scores become cap · tanh(scale · q·k / cap) before mask and softmax.
    pub softcap: Option<f32>,
}

impl AttentionShape {
    /// A shape with the conventional scale 1/√head_dim.
    pub fn new(
        batch: usize,
        q_heads: usize,
        kv_heads: usize,
        q_len: usize,
        kv_len: usize,
        head_dim: usize,
        causal: bool,
    ) -> AttentionShape {
        AttentionShape {
            batch,
            q_heads,
            kv_heads,
            q_len,
            kv_len,
            head_dim,
            causal,
            scale: 1.0 / (head_dim.max(1) as f32).sqrt(),
            window: None,
            softcap: None,
        }
    }

    /// The same shape with a sliding window (`None`: every causal key).
    pub fn with_window(self, window: Option<usize>) -> AttentionShape {
        AttentionShape { window, ..self }
    }

    /// The same shape with a logit soft-cap (`None`: plain scores).
    pub fn with_softcap(self, softcap: Option<f32>) -> AttentionShape {
        AttentionShape { softcap, ..self }
    }

    /// Checks every field once so variants never have to.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(KernelError::InvalidShape(m));
        for (name, v) in [
            ("batch", self.batch),
            ("q_heads", self.q_heads),
            ("kv_heads", self.kv_heads),
            ("q_len", self.q_len),
            ("kv_len", self.kv_len),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return bad(format!("{name} must be > 0"));
            }
        }
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "kv_heads ({}) must divide q_heads ({})",
                self.kv_heads, self.q_heads
            ));
        }
        if self.causal && self.q_len > self.kv_len {
            return bad(format!(
                "causal attention needs q_len ({}) <= kv_len ({}): queries are the last q_len positions",
                self.q_len, self.kv_len
            ));
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return bad(format!(
                "softmax scale must be finite and > 0, got {}",
                self.scale
            ));
        }
        validate_window_softcap(self.window, self.softcap)?;
        if self.window.is_some() && !self.causal {
            return bad("a sliding window needs causal attention".into());
        }
        let q = [self.batch, self.q_heads, self.q_len, self.head_dim];
        let kv = [self.batch, self.kv_heads, self.kv_len, self.head_dim];
        for dims in [q, kv] {
            if dims
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .is_none_or(|n| n > isize::MAX as usize / 8)
            {
                return bad(format!("tensor of dims {dims:?} is too large to address"));
            }
        }
        Ok(())
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }

    /// Elements of q and of the output.
    pub fn q_elems(&self) -> usize {
        self.batch * self.q_heads * self.q_len * self.head_dim
    }

    /// Elements of k (and of v).
    pub fn kv_elems(&self) -> usize {
        self.batch * self.kv_heads * self.kv_len * self.head_dim
    }

    /// Absolute position of query row `i` (its causal horizon is keys `0..=pos`).
    pub fn q_pos(&self, i: usize) -> usize {
        self.kv_len - self.q_len + i
    }

    /// The keys query row `i` attends to: `first..=pos` under causal (first = pos + 1 − w
    /// with a window, else 0), every key otherwise.
    pub fn visible_keys(&self, i: usize) -> Range<usize> {
        if self.causal {
            let end = self.q_pos(i) + 1;
            window_start(end, self.window)..end
        } else {
            0..self.kv_len
        }
    }

    /// Unmasked (query, key) pairs per head.
    pub fn pairs_per_head(&self) -> u64 {
        let (lq, lk) = (self.q_len as u64, self.kv_len as u64);
        if !self.causal {
            return lq * lk;
        }
        // Row i sees min(pos + 1, w) keys; pos + 1 runs over lk − lq + 1 ..= lk.
        let w = self.window.map_or(lk, |w| (w as u64).min(lk));
        let (lo, hi) = (lk - lq + 1, lk);
        let tri_end = hi.min(w);
        let tri = if tri_end >= lo {
            (lo + tri_end) * (tri_end - lo + 1) / 2
        } else {
            0
        };
        tri + (hi - tri_end.max(lo - 1)) * w
    }

    /// Keys some query row sees (per KV head): the last `kv_len − first` of them, `first`
    /// being the first row's window start; every key when not causal or without a window.
    pub fn kv_needed(&self) -> usize {
        self.kv_len - self.visible_keys(0).start
    }

    /// Useful FLOPs: 2·d for q·k and 2·d for p·v per unmasked pair, every head.
    pub fn flops(&self) -> u64 {
        4 * (self.batch * self.q_heads * self.head_dim) as u64 * self.pairs_per_head()
    }

    /// Compulsory traffic: read q once, the K and V rows some query sees once (all of them
    /// without a window), and write the output once.
    pub fn io_cost(&self, dtype: DType) -> Cost {
        let kv_read = self.batch * self.kv_heads * self.kv_needed() * self.head_dim;
        let elems = 2 * self.q_elems() + 2 * kv_read;
        Cost {
            bytes: (elems * dtype.size()) as u64,
            flops: self.flops(),
        }
    }

    /// Short label for tables (`b8 h32/8 q1 kv4096 d128 causal`, then ` win512`, ` cap50`
    /// when set).
    pub fn label(&self) -> String {
        format!(
            "b{} h{}/{} q{} kv{} d{}{}{}",
            self.batch,
            self.q_heads,
            self.kv_heads,
            self.q_len,
            self.kv_len,
            self.head_dim,
            if self.causal { " causal" } else { "" },
            options_label(self.window, self.softcap)
        )
    }
}

/// First key position a query whose causal horizon ends at `end` (exclusive) sees under
/// `window`: `end − w`, or 0 without a window or when the window reaches back past key 0.
#[inline]
pub fn window_start(end: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| end.saturating_sub(w))
}

/// The checks every descriptor with these two options shares: a window is ≥ 1 and a cap
/// finite and > 0.
pub fn validate_window_softcap(window: Option<usize>, softcap: Option<f32>) -> Result<()> {
    if window == Some(0) {
        return Err(KernelError::InvalidShape(
            "sliding window must be >= 1 position (None for no window)".into(),
        ));
    }
    if let Some(cap) = softcap {
        if !(cap.is_finite() && cap > 0.0) {
            return Err(KernelError::InvalidShape(format!(
                "logit soft-cap must be finite and > 0, got {cap}"
            )));
        }
    }
    Ok(())
}

/// ` win{w}` and ` cap{c}` for the options that are set (empty when neither is).
pub fn options_label(window: Option<usize>, softcap: Option<f32>) -> String {
    let mut s = String::new();
    if let Some(w) = window {
        s.push_str(&format!(" win{w}"));
    }
    if let Some(c) = softcap {
        s.push_str(&format!(" cap{c}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_problem() {
        let ok = AttentionShape::new(1, 32, 8, 4, 16, 128, true);
        assert!(ok.validate().is_ok());
        let err = |s: AttentionShape| s.validate().unwrap_err().to_string();
        assert!(err(AttentionShape::new(1, 32, 3, 4, 16, 128, true))
            .contains("kv_heads (3) must divide q_heads (32)"));
        assert!(err(AttentionShape::new(1, 32, 8, 4, 16, 0, true)).contains("head_dim must be > 0"));
        assert!(err(AttentionShape::new(1, 32, 8, 17, 16, 64, true)).contains("q_len"));
        let mut s = ok;
        s.scale = f32::NAN;
        assert!(err(s).contains("scale"));
        assert!(
            err(AttentionShape::new(usize::MAX / 2, 32, 8, 4, 16, 128, true)).contains("too large")
        );
        // Non-causal cross attention may have q_len > kv_len.
        assert!(AttentionShape::new(1, 4, 4, 17, 16, 64, false)
            .validate()
            .is_ok());
    }

    #[test]
    fn window_and_softcap_validation() {
        let causal = AttentionShape::new(1, 4, 2, 3, 10, 16, true);
        assert!(causal.with_window(Some(1)).validate().is_ok());
        assert!(causal.with_window(Some(10_000)).validate().is_ok());
        assert!(causal.with_softcap(Some(50.0)).validate().is_ok());
        let err = |s: AttentionShape| s.validate().unwrap_err().to_string();
        assert!(err(causal.with_window(Some(0))).contains("sliding window must be >= 1"));
        let cross = AttentionShape::new(1, 4, 2, 3, 10, 16, false);
        assert!(err(cross.with_window(Some(4))).contains("needs causal"));
        for cap in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(
                err(causal.with_softcap(Some(cap))).contains("soft-cap"),
                "{cap}"
            );
        }
        assert_eq!(
            causal.with_window(Some(4)).with_softcap(Some(50.0)).label(),
            "b1 h4/2 q3 kv10 d16 causal win4 cap50"
        );
    }

    #[test]
    fn windowed_rows_see_the_last_w_positions() {
        // Rows at positions 7, 8, 9 with a window of 3: keys 5..=7, 6..=8, 7..=9.
        let s = AttentionShape::new(1, 1, 1, 3, 10, 8, true).with_window(Some(3));
        assert_eq!(s.visible_keys(0), 5..8);
        assert_eq!(s.visible_keys(2), 7..10);
        assert_eq!(s.kv_needed(), 5);
        assert_eq!(s.pairs_per_head(), 9);
        // A window longer than the context is plain causal attention.
        let wide = AttentionShape::new(1, 1, 1, 4, 4, 8, true);
        assert_eq!(
            wide.with_window(Some(9)).pairs_per_head(),
            wide.pairs_per_head()
        );
        // Prefill of 6 with window 2: row 0 sees 1 key, every other row 2.
        let pre = AttentionShape::new(1, 1, 1, 6, 6, 8, true).with_window(Some(2));
        assert_eq!(pre.pairs_per_head(), 11);
        for q_len in 1..9 {
            for extra in 0..5 {
                for w in 1..15 {
                    let s = AttentionShape::new(1, 1, 1, q_len, q_len + extra, 8, true)
                        .with_window(Some(w));
                    let brute: usize = (0..q_len).map(|i| s.visible_keys(i).len()).sum();
                    assert_eq!(s.pairs_per_head(), brute as u64, "{}", s.label());
                }
            }
        }
        // Traffic counts only the K/V rows some query sees.
        let dec = AttentionShape::new(2, 8, 2, 1, 4096, 128, true);
        let kv = |s: AttentionShape| s.io_cost(DType::F32).bytes - 2 * 4 * s.q_elems() as u64;
        assert_eq!(kv(dec.with_window(Some(512))) * 8, kv(dec));
    }

    #[test]
    fn pair_counts() {
        let s = AttentionShape::new(1, 1, 1, 4, 4, 8, true);
        assert_eq!(s.pairs_per_head(), 10);
        let s = AttentionShape::new(1, 1, 1, 2, 5, 8, true);
        // positions 3 and 4 see 4 and 5 keys.
        assert_eq!(s.pairs_per_head(), 9);
        assert_eq!(s.visible_keys(0), 0..4);
        let s = AttentionShape::new(2, 4, 2, 3, 5, 8, false);
        assert_eq!(s.pairs_per_head(), 15);
        assert_eq!(s.flops(), 4 * 2 * 4 * 8 * 15);
        assert_eq!(
            s.io_cost(DType::F16).bytes,
            ((2 * 2 * 4 * 3 * 8 + 2 * 2 * 2 * 5 * 8) * 2) as u64
        );
    }
}
